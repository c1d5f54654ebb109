"""`pdorch status`: the router's workers, their load, prompt-cache hit rates per tier, the store, the planner.

Reads the router's admin `/workers` (JSON) and `/metrics` (Prometheus text), with the store on
the mooncake_master's `/metrics` (fill level and its own eviction counters), and the planner's `/status` when one
answers (planner.status_url, else planner.metrics_port on this host); torch-free.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from pdorch.worker.prefill_rpc import CACHE_TIERS

# The master's SSD tier gauges (docs/workers.md, "The SSD tier"): objects and bytes on disk, capacity.
SSD_GAUGES = {"file_cache_nums_": "objects", "master_allocated_file_size_bytes": "bytes",
              "master_total_file_capacity_bytes": "capacity_bytes"}


def planner_url(planner_cfg) -> str | None:
    """The planner's base URL: planner.status_url, else this host's planner.metrics_port; None: no planner."""
    if planner_cfg.status_url:
        return planner_cfg.status_url.rstrip("/")
    return f"http://127.0.0.1:{planner_cfg.metrics_port}" if planner_cfg.metrics_port else None


def fetch_planner(url: str | None, timeout_s: float = 2.0) -> dict[str, Any] | None:
    """The planner's /status (pdorch/planner/runner.py), or None when there is none to ask or it does not answer:
    a fleet without a planner shows nothing about one."""
    if url is None:
        return None
    try:
        with urllib.request.urlopen(f"{url}/status", timeout=timeout_s) as r:
            body = json.loads(r.read())
    except (urllib.error.URLError, OSError, ValueError):
        return None
    return {"url": url, **body} if isinstance(body, dict) else None


def render_planner(planner: dict[str, Any]) -> list[str]:
    """The "planner" block: mode, per role current -> desired and the last decision's reason, SLO attainment."""
    at = planner.get("last_decision_at")
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at)) if at else "no decision yet"
    head = (f"planner ({planner['url']}): {planner.get('mode', '?')}, actuator {planner.get('actuator', '?')}, "
            f"last decision {when}")
    lines = [head]
    for role, d in planner.get("roles", {}).items():
        lines.append(f"  {role}: {d['current']} -> {d['desired']} ({d['action']}; min {d['min']}, max {d['max']})"
                     f"{' SHORT AT MAX' if d.get('short_at_max') else ''}: {d['reason']}")
    slo, met = planner.get("slo_p90_s", {}), planner.get("slo_attainment", {})
    parts = [f"{k} p90 <= {slo[k]:g}s met in {'-' if met.get(k) is None else f'{met[k]:.0%}'}" for k in slo]
    if parts:
        lines.append(f"  SLO attainment (recent intervals): {', '.join(parts)}")
    return lines


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
    chat = body.get("chat_template") if isinstance(body, dict) else None
    tokens = token_counters(_get(f"{url}/metrics", admin_key, timeout_s).decode())
    return {"url": url, "workers": workers, "tokens": tokens, **({"chat_template": chat} if chat else {})}


def fetch_store(store_cfg, timeout_s: float = 5.0) -> dict[str, Any] | None:
    """The store as the master reports it: fill, keys, and the master's own eviction counters
    (pdorch's chain eviction should keep these near 0). None when the store is off."""
    if not store_cfg.enabled:
        return None
    from store_client.evictor import fetch_text, master_eviction_counters, master_fill, master_metrics_url

    masters = store_masters(store_cfg)
    url = master_metrics_url(store_cfg)
    text = fetch_text(url, timeout_s)
    if text is None:
        error = "no mooncake_master leads (HA masters)" if url is None else "mooncake_master metrics unreachable"
        return {"url": url, "eviction": store_cfg.eviction_in_effect, "error": error, "masters": masters}
    fill = master_fill(text)
    return {"url": url, "eviction": store_cfg.eviction_in_effect, "masters": masters,
            "master_eviction": master_eviction_counters(text),
            **({"fill_ratio": fill.ratio, "keys": fill.key_count, "capacity_bytes": fill.capacity_bytes}
               if fill is not None else {}),
            **({"ssd": ssd_usage(text)} if store_cfg.ssd_path else {})}


def ssd_usage(master_text: str) -> dict[str, float]:
    """The master's SSD tier gauges by our names (missing ones left out)."""
    out = {}
    for family in text_string_to_metric_families(master_text):
        for sample in family.samples:
            if sample.name in SSD_GAUGES:
                out[SSD_GAUGES[sample.name]] = sample.value
    return out


def store_masters(store_cfg) -> list[dict[str, Any]]:
    """[{address, leader, pid}]: the masters of this store, `pid` where they run on this host.
    One master: its address. HA mode: the leader etcd names, and every local master of the same etcd
    and cluster id, standbys included (they are not in etcd); none leading and none local: []."""
    from store_client.addresses import parse_master_address
    from store_client.master import local_masters
    from store_client.master_view import master_view

    master = parse_master_address(store_cfg.master_address)
    if not master.ha:
        port = str(master.endpoints[0][1])
        pids = [pid for pid, f in local_masters() if f.get("rpc_port") == port and f.get("enable_ha") != "true"]
        return [{"address": store_cfg.master_address, "leader": True, **({"pid": pids[0]} if pids else {})}]
    leader = master_view(master.etcd_endpoints, store_cfg.master_cluster_id).leader()
    etcd = set(master.etcd_endpoints)
    local = {f"{f.get('rpc_address')}:{f.get('rpc_port')}": pid for pid, f in local_masters()
             if f.get("enable_ha") == "true" and set(f.get("etcd_endpoints", "").split(";")) == etcd
             and f.get("cluster_id") == store_cfg.master_cluster_id}
    addresses = sorted(set(local) | ({leader} if leader else set()))
    return [{"address": a, "leader": a == leader, **({"pid": local[a]} if a in local else {})} for a in addresses]


