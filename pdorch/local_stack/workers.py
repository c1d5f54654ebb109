"""A real P/D cluster on loopback for worker tests: mooncake_master, prefill and decode processes.

`start_cluster(...)` writes one YAML config, starts `python -m prefill_node` / `python -m decode_node`
as child processes on free ports (each in its own process group, stopped by PID) and returns a
WorkerCluster with gRPC stubs and helpers. Test modules wrap it in a module-scoped fixture so the
processes start once per module.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import urllib.request
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path

import grpc

from decode_node.__main__ import uses_store
from pdorch.config import Config
from pdorch.config_loader import dump_config, load_config
from pdorch.local_stack.processes import free_port, stop_processes, wait_for_port
from proto.pdorch.v1 import worker_pb2 as pb
from proto.pdorch.v1 import worker_pb2_grpc as pb_grpc

ROOT = Path(__file__).resolve().parents[1]
START_TIMEOUT_S = 120.0  # model load + transfer engine handshake on a busy 2-core machine


@dataclass
class GenerateResult:
    token_ids: list[int]
    text: str
    finish_reason: str
    prompt_tokens: int
    cached: pb.CachedTokens


@dataclass
class WorkerProc:
    role: str
    port: int
    metrics_port: int
    proc: subprocess.Popen
    log_path: Path

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def log_tail(self, n: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-n:] if self.log_path.exists() else ""


@dataclass
class WorkerCluster:
    cfg: Config
    tmp: Path
    master: object | None
    prefill: WorkerProc | None = None
    decode: WorkerProc | None = None
    channels: list = field(default_factory=list)
    workers: list = field(default_factory=list)

    # --------------------------------------------------------------------------------- stubs
    def prefill_stub(self, wp: WorkerProc | None = None) -> pb_grpc.PrefillServiceStub:
        ch = grpc.insecure_channel((wp or self.prefill).address)
        self.channels.append(ch)
        return pb_grpc.PrefillServiceStub(ch)

    def decode_stub(self, wp: WorkerProc | None = None) -> pb_grpc.DecodeServiceStub:
        ch = grpc.insecure_channel((wp or self.decode).address)
        self.channels.append(ch)
        return pb_grpc.DecodeServiceStub(ch)

    def generate(self, token_ids, max_tokens: int = 16, timeout_s: float = 120.0, request_id: str | None = None,
                 prefill_address: str | None = None, decode: WorkerProc | None = None, **sampling) -> GenerateResult:
        """One Generate stream to the end; greedy unless `temperature` is given."""
        req = pb.GenerateRequest(
            request_id=request_id or uuid.uuid4().hex, token_ids=list(token_ids),
            sampling=pb.SamplingParams(max_tokens=max_tokens, temperature=sampling.pop("temperature", 0.0),
                                       **sampling),
            prefill_address=prefill_address or self.prefill.address, timeout_s=timeout_s)
        tokens, text, finish, prompt_tokens, cached = [], "", "", 0, pb.CachedTokens()
        for chunk in self.decode_stub(decode).Generate(req, timeout=timeout_s + 10):
            tokens.extend(chunk.token_ids)
            text += chunk.text
            prompt_tokens = chunk.prompt_tokens
            cached = chunk.cached
            finish = chunk.finish_reason or finish
        return GenerateResult(tokens, text, finish, prompt_tokens, cached)

    def stats(self, role: str, wp: WorkerProc | None = None) -> pb.WorkerStats:
        stub = self.prefill_stub(wp) if role == "prefill" else self.decode_stub(wp)
        return stub.Stats(pb.StatsRequest(), timeout=30)

    def wait_idle(self, role: str, timeout_s: float = 15.0, wp: WorkerProc | None = None) -> pb.WorkerStats:
        """Stats once no request holds pages any more (write-backs and offloads drained)."""
        deadline = time.monotonic() + timeout_s
        while True:
            st = self.stats(role, wp)
            if st.active_pages == 0 and st.info.running_requests == 0 and st.info.queued_requests == 0:
                return st
            if time.monotonic() > deadline:
                raise AssertionError(f"{role} still busy after {timeout_s}s: {st}")
            time.sleep(0.1)

    def assert_pools_sound(self) -> None:
        """Every live worker: idle, check_integrity() passes, every page back in the pool."""
        for wp in self.workers:
            if wp.proc.poll() is None and wp.role == "prefill":
                st = self.wait_idle("prefill", wp=wp)
            elif wp.proc.poll() is None and wp is self.decode:
                st = self.wait_idle("decode")
            else:
                continue
            assert st.pool_integrity_ok, f"{wp.role} pool integrity: {st.pool_integrity_error}"
            assert st.info.free_pages == st.info.total_pages, f"{wp.role} leaked pages: {st.info}"

    def two_turns(self, tok, first: str, second: str, max_tokens: int = 40) -> tuple[list[int], list[int], list[int]]:
        """Run turn 1 to the end, then build turn 2 with the chat template: (turn1, answer ids, turn2).

        Asserts the tokenization condition of decode_node/offload.py (turn 2 starts with turn 1 + the
        generated ids), waits until write-backs and offloads are done, and flushes P's L1 so turn 2's
        prefix can only come from the store."""
        history = [{"role": "user", "content": first}]
        turn1 = tok.encode_chat(history)
        out1 = self.generate(turn1, max_tokens=max_tokens).token_ids
        answer = tok.decode([t for t in out1 if t not in tok.eos_token_ids], skip_special_tokens=True)
        turn2 = tok.encode_chat(history + [{"role": "assistant", "content": answer},
                                           {"role": "user", "content": second}])
        assert turn2[:len(turn1) + len(out1)] == turn1 + out1
        self.wait_idle("decode")
        for wp in self.workers:
            if wp.role == "prefill" and wp.proc.poll() is None:
                self.wait_idle("prefill", wp=wp)
                self.prefill_stub(wp).Flush(pb.FlushRequest(), timeout=30)
        return turn1, out1, turn2

    def flush_l1(self) -> None:
        """Drop every live worker's prefix cache (prefill L1s and the decode workers' own), once their
        write-backs and offloads are done: what follows can only find its prefix in the store."""
        for wp in self.workers:
            if wp.proc.poll() is None:
                self.wait_idle(wp.role, wp=wp)
                stub = self.prefill_stub(wp) if wp.role == "prefill" else self.decode_stub(wp)
                stub.Flush(pb.FlushRequest(), timeout=30)

    # ----------------------------------------------------------------------------- processes
    def spawn_worker(self, role: str, sections: dict | None = None, **overrides) -> WorkerProc:
        """Start one more `role` worker on fresh ports (its own config file; `port=` restarts one where
        another was); wait with wait_ready().

        `overrides` change keys of the role's section, `sections` = {"discovery": {...}} other sections."""
        ports = {"port": free_port(), "metrics_port": free_port()}  # a restart passes the old ones
        section = replace(getattr(self.cfg, role), **{**ports, **overrides})
        cfg = replace(self.cfg, **{role: section})
        for name, values in (sections or {}).items():
            cfg = replace(cfg, **{name: replace(getattr(cfg, name), **values)})
        config_path = self.tmp / f"{role}_{section.port}.yaml"
        dump_config(cfg, config_path)
        log_path = self.tmp / f"{role}_{section.port}.log"
        env = dict(os.environ, PYTHONUNBUFFERED="1", MC_FORCE_TCP="1")
        with open(log_path, "ab") as log:
            proc = subprocess.Popen([sys.executable, "-m", f"{role}_node", "--config", str(config_path)],
                                    cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        wp = WorkerProc(role, section.port, section.metrics_port, proc, log_path)
        self.workers.append(wp)
        if getattr(self, role) is None:
            setattr(self, role, wp)
        return wp

    @contextlib.contextmanager
    def stopped_on_failure(self):
        """Start-up steps run inside `with cluster.stopped_on_failure():` stop the whole cluster
        (workers and master, by PID) when one of them fails, then re-raise."""
        try:
            yield self
        except BaseException:
            self.stop()
            raise

    def wait_ready(self, *wps: WorkerProc) -> None:
        for wp in wps:
            try:
                wait_for_port(wp.port, START_TIMEOUT_S, wp.proc)
                _wait_info(wp.address, START_TIMEOUT_S, want_store=self.master is not None and (
                    wp.role == "prefill" or uses_store(self.cfg.decode)))
            except Exception as e:
                raise RuntimeError(f"{wp.role} worker did not start: {e}\n{wp.log_tail()}") from e

    def stop(self, timeout_s: float = 10.0) -> None:
        """Every worker (SIGTERM, then SIGKILL past timeout_s), then the master."""
        for ch in self.channels:
            ch.close()
        stop_processes([wp.proc for wp in reversed(self.workers)], timeout_s)
        if self.master is not None:
            self.master.stop()


def _wait_info(address: str, timeout_s: float, want_store: bool) -> None:
    """Until the worker answers Info (and, with want_store, reports the store connected)."""
    deadline = time.monotonic() + timeout_s
    with grpc.insecure_channel(address) as ch:
        grpc.channel_ready_future(ch).result(timeout=timeout_s)
        while True:
            info = _info(ch)
            if info.store_enabled or not want_store:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"worker {address} did not connect to the store within {timeout_s}s")
            time.sleep(0.2)


