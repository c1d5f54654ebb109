"""What `pdorch bench multiturn` reads from the cluster between rounds: Prometheus counters of the
workers and of `mooncake_master`, and the RSS of processes from /proc.

Counters are cumulative; a round's value is the difference of two snapshots (`delta`). A scrape
that fails gives None, never an exception: a benchmark keeps running when a metric is missing.

    store_pages_read / _written   pdorch_store_pages_{read,written}_total, summed over the workers
    store_pages_evicted           mooncake_master's master_evicted_key_count (one key = one page): its own
                                  (chain-blind) eviction
    store_pages_evicted_by_pdorch pdorch_store_evicted_pages_total of every worker (chain eviction)
    reads                         where reused prompt pages came from: prefill_l1 (P's own L1),
                                  prefill_from_decode (P read them from D's pool), prefill_store,
                                  decode_l1 (D's own prefix cache hits), decode_store (D's own reads)
    store_save_dropped_pages      pdorch_store_save_dropped_pages_total by reason (queue_full,
                                  cancelled, closed): write-backs that never ran -> holes
    store_save_failed_pages       pdorch_store_save_failed_pages_total by reason
    store_load_miss_pages         pdorch_store_miss_pages_total{op="load"} by reason (absent, ...)
    transfer_bytes                pdorch_prefill_transfer_bytes_total (P->D pushes)
    prompt_plans                  pdorch_decode_prompt_plans_total by where (prefill, local: no prefill call)
    tiers                         pdorch_decode_prompt_tokens_total by source (computed, device,
                                  host, store): the tier split when the API does not report it
    preemptions                   pdorch_decode_preemptions_total: running requests the decode
                                  workers preempted (their pool ran dry; target at the presets: 0)
"""

from __future__ import annotations

import re
import urllib.error
import urllib.request

_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_prometheus(text: str) -> list[tuple[str, dict, float]]:
    """(name, labels, value) of every sample in a text exposition."""
    out = []
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if not m or line.startswith("#"):
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        out.append((m.group(1), dict(_LABEL.findall(m.group(2) or "")), value))
    return out


def scrape(url: str, timeout_s: float = 5.0) -> list[tuple[str, dict, float]] | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as r:
            return parse_prometheus(r.read().decode(errors="replace"))
    except (urllib.error.URLError, OSError, ValueError):
        return None


def total(samples: list, name: str, **labels) -> float:
    return sum(v for n, lab, v in samples if n == name and all(lab.get(k) == x for k, x in labels.items()))


def by_label(samples: list, name: str, label: str, **labels) -> dict[str, float]:
    out: dict[str, float] = {}
    for n, lab, v in samples:
        if n == name and label in lab and all(lab.get(k) == x for k, x in labels.items()):
            out[lab[label]] = out.get(lab[label], 0.0) + v
    return out


def counters(worker_samples: list, master_samples: list | None) -> dict:
    """Cumulative counters of one snapshot. `worker_samples` = every reachable worker's samples
    concatenated (None entries skipped)."""
    w = [s for samples in worker_samples if samples for s in samples]
    return {
        "store_pages_read": total(w, "pdorch_store_pages_read_total"),
        "store_pages_written": total(w, "pdorch_store_pages_written_total"),
        "store_pages_evicted": total(master_samples, "master_evicted_key_count") if master_samples else None,
        "store_pages_evicted_by_pdorch": total(w, "pdorch_store_evicted_pages_total"),
        "reads": reads(w),
        "store_save_dropped_pages": by_label(w, "pdorch_store_save_dropped_pages_total", "reason"),
        "store_save_failed_pages": by_label(w, "pdorch_store_save_failed_pages_total", "reason"),
        "store_load_miss_pages": by_label(w, "pdorch_store_miss_pages_total", "reason", op="load"),
        # NOTE: the decode workers' counter: it sees every request, those served without a prefill
        # worker too (conditional disaggregation); a prefill worker's sees only those it prefilled.
        "tiers": by_label(w, "pdorch_decode_prompt_tokens_total", "source"),
        "transfer_bytes": total(w, "pdorch_prefill_transfer_bytes_total"),
        "prompt_plans": by_label(w, "pdorch_decode_prompt_plans_total", "where"),
        "preemptions": total(w, "pdorch_decode_preemptions_total"),
    }


def reads(w: list) -> dict:
    """Reused prompt pages by where they came from (cumulative; see the module docstring), except
    `prefill_device_tokens`: P's L1 and D's pool together, in tokens (pages_by_tier() splits them)."""
    return {"prefill_device_tokens": total(w, "pdorch_prefill_prompt_tokens_total", source="device"),
            "prefill_from_decode": total(w, "pdorch_prefill_decode_pool_pages_total", outcome="read"),
            "prefill_store": total(w, "pdorch_prefill_store_pages_loaded_total"),
            "decode_l1": total(w, "pdorch_decode_l1_hit_pages_total"),
            "decode_store": total(w, "pdorch_decode_prefix_store_pages_total", outcome="loaded")}


def pages_by_tier(d: dict, page_size: int) -> dict:
    """A round's delta of reads() as pages per tier. NOTE: P counts the pages it read from D's pool as
    `device` tokens (they came from a device pool); its own L1 gave the rest of them."""
    if not d:
        return {}
    out = {k: int(v) for k, v in d.items() if k != "prefill_device_tokens"}
    out["prefill_l1"] = int(d.get("prefill_device_tokens", 0) // page_size - d.get("prefill_from_decode", 0))
    return out


def delta(before, after):
    """after - before for numbers and (recursively) dicts of numbers; None if either is None."""
    if before is None or after is None:
        return None
    if isinstance(after, dict):
        return {k: delta(before.get(k, 0), v) for k, v in after.items()}
    return after - before


def store_capacity(master_samples: list | None) -> int | None:
    """Bytes of every mounted segment together (the store's total capacity)."""
    return int(total(master_samples, "master_total_capacity_bytes")) if master_samples else None


def store_file_capacity(master_samples: list | None) -> int:
    """Bytes the master's SSD tier may hold (0 without it)."""
    return int(total(master_samples, "master_total_file_capacity_bytes")) if master_samples else 0


def rss_mb(pid: int) -> float | None:
    """Resident set size of a live process in MiB (None once it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
    except (OSError, ValueError, IndexError):
        return None
    return None
