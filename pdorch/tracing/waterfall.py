"""A trace as a waterfall: the text `pdorch trace` prints, and the PNG `--png` draws.

Input: one trace as /admin/traces returns it ({"trace_id", "spans": [SpanRecord as JSON], "unreachable"}).
Rows are the spans ordered by start; each is indented by its depth under its parent, with its process,
start offset from the trace's first span, duration, and its key attributes (names.KEY_ATTRIBUTES).
"""

from __future__ import annotations

from pdorch.tracing.names import KEY_ATTRIBUTES, KEY_PREFIXES, REQUEST_ID


def rows(trace: dict) -> list[dict]:
    """The spans ordered by start: {"depth", "process", "name", "start_ms", "duration_ms", "attributes", "error"}."""
    spans = sorted(trace["spans"], key=lambda s: (int(s["start_unix_ns"]), int(s["end_unix_ns"])))
    if not spans:
        return []
    t0 = int(spans[0]["start_unix_ns"])
    by_id = {s["span_id"]: s for s in spans}
    out = []
    for s in spans:
        depth, parent = 0, by_id.get(s["parent_span_id"])
        while parent is not None and depth < 32:
            depth, parent = depth + 1, by_id.get(parent["parent_span_id"])
        start, end = int(s["start_unix_ns"]), int(s["end_unix_ns"])
        out.append({"depth": depth, "process": _process(s), "name": s["name"], "start_ms": (start - t0) / 1e6,
                    "duration_ms": (end - start) / 1e6, "attributes": key_attributes(s.get("attributes", {})),
                    "error": s.get("status_message") or "ERROR" if int(s.get("status_code", 0)) == 2 else ""})
    return out


def key_attributes(attributes: dict) -> str:
    """`name=value` for the attributes worth a glance (zeros and empties left out), pdorch. left off,
    in KEY_ATTRIBUTES' order."""
    picked = []
    for key in KEY_ATTRIBUTES:
        prefix = key + "." if key in KEY_PREFIXES else None
        for name in sorted(a for a in attributes if a == key or prefix and a.startswith(prefix)):
            value = attributes[name]
            if value in ("", 0) and name != "http.response.status_code":
                continue
            shown = ",".join(map(str, value)) if isinstance(value, list) else value
            picked.append(f"{name.removeprefix('pdorch.')}={shown}")
    return " ".join(picked)


def render(trace: dict) -> str:
    table = rows(trace)
    root = next((s for s in trace["spans"] if s.get("attributes", {}).get(REQUEST_ID)), None)
    total = max((r["start_ms"] + r["duration_ms"] for r in table), default=0.0)
    head = f"trace {trace['trace_id']}"
    if root is not None:
        head += f"  request {root['attributes'][REQUEST_ID]}"
    process_w = max((len(r["process"]) for r in table), default=7)
    span_w = max((2 * r["depth"] + len(r["name"]) for r in table), default=4)
    lines = [f"{head}  {total:.3f} ms, {len(table)} spans",
             f"{'start ms':>10} {'dur ms':>10}  {'process':<{process_w}}  {'span':<{span_w}}  attributes"]
    for r in table:
        name = "  " * r["depth"] + r["name"]
        extra = r["attributes"] + (f"  ERROR: {r['error']}" if r["error"] else "")
        lines.append(f"{r['start_ms']:>10.3f} {r['duration_ms']:>10.3f}  {r['process']:<{process_w}}  "
                     f"{name:<{span_w}}  {extra}".rstrip())
    for address, error in (trace.get("unreachable") or {}).items():
        lines.append(f"  (worker {address} did not answer: {error}; its spans are missing)")
    return "\n".join(lines)


def draw_png(trace: dict, path: str) -> None:
    """The waterfall as a horizontal bar chart (matplotlib); ImportError when it is not installed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    table = rows(trace)
    processes = sorted({r["process"] for r in table})
    colors = {p: plt.cm.tab10(i % 10) for i, p in enumerate(processes)}
    fig, ax = plt.subplots(figsize=(12, 0.4 * len(table) + 1.5))
    for i, r in enumerate(table):
        ax.barh(i, max(r["duration_ms"], 0.01), left=r["start_ms"], color=colors[r["process"]],
                edgecolor="red" if r["error"] else "none")
        ax.text(r["start_ms"], i, f" {r['duration_ms']:.2f} ms", va="center", fontsize=7)
    ax.set_yticks(range(len(table)), ["  " * r["depth"] + r["name"] for r in table], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("ms since the trace's first span")
    ax.set_title(f"trace {trace['trace_id']}")
    ax.legend(handles=[plt.Rectangle((0, 0), 1, 1, color=colors[p]) for p in processes], labels=processes,
              fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _process(span: dict) -> str:
    service = span.get("service", "").removeprefix("pdorch-")
    instance = span.get("instance", "")
    return f"{service} {instance}".strip()
