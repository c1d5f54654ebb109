"""`pdorch status`: the router's workers, their load, and prompt-cache hit rates per tier.

Reads the router's admin `/workers` (JSON) and `/metrics` (Prometheus text); torch-free.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

TIERS = ("device", "host", "store")


class StatusError(RuntimeError):
    """The router could not be asked (down, wrong URL, missing admin key)."""


def _get(url: str, admin_key: str, timeout_s: float) -> bytes:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {admin_key}"} if admin_key else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            return r.read()
    except urllib.error.HTTPError as e:
        if e.code in (401, 403):
            raise StatusError(f"{url}: HTTP {e.code}; pass --admin-key or set "
                              "PDORCH_ROUTER_ADMIN_KEY") from None
        raise StatusError(f"{url}: HTTP {e.code}: {e.read()[:200].decode(errors='replace')}") from None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise StatusError(f"cannot reach the router at {url}: {reason}; is `pdorch serve` running?") from None


def token_counters(metrics_text: str) -> dict[str, float]:
    """{"prompt": n, "completion": n, "cached_device": n, ...} from the router's counters."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if not sample.name.endswith("_total"):
                continue
            if sample.name == "pdorch_router_prompt_tokens_total":
                out["prompt"] = out.get("prompt", 0.0) + sample.value
            elif sample.name == "pdorch_router_completion_tokens_total":
                out["completion"] = out.get("completion", 0.0) + sample.value
            elif sample.name == "pdorch_router_cached_tokens_total":
                key = "cached_" + sample.labels.get("tier", "all")
                out[key] = out.get(key, 0.0) + sample.value
    return out


def fetch_status(url: str, admin_key: str = "", timeout_s: float = 5.0) -> dict[str, Any]:
    url = url.rstrip("/")
    body = json.loads(_get(f"{url}/workers", admin_key, timeout_s))
    workers = body.get("workers", []) if isinstance(body, dict) else body
    tokens = token_counters(_get(f"{url}/metrics", admin_key, timeout_s).decode())
    return {"url": url, "workers": workers, "tokens": tokens}


def render_status(status: dict[str, Any]) -> str:
    rows = [("role", "address", "health", "circuit", "in flight", "routed", "errors", "queued", "running",
             "free pages")]
    for w in sorted(status["workers"], key=lambda w: (w.get("role", ""), w.get("address", ""))):
        info = w.get("info") or {}
        pages = f"{info['free_pages']}/{info['total_pages']}" if "total_pages" in info else "-"
        rows.append((w.get("role", "?"), w.get("address", "?"), "ok" if w.get("healthy") else "DOWN",
                     str(w.get("circuit", "-")), str(w.get("in_flight", "-")), str(w.get("routed", "-")),
                     str(w.get("errors", "-")), str(info.get("queued_requests", "-")),
                     str(info.get("running_requests", "-")), pages))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [f"router {status['url']}: {len(status['workers'])} workers", ""]
    lines += ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    tokens = status["tokens"]
    prompt = tokens.get("prompt", 0.0)
    cached = {t: tokens.get(f"cached_{t}", 0.0) for t in TIERS}
    lines.append("")
    lines.append(f"prompt tokens {prompt:.0f}, completion tokens {tokens.get('completion', 0.0):.0f}")
    if prompt:
        split = ", ".join(f"{t} {cached[t] / prompt:.1%}" for t in TIERS)
        lines.append(f"cache hit rate {sum(cached.values()) / prompt:.1%} ({split})")
    else:
        lines.append("cache hit rate: no requests yet")
    return "\n".join(lines)
