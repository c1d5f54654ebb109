"""bench/router_overhead/ttft_path.py's tables (percentiles by load_client.py's `pct`): each step's
span is read between consecutive marks of one request, the percentiles are taken over requests, and
a handler step a request skipped counts 0."""

from __future__ import annotations

from bench.router_overhead.load_client import pct
from bench.router_overhead.ttft_path import handler_table, step_table
from bench.router_overhead.ttft_tracer import STEPS


def _record(offsets_us: list[float], **handler_us: float) -> dict:
    marks = dict(zip(STEPS, (1000.0 + o / 1e6 for o in offsets_us), strict=True))
    return {**marks, **{f"us:{k}": v for k, v in handler_us.items()}}


def test_the_tables_percentile_picks_the_rank_not_an_average():
    assert pct([5.0, 1.0, 3.0, 2.0], 0.5) == 3.0
    assert pct([5.0, 1.0, 3.0, 2.0], 0.9) == 5.0
    assert pct([7.0], 0.9) == 7.0


def test_step_table_spans_consecutive_marks():
    # conn head task call sent data resume write, cumulative µs
    fast = _record([0, 10, 20, 50, 60, 560, 570, 600])
    slow = _record([0, 30, 60, 160, 200, 1200, 1300, 1400])
    table = step_table([fast, slow, fast])
    assert set(table) == {"conn->head", "head->task", "task->call", "call->sent", "sent->data",
                          "data->resume", "resume->write", "head->write"}
    assert abs(table["task->call"]["p50"] - 30) < 0.01
    assert abs(table["task->call"]["p90"] - 100) < 0.01
    assert abs(table["sent->data"]["p50"] - 500) < 0.01
    assert abs(table["head->write"]["p50"] - 590) < 0.01
    assert abs(table["head->write"]["p90"] - 1370) < 0.01


def test_handler_table_counts_a_skipped_step_as_zero():
    records = [_record([0] * 8, parse=10.0, choose=4.0), _record([0] * 8, parse=30.0),
               _record([0] * 8, parse=20.0, choose=6.0)]
    table = handler_table(records)
    assert table == {"choose": 4.0, "parse": 20.0}
