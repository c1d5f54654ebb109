"""One measured run of the workload on a FleetStack: `fixed` (2+2 throughout) or `scale_up` (1+1,
grown to 2+2 between the phases `before` and `after`). Per phase:

    hit_rate        cached prompt tokens / prompt tokens (the responses' cached_tokens)
    l1_hit_rate     the part of it from a prefill worker's own cache (tiers device + host): a
                    conversation that stayed on the worker that holds its prefix
    old_l1_of_ideal the old conversations' L1 hits / their page-aligned ideal (what their previous
                    turns computed): 1.0 when each continuing conversation stayed where its prefix is
    new_worker_share per role, the share of the phase's requests the newest worker got (the joiner
                    in scale_up, the one started second in fixed)
    spread          prefill in-flight sampled every 20 ms: the largest max - min across workers, and
                    each worker's peak
    choices         the router's prefill choices by reason (pdorch_router_prefill_choices_total)
"""

from __future__ import annotations

import concurrent.futures
import re
import threading

import httpx

from bench.multiturn.conversation import Conversation
from bench.multiturn.text import TurnSource
from bench.scale_up_hits.stack import FleetStack
from bench.scale_up_hits.workload import Workload

L1_TIERS = ("device", "host")
SAMPLE_S = 0.02

def generate(url: str, ids: list[int], max_tokens: int) -> dict:
    r = httpx.post(url + "/generate", timeout=120, json={
        "input_ids": ids, "sampling_params": {"max_new_tokens": max_tokens, "temperature": 0, "ignore_eos": True}})
    if r.status_code != 200:
        raise RuntimeError(f"/generate answered {r.status_code}: {r.text[:300]}")
    return r.json()

def choices(url: str) -> dict[str, float]:
    text = httpx.get(url + "/metrics", timeout=30).text
    return {m.group(1): float(m.group(2)) for m in
            re.finditer(r'^pdorch_router_prefill_choices_total\{reason="(\w+)"\} (\S+)$', text, re.MULTILINE)}

class LoadSampler:
    """Samples each routable prefill worker's in-flight count from the router's worker pool (/workers)
    on a thread, between start() and stop()."""

    def __init__(self, stack: FleetStack):
        self.stack, self.samples = stack, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="load-sampler", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            self.samples.append({w["address"]: w["in_flight"] for w in self.stack.workers()
                                 if w["role"] == "prefill" and w["healthy"]})

    def start(self) -> LoadSampler:
        self._thread.start()
        return self

    def stop(self) -> dict:
        self._stop.set()
        self._thread.join(timeout=30)
        busy = [s for s in self.samples if len(s) > 1]
        peaks: dict[str, int] = {}
        for s in self.samples:
            for a, n in s.items():
                peaks[a] = max(peaks.get(a, 0), n)
        return {"max_minus_min": max((max(s.values()) - min(s.values()) for s in busy), default=0),
                "peak_in_flight": peaks, "samples": len(self.samples)}

def run_once(stack: FleetStack, w: Workload, tok, scale_up: bool, say=print) -> dict:
    """The workload's phases on `stack` (already at its starting size); `scale_up`: grow it to 2+2 before `after`."""
    page = stack.cfg.model.page_size
    turns = TurnSource(tok, w.seed, random_ids=True)
    convs = {c: Conversation(c, "sglang", tok, turns, page, w.first_tokens, w.turn_tokens)
             for c in range(w.old_conversations + w.new_conversations)}
    url = stack.router.url

    def one(c: int, turn: int) -> dict:
        prompt = convs[c].next_prompt(turn)
        out = generate(url, prompt.ids, w.output_tokens)
        meta = out["meta_info"]
        convs[c].record_answer(out["output_ids"], out["text"], meta["completion_tokens"], meta["finish_reason"])
        tiers = meta.get("cached_tokens_details") or {}
        return {"new": w.is_new(c), "prompt": meta["prompt_tokens"], "cached": meta["cached_tokens"],
                "l1": sum(tiers.get(t, 0) for t in L1_TIERS), "ideal": prompt.ideal_tokens}

    result = {"join_s": None, "phases": {}}
    with concurrent.futures.ThreadPoolExecutor(w.parallel) as pool:
        for phase, rounds in w.rounds().items():
            if phase == "after" and scale_up:
                result["join_s"] = round(stack.scale(2, 2), 1)
                say(f"  joined 2+2 in {result['join_s']} s")
            routed0, choices0 = _routed(stack), choices(url)
            sampler = LoadSampler(stack).start()
            replies = []
            for pairs in rounds:
                replies += list(pool.map(lambda p: one(*p), pairs))
            spread = sampler.stop()
            result["phases"][phase] = _summary(replies, _share(stack, routed0), spread,
                                               _delta(choices(url), choices0))
    return result

def _routed(stack: FleetStack) -> dict[str, int]:
    return {w["address"]: w["routed"] for w in stack.workers()}

def _share(stack: FleetStack, before: dict[str, int]) -> dict[str, float]:
    """Per role, the share of the requests routed since `before` that its newest worker got."""
    now = _routed(stack)
    out = {}
    for role in ("prefill", "decode"):
        mine = [f.address for f in stack.fleet.workers if f.role == role]
        total = sum(now.get(a, 0) - before.get(a, 0) for a in mine)
        second = max((f for f in stack.fleet.workers if f.role == role), key=lambda f: f.child.started_at).address
        got = now.get(second, 0) - before.get(second, 0)
        out[role] = round(got / total, 3) if total else 0.0
    return out

def _delta(now: dict[str, float], before: dict[str, float]) -> dict[str, int]:
    return {k: int(v - before.get(k, 0)) for k, v in now.items() if v - before.get(k, 0)}

def _summary(replies: list[dict], share: dict, spread: dict, reasons: dict) -> dict:
    prompt = sum(r["prompt"] for r in replies)
    old = [r for r in replies if not r["new"]]
    old_ideal = sum(r["ideal"] for r in old)
    return {"requests": len(replies), "prompt_tokens": prompt,
            "hit_rate": round(sum(r["cached"] for r in replies) / prompt, 4),
            "l1_hit_rate": round(sum(r["l1"] for r in replies) / prompt, 4),
            "old_l1_of_ideal": round(sum(r["l1"] for r in old) / old_ideal, 4) if old_ideal else None,
            "new_worker_share": share, "spread": spread, "choices": reasons}
