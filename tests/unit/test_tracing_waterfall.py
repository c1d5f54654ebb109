"""pdorch/tracing/waterfall.py: rows ordered by start, indented under their parents, key attributes."""

from __future__ import annotations

from pdorch.tracing.waterfall import key_attributes, render, rows

MS = 1_000_000


def _span(span_id, parent, name, service, start_ms, end_ms, attributes=None, status=0, message=""):
    return {"trace_id": "ab" * 16, "span_id": span_id, "parent_span_id": parent, "name": name,
            "service": f"pdorch-{service}", "instance": f"{service}-1", "start_unix_ns": 1000 * MS + start_ms * MS,
            "end_unix_ns": 1000 * MS + end_ms * MS, "attributes": attributes or {}, "status_code": status,
            "status_message": message, "links": []}


TRACE = {"trace_id": "ab" * 16, "unreachable": {"10.0.0.9:50171": "DEADLINE_EXCEEDED: Deadline Exceeded"}, "spans": [
    _span("p1", "d1", "prefill.prefill", "prefill", 3, 9, {"pdorch.pages.store": 4, "pdorch.pages.evicted": 2}),
    _span("r1", "", "router.request", "router", 0, 12, {"pdorch.request_id": "req-7", "pdorch.prefill": "P:1",
                                                         "pdorch.cached_tokens.store": 64, "pdorch.cached_tokens.ssd": 0,
                                                         "pdorch.policy.scores": "P:1 load=0"}),
    _span("d1", "a1", "decode.generate", "decode", 2, 11),
    _span("a1", "r1", "router.attempt", "router", 1, 11.5, status=2, message="UNAVAILABLE: gone")]}


def test_rows_are_ordered_by_start_and_indented_under_their_parents():
    table = rows(TRACE)
    assert [(r["name"], r["depth"], r["process"]) for r in table] == [
        ("router.request", 0, "router router-1"), ("router.attempt", 1, "router router-1"),
        ("decode.generate", 2, "decode decode-1"), ("prefill.prefill", 3, "prefill prefill-1")]
    assert [(r["start_ms"], r["duration_ms"]) for r in table] == [(0, 12), (1, 10.5), (2, 9), (3, 6)]
    assert table[1]["error"] == "UNAVAILABLE: gone" and table[0]["error"] == ""


def test_key_attributes_leave_out_zeros_and_the_rest():
    assert key_attributes(TRACE["spans"][1]["attributes"]) == "prefill=P:1 cached_tokens.store=64"
    assert key_attributes(TRACE["spans"][0]["attributes"]) == "pages.evicted=2 pages.store=4"


def test_render_names_the_request_and_the_workers_that_did_not_answer():
    out = render(TRACE).splitlines()
    assert out[0] == f"trace {'ab' * 16}  request req-7  12.000 ms, 4 spans"
    assert out[3].split()[:5] == ["1.000", "10.500", "router", "router-1", "router.attempt"]
    assert out[3].endswith("ERROR: UNAVAILABLE: gone")
    assert "worker 10.0.0.9:50171 did not answer: DEADLINE_EXCEEDED" in out[-1]


def test_png_draws_the_waterfall(tmp_path):
    from pdorch.tracing.waterfall import draw_png

    draw_png(TRACE, str(tmp_path / "t.png"))
    assert (tmp_path / "t.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_png_without_matplotlib_says_so(tmp_path, monkeypatch, capsys):
    import sys

    from pdorch.trace_cmd import _pngs

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # an import of it raises ImportError
    assert _pngs([TRACE], str(tmp_path / "t.png")) == 1
    assert "--png needs matplotlib" in capsys.readouterr().err and not (tmp_path / "t.png").exists()
