"""bench/router_overhead/profile.py's tables: per-request calls and times from a cProfile run, rows
named by their file inside the project (or the library) and function."""

from __future__ import annotations

import cProfile
import pstats

from bench.router_overhead.profile import _where, table


def _leaf() -> int:
    return sum(range(50))


def _request() -> None:
    for _ in range(3):
        _leaf()


def test_calls_and_times_are_per_request():
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(10):
        _request()
    prof.disable()
    stats = pstats.Stats(prof)
    rows = {row["function"].split("(")[-1]: row for row in table(stats, 10, 3, 50)}
    assert rows["_leaf)"]["calls"] == 3.0 and rows["_request)"]["calls"] == 1.0
    assert rows["_request)"]["cum_us"] >= rows["_leaf)"]["cum_us"] > 0
    own_first = table(stats, 10, 2, 1)[0]
    assert own_first["own_us"] >= max(row["own_us"] for row in rows.values())


def test_rows_name_the_file_from_its_package():
    assert _where(("/x/site-packages/uvicorn/protocols/http/httptools_impl.py", 170, "data_received")) == \
        "uvicorn/protocols/http/httptools_impl.py:170(data_received)"
    assert _where(("/repo/router/http/hot_path.py", 133, "run_asgi")) == "router/http/hot_path.py:133(run_asgi)"
    assert _where(("~", 0, "<built-in method builtins.len>")) == "<built-in method builtins.len>"
    assert _where(("/elsewhere/page_hash.py", 47, "page_hashes")) == "page_hash.py:47(page_hashes)"
