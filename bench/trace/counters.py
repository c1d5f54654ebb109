"""What the workers count during a replay (their Prometheus counters, before and after):

    prefill_computed_tokens   pdorch_prefill_prompt_tokens_total{source="computed"}: prompt tokens the
                              prefill workers computed (a prefix computed once for several requests
                              shows here)
    inflight_waits            pdorch_prefill_inflight_waits_total by how the wait ended (shared,
                              owner_gone, not_cheaper, deadline)
    inflight_pages            pdorch_prefill_inflight_pages_total: pages reused from another request's
                              computation in flight
    decode_inflight_waits     pdorch_decode_inflight_waits_total by outcome (shared, owner_gone): requests
                              a decode worker had wait for the prompt pages another one was receiving
    decode_inflight_pages     pdorch_decode_inflight_pages_total: those pages, shared in its pool

None where no worker answered the scrape (a benchmark goes on without its counters).
"""

from __future__ import annotations

from bench.multiturn import metrics


def snapshot(urls: list[str]) -> dict | None:
    scraped = [metrics.scrape(u) for u in urls]
    samples = [s for one in scraped if one for s in one]
    if not any(scraped):
        return None
    return {"prefill_computed_tokens": metrics.total(samples, "pdorch_prefill_prompt_tokens_total", source="computed"),
            "inflight_waits": metrics.by_label(samples, "pdorch_prefill_inflight_waits_total", "outcome"),
            "inflight_pages": metrics.total(samples, "pdorch_prefill_inflight_pages_total"),
            "decode_inflight_waits": metrics.by_label(samples, "pdorch_decode_inflight_waits_total", "outcome"),
            "decode_inflight_pages": metrics.total(samples, "pdorch_decode_inflight_pages_total")}


def change(before: dict | None, after: dict | None) -> dict | None:
    d = metrics.delta(before, after)
    if d is None:
        return None
    return {"prefill_computed_tokens": int(d["prefill_computed_tokens"]),
            "inflight_waits": {k: int(v) for k, v in d["inflight_waits"].items()},
            "inflight_pages": int(d["inflight_pages"]),
            "decode_inflight_waits": {k: int(v) for k, v in d["decode_inflight_waits"].items()},
            "decode_inflight_pages": int(d["decode_inflight_pages"])}
