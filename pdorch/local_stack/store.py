"""Store-tier fixtures: a real mooncake_master per test, peer processes, deterministic page bytes.

Peers run this module as a program (`python -m pdorch.local_stack.store ROLE JSON_ARGS`): they print one
JSON line when ready, then obey one-line commands on stdin ("exit" stops them). No torch anywhere.
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]


def page_pattern(seed: int, num_pages: int, page_nbytes: int) -> np.ndarray:
    """Deterministic page bytes: [num_pages, page_nbytes] uint8, different for every page and seed."""
    return np.random.default_rng(seed).integers(0, 256, size=(num_pages, page_nbytes), dtype=np.uint8)


def digest(arr: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(arr).tobytes()).hexdigest()


def model_page_objects(model_dir):
    """How a worker of the model at `model_dir` keeps a page in the store (one object per KV-head
    group, store_client/page_objects.py), for a test's own KVStore that checks the workers' pages:
    KVStore(cfg, objects.page_nbytes, metrics, objects=objects)."""
    from engine.arch import ModelArch
    from store_client.page_objects import PageObjects, head_groups

    groups = head_groups(ModelArch.from_model_dir(model_dir).num_kv_heads)
    return PageObjects(groups, range(groups), 4096)


def store_config(master, **overrides):
    """A StoreConfig pointing at a MasterProcess, small sizes, fast reconnects for tests."""
    from pdorch.config import StoreConfig

    base = {"master_address": master.master_address, "metadata_server": master.metadata_url,
                "global_segment_size_mb": 64, "local_buffer_size_mb": 16, "reconnect_interval_s": 0.3,
                "op_timeout_s": 10.0}
    return StoreConfig(**{**base, **overrides})


class Peer:
    """A child Python process running one role of this module; stopped by PID."""

    def __init__(self, role: str, args: dict, log_dir: str, timeout_s: float = 60.0):
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
        self.log_path = os.path.join(log_dir, f"peer_{role}_{os.getpid()}_{time.monotonic_ns()}.log")
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - lives as long as the peer, closed in stop()
        self.proc = subprocess.Popen([sys.executable, "-m", "pdorch.local_stack.store", role, json.dumps(args)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log,
                                     text=True, cwd=REPO_ROOT, env=env, start_new_session=True)
        self._lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True, name=f"peer-{role}-stdout").start()
        self.ready = self.read(timeout_s)

    def _pump(self) -> None:
        for line in self.proc.stdout:
            self._lines.put(line)

    def read(self, timeout_s: float = 60.0) -> dict:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                line = self._lines.get(timeout=0.1)
            except queue.Empty:
                if self.proc.poll() is not None and self._lines.empty():
                    break
                continue
            if line.startswith("{"):
                return json.loads(line)
        raise RuntimeError(f"peer gave no answer within {timeout_s}s (exit {self.proc.poll()}); "
                           f"log {self.log_path}:\n{Path(self.log_path).read_text(errors='replace')[-3000:]}")

    def ask(self, command: str, timeout_s: float = 60.0) -> dict:
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self.read(timeout_s)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def stop(self, timeout_s: float = 20.0) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write("exit\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=timeout_s)
            except (BrokenPipeError, OSError, subprocess.TimeoutExpired):
                self.kill()
        self._log.close()


# ---------------------------------------------------------------------------------------- peer roles
def _emit(obj: dict) -> None:
    print(json.dumps(obj), flush=True)


def _role_transfer_target(args: dict) -> None:
    """Registers a zeroed buffer; answers `digest OFFSET NBYTES` with the sha256 of that range."""
    from store_client.transfer import KVTransfer

    buf = np.zeros(args["nbytes"], dtype=np.uint8)
    transfer = KVTransfer("127.0.0.1", "tcp", "")
    segment = transfer.start()
    transfer.register(buf.ctypes.data, buf.nbytes)
    _emit({"segment": segment, "ptr": buf.ctypes.data})
    for line in sys.stdin:
        cmd = line.split()
        if not cmd or cmd[0] == "exit":
            break
        if cmd[0] == "digest":
            off, n = int(cmd[1]), int(cmd[2])
            _emit({"digest": digest(buf[off:off + n])})
    transfer.close()


def _role_store_writer(args: dict) -> None:
    """A worker that owns a store segment and page memory; answers `save I,J,..` with a SaveResult."""
    from prometheus_client import CollectorRegistry

    from store_client.config import StoreConfig
    from store_client.metrics import StoreMetrics
    from store_client.store import KVStore

    cfg = StoreConfig(master_address=args["master_address"], metadata_server=args["metadata_server"],
                      global_segment_size_mb=args.get("segment_mb", 64), local_buffer_size_mb=16,
                      reconnect_interval_s=0.3)
    pages = page_pattern(args["seed"], args["num_pages"], args["page_nbytes"])
    store = KVStore(cfg, args["page_nbytes"], StoreMetrics(CollectorRegistry()))
    store.register_buffer(pages.ctypes.data, pages.nbytes)
    _emit({"enabled": store.wait_enabled(30)})
    keys = args["keys"]
    for line in sys.stdin:
        cmd = line.split()
        if not cmd or cmd[0] == "exit":
            break
        if cmd[0] == "save":
            idx = [int(i) for i in cmd[1].split(",")]
            r = store.save([keys[i] for i in idx], [pages.ctypes.data + i * pages.shape[1] for i in idx])
            _emit({"written": r.pages_written, "skipped": r.pages_skipped, "failed": r.pages_failed,
                   "reason": r.reason})
    store.close()


ROLES = {"transfer-target": _role_transfer_target, "store-writer": _role_store_writer}


if __name__ == "__main__":
    ROLES[sys.argv[1]](json.loads(sys.argv[2]))
