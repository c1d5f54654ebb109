"""Measure one prefill and one decode replica and write the planner's profile file.

    pdorch bench profile --out PROFILE.json [--prompt-tokens 128,512,2048] [--batches 1,4,16]
                         [--contexts 512,2048] [--runs 3] [--test-model llama3] [--set ...]
    python -m bench.profile ...                     (the same)

Starts `pdorch serve --prefill 1 --decode 1` on free ports with --config / --set (the defaults: the
embedded configs/local.yaml), measures (bench/profile/__init__.py says how), stops it, writes --out.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
import time

from bench.multiturn.cluster import ServeCluster, bench_config, port_overrides
from bench.multiturn.facts import commit, model_facts
from bench.profile.measure import ProfileError, Profiler, Settings
from bench.profile.profile_file import profile_dict
from bench.profile.stream import UniquePrompts
from bench.trace.tokens import ordinary_vocabulary
from pdorch.config_loader import add_config_args
from pdorch.local_stack.hf_checkpoints import FAMILIES
from pdorch.planner.profile import profile_from_dict, save_profile


def int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"a comma-separated list of integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"integers >= 1, got {text!r}")
    return sorted(set(values))


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pdorch bench profile", description=__doc__.split("\n")[0], allow_abbrev=False)
    p.add_argument("--out", required=True, help="the profile file to write (JSON)")
    p.add_argument("--prompt-tokens", type=int_list, default=[128, 512, 2048],
                   help="prefill points: uncached prompt lengths (default 128,512,2048)")
    p.add_argument("--batches", type=int_list, default=[1, 4, 16], help="decode points: concurrent streams "
                   "(default 1,4,16)")
    p.add_argument("--contexts", type=int_list, default=[512, 2048], help="decode points: prompt tokens of each "
                   "stream (default 512,2048)")
    p.add_argument("--runs", type=int, default=3, help="measurements per point, medians kept (default 3)")
    p.add_argument("--saturate-tokens", type=int, default=8192,
                   help="prompt tokens of one saturating prefill burst (at least 4 requests; default 8192)")
    p.add_argument("--max-output-tokens", type=int, default=256, help="a decode stream's max_new_tokens; it "
                   "is closed once the window has its tokens (default 256)")
    p.add_argument("--min-window-tokens", type=int, default=16, help="tokens per stream measured while the "
                   "whole batch decodes; then the streams are closed (default 16)")
    p.add_argument("--timeout", type=float, default=600.0, help="deadline of one request (s, default 600)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-dir", help="component logs of the cluster (default: a temp dir)")
    p.add_argument("--test-model", choices=FAMILIES, help="serve a random-weights checkpoint of this family "
                   "(pdorch/local_stack/hf_checkpoints.py) instead of model.source")
    p.set_defaults(url=None)  # bench_config's: the profile always starts its own one-replica cluster
    add_config_args(p)
    return p


def check(p: argparse.ArgumentParser, args) -> None:
    for name, ok, need in (("--runs", args.runs >= 1, ">= 1"), ("--saturate-tokens", args.saturate_tokens >= 1, ">= 1"),
                           ("--max-output-tokens", args.max_output_tokens >= 2, ">= 2"),
                           ("--min-window-tokens", args.min_window_tokens >= 1, ">= 1"),
                           ("--timeout", args.timeout > 0, "> 0")):
        if not ok:
            p.error(f"{name} must be {need}")


def cluster_sets(cfg, args) -> list[str]:
    """The profile's --set flags (the user's come after and win): a prefill call may wait as long as a
    request, the decode worker runs the largest batch at once with pages for it (the longest context and
    output) and the batch's primed prompts."""
    longest = max(args.contexts) + args.max_output_tokens
    pages = 2 * max(args.batches) * (math.ceil(longest / cfg.model.page_size) + 1)
    return [f"decode.prefill_timeout_s={args.timeout}",
            f"decode.max_running_requests={max(cfg.decode.max_running_requests, max(args.batches))}",
            f"decode.num_pages={max(cfg.decode.num_pages, pages)}"]


async def measure(url: str, prompts: UniquePrompts, settings: Settings, args, say, api_key: str) -> tuple[list, list]:
    profiler = Profiler(url, prompts, settings, say, api_key)
    try:
        await profiler.warm_up(min(args.prompt_tokens))
        prefill = [await profiler.prefill_point(n) for n in args.prompt_tokens]
        decode = [await profiler.decode_point(b, c) for c in args.contexts for b in args.batches]
    finally:
        await profiler.close()
    return prefill, decode


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    check(p, args)
    say = lambda m: print(m, flush=True)
    cfg = bench_config(args, "pdorch bench profile")
    tokenizer, _, _, _, model = model_facts(None, cfg)
    prompts = UniquePrompts(*ordinary_vocabulary(tokenizer), seed=args.seed)
    settings = Settings(args.runs, args.saturate_tokens, args.max_output_tokens, args.min_window_tokens, args.timeout)
    sets = cluster_sets(cfg, args) + args.config_overrides + port_overrides(1, 1)
    t0 = time.monotonic()
    cluster = ServeCluster(args.config, sets, 1, 1, args.log_dir, ready_timeout_s=args.timeout)
    if cluster.cfg.decode.max_running_requests < max(args.batches):  # the user's --set won: no such batch
        p.error(f"decode.max_running_requests={cluster.cfg.decode.max_running_requests} is below the largest "
                f"batch {max(args.batches)}")
    cluster.start()
    say(f"cluster ready at {cluster.url} (logs in {cluster.log_dir}): --set {' '.join(sets)}")
    try:
        prefill, decode = asyncio.run(measure(cluster.url, prompts, settings, args, say, cluster.cfg.router.api_key))
    except ProfileError as e:
        print(f"pdorch bench profile: {e}", file=sys.stderr)
        return 1
    finally:
        cluster.stop()
    save_profile(profile_from_dict(profile_dict(model, cluster.cfg.model.device, prefill, decode)), args.out)
    say(f"wrote {args.out}: {len(prefill)} prefill and {len(decode)} decode points of {model} on "
        f"{cluster.cfg.model.device} in {time.monotonic() - t0:.0f} s ({commit()})")
    return 0