def _info(ch) -> pb.WorkerInfo:
    """Info through whichever service the worker serves (the role is in the answer)."""
    try:
        return pb_grpc.PrefillServiceStub(ch).Info(pb.InfoRequest(), timeout=10)
    except grpc.RpcError as e:
        if e.code() != grpc.StatusCode.UNIMPLEMENTED:
            raise
        return pb_grpc.DecodeServiceStub(ch).Info(pb.InfoRequest(), timeout=10)


def worker_metric(wp: WorkerProc, name: str, **labels) -> float:
    """The sum of a worker's /metrics samples named `name` with these labels (0 when absent)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{wp.metrics_port}/metrics", timeout=10) as r:
        text = r.read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        base, _, rest = head.partition("{")
        if base == name and all(f'{k}="{v}"' in rest for k, v in labels.items()):
            total += float(value)
    return total


def make_config(tmp: Path, model_dir: Path, master=None, **sections) -> Config:
    """The cluster's base Config (workers get fresh ports); `sections` = {"decode": {"key": value}}."""
    cfg = load_config(None)
    cfg = replace(cfg, model=replace(cfg.model, source=str(model_dir), cache_dir=str(tmp / "models"),
                                     torch_threads=1, page_size=16))
    store = replace(cfg.store, enabled=master is not None, global_segment_size_mb=256, local_buffer_size_mb=16)
    if master is not None:
        # NOTE: the metrics port too: the chain evictor reads the store's fill there (the default
        # port could be another cluster's master, or nothing)
        store = replace(store, master_address=master.master_address, metadata_server=master.metadata_url,
                        master_metrics_port=master.metrics_port)
    cfg = replace(cfg, store=store, prefill=replace(cfg.prefill, num_pages=256, request_timeout_s=60.0),
                  decode=replace(cfg.decode, num_pages=256))
    for name, values in sections.items():
        cfg = replace(cfg, **{name: replace(getattr(cfg, name), **values)})
    return cfg


def start_cluster(tmp: Path, model_dir: Path, with_store: bool = True, num_prefill: int = 1,
                  kv_lease_ttl_ms: int = 10000, **sections) -> WorkerCluster:
    """Master (when with_store), then P(s) and D started together; all stopped again if a start fails.
    `kv_lease_ttl_ms`: the master's read lease (short, the master may evict what was just read)."""
    master = None
    if with_store:
        from store_client.master import MasterProcess

        # store.ssd_path: the SSD tier needs the master's offload too (as pdorch serve starts it)
        offload = bool(sections.get("store", {}).get("ssd_path"))
        master = MasterProcess(log_dir=str(tmp), enable_offload=offload, kv_lease_ttl_ms=kv_lease_ttl_ms).start()
    cfg = make_config(tmp, model_dir, master, **sections)
    cluster = WorkerCluster(cfg=cfg, tmp=tmp, master=master)
    try:
        wps = [cluster.spawn_worker("prefill") for _ in range(num_prefill)] + [cluster.spawn_worker("decode")]
        cluster.wait_ready(*wps)
    except BaseException:
        cluster.stop()
        raise
    return cluster
