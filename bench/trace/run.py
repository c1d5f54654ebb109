"""One measured replay of a planned trace: against a running router (--url) or a cluster started
with `pdorch serve` for it (bench/multiturn/cluster.py: free ports, the benchmark's --set flags, then
the user's), stopped at the end. The prefill workers' counters are read before and after.

A started cluster lets a prefill call wait as long as a request may (`decode.prefill_timeout_s` =
--timeout, before the user's --set): a replay measures a slow burst instead of failing it.
"""

from __future__ import annotations

import asyncio
import sys
from dataclasses import dataclass

from bench.multiturn.client import HttpBackend
from bench.multiturn.cluster import ServeCluster, effective_config, metrics_urls, port_overrides
from bench.trace import counters
from bench.trace.plan import Planned
from bench.trace.replay import Replay
from bench.trace.summary import summarize


@dataclass(frozen=True)
class RunSpec:
    name: str
    sets: tuple[str, ...]       # the variant's --set flags (before the user's)


def replay_once(spec: RunSpec, args, planned: list[Planned], prompt_ids, turn_ids, model: str, page_size: int,
                say) -> dict:
    from tqdm import tqdm
    cluster = None
    sets = [f"decode.prefill_timeout_s={args.timeout}", *spec.sets, *args.config_overrides]
    try:
        if args.url:
            urls, cfg = [args.url.rstrip("/")], effective_config(args.config, args.config_overrides)
        else:
            log_dir = f"{args.log_dir}/{spec.name.replace(' ', '_')}" if args.log_dir else None
            cluster = ServeCluster(args.config, sets + port_overrides(args.prefill, args.decode), args.prefill,
                                   args.decode, log_dir).start()
            say(f"[{spec.name}] cluster ready at {cluster.url} (logs in {cluster.log_dir}): --set {' '.join(sets)}")
            urls, cfg = cluster.urls, cluster.cfg
        workers, _ = metrics_urls(cfg, args.prefill, args.decode)
        before = counters.snapshot(workers)

        async def go():
            # NOTE: one connection per request at most: an open-loop replay never queues in the client
            backend = HttpBackend(urls, "sglang", model, 1, args.timeout, len(planned), cfg.router.api_key)
            try:
                with tqdm(total=len(planned), file=sys.stderr, desc=f"[{spec.name}] requests", unit="req") as bar:
                    return await Replay(planned, prompt_ids, turn_ids, backend, args.timeout, bar).run()
            finally:
                await backend.close()

        sent = asyncio.run(go())
        after = counters.snapshot(workers)
    finally:
        if cluster is not None:
            cluster.stop()
    out = summarize(sent, page_size, args.slo_ttft, args.slo_itl, args.bin_s)
    out.update(name=spec.name, sets=sets if not args.url else list(args.config_overrides),
               counters=counters.change(before, after))
    return out