def render_store(store: dict[str, Any] | None) -> list[str]:
    if store is None:
        return ["store: off"]
    if "error" in store:
        return [f"store ({store['url']}): {store['error']}"]
    head = f"store: eviction {store['eviction']}"
    masters = store.get("masters", [])
    leaders = [m["address"] for m in masters if m["leader"]]
    if leaders:
        head += f", master {leaders[0]} leads"
    standbys = [m["address"] for m in masters if not m["leader"]]
    if standbys:
        head += f" ({len(standbys)} standby: {', '.join(standbys)})"
    if "fill_ratio" in store:
        head += (f", {store['fill_ratio']:.1%} of {store['capacity_bytes'] / 2**20:.0f} MiB used, "
                 f"{store['keys']:.0f} keys")
    counters = ", ".join(f"{k} {v:.0f}" for k, v in store["master_eviction"].items()) or "not exported"
    lines = [head, f"mooncake_master's own eviction: {counters}"]
    if "ssd" in store:
        ssd = store["ssd"]
        lines.append(f"ssd tier: {ssd.get('objects', 0):.0f} objects, {ssd.get('bytes', 0) / 2**20:.0f} MiB on disk"
                     + (f" (capacity {ssd['capacity_bytes'] / 2**30:.0f} GiB, not enforced by Mooncake)"
                        if ssd.get("capacity_bytes") else ""))
    if "pdorch_evicted_pages" in store:
        lines.append(f"pdorch's chain eviction: {store['pdorch_evicted_pages']:.0f} pages removed "
                     f"({', '.join(f'{r} {n:.0f}' for r, n in sorted(store['pdorch_evicted_by_role'].items()))})")
    return lines


def add_pdorch_evictions(status: dict[str, Any]) -> None:
    """Put the workers' chain evictions (from the router's /workers) beside the master's own."""
    store, by_role = status.get("store"), {}
    if not store or "error" in store:
        return
    for w in status["workers"]:
        n = (w.get("info") or {}).get("store_evicted_pages")
        if n is not None:
            by_role[w.get("role", "?")] = by_role.get(w.get("role", "?"), 0) + n
    if by_role:
        store["pdorch_evicted_pages"] = sum(by_role.values())
        store["pdorch_evicted_by_role"] = by_role


def _kv_events(stream: dict | None) -> str:
    """A worker's KV event stream as the router sees it: state, batches applied, resyncs."""
    if not stream:
        return "-"
    return f"{stream['state']} ({stream['applied']} applied, {stream['resyncs']} resyncs)"


def _preempted(role: str, info: dict) -> str:
    """A decode worker's preemptions since it started, and how many requests wait to resume now."""
    if role != "decode" or "preemptions" not in info:
        return "-"
    now = info.get("preempted_requests", 0)
    return f"{info['preemptions']}" + (f" ({now} paused)" if now else "")


def render_status(status: dict[str, Any]) -> str:
    rows = [("role", "address", "tp", "health", "circuit", "in flight", "routed", "errors", "queued", "running",
             "free pages", "preempted", "kv events")]
    for w in sorted(status["workers"], key=lambda w: (w.get("role", ""), w.get("address", ""))):
        info = w.get("info") or {}
        pages = f"{info['free_pages']}/{info['total_pages']}" if "total_pages" in info else "-"
        rows.append((w.get("role", "?"), w.get("address", "?"), str(info.get("tp_size", "-")),
                     "ok" if w.get("healthy") else "DOWN",
                     str(w.get("circuit", "-")), str(w.get("in_flight", "-")), str(w.get("routed", "-")),
                     str(w.get("errors", "-")), str(info.get("queued_requests", "-")),
                     str(info.get("running_requests", "-")), pages, _preempted(w.get("role", ""), info),
                     _kv_events(w.get("kv_events"))))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [f"router {status['url']}: {len(status['workers'])} workers", ""]
    lines += ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    tokens = status["tokens"]
    prompt = tokens.get("prompt", 0.0)
    cached = {t: tokens.get(f"cached_{t}", 0.0) for t in CACHE_TIERS}
    lines.append("")
    lines.append(f"prompt tokens {prompt:.0f}, completion tokens {tokens.get('completion', 0.0):.0f}")
    if prompt:
        split = ", ".join(f"{t} {cached[t] / prompt:.1%}" for t in CACHE_TIERS)
        lines.append(f"cache hit rate {sum(cached.values()) / prompt:.1%} ({split})")
    else:
        lines.append("cache hit rate: no requests yet")
    if "chat_template" in status:
        lines += render_chat_template(status["chat_template"])
    if "store" in status:
        lines += render_store(status["store"])
    if status.get("planner"):
        lines += render_planner(status["planner"])
    return "\n".join(lines)


def render_chat_template(chat: dict[str, Any]) -> list[str]:
    """The router's chat template: whose, what it ignores, the built-in tool template standing in."""
    lines = [f"{chat['summary']}; tool calls read by {chat.get('tool_call_parser', '?')}"]
    if chat.get("warning"):
        lines.append(f"WARNING: {chat['warning']}")
    return lines
