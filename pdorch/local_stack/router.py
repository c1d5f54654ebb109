"""Router fixtures: the router app served by uvicorn on a thread, stand-in workers, etcd.

The router runs in the test process (its own event loop thread) so tests can reach the
stand-in workers' `Behavior` directly; etcd is a real `etcd` process on free ports.
"""

from __future__ import annotations

import asyncio
import dataclasses
import shutil
import subprocess
import sys
import threading
import time
import traceback

import uvicorn

from pdorch.config import Config, DiscoveryConfig, ModelConfig, RouterConfig
from pdorch.local_stack.processes import free_port, stop_process, wait_for_port


def wait_until(cond, timeout_s: float, what: str) -> None:
    """Poll `cond()` every 20 ms; fail naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


class RouterThread:
    """create_app(cfg) served on 127.0.0.1:<free port> by uvicorn on a daemon thread."""

    def __init__(self, cfg: Config, tokenizer, model_dir=None):
        from router.http.app import create_app
        from router.http.http_protocol import RouterHttpProtocol

        self.port = cfg.router.port
        self.url = f"http://127.0.0.1:{self.port}"
        self.app = create_app(cfg, tokenizer, model_dir)
        self.server = uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1", port=self.port,
                                                    log_level="warning", access_log=False, lifespan="on",
                                                    timeout_graceful_shutdown=3, http=RouterHttpProtocol))
        self.thread = threading.Thread(target=self._run, name=f"router-{self.port}", daemon=True)

    def _run(self):
        asyncio.run(self.server.serve())

    def start(self, timeout_s: float = 15.0) -> RouterThread:
        self.thread.start()
        wait_for_port(self.port, timeout_s)
        return self

    def stop(self, timeout_s: float = 15.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=timeout_s)
        if self.thread.is_alive():  # where it hangs goes into the failure (a shutdown that never ends is a bug)
            frame = sys._current_frames().get(self.thread.ident or 0)
            where = "".join(traceback.format_stack(frame)) if frame is not None else "(no frame)"
            raise AssertionError(f"router thread did not stop within {timeout_s:g} s; it is at:\n{where}")


def router_config(prefill: list[str], decode: list[str], **router_keys) -> Config:
    rc = dataclasses.replace(RouterConfig(), port=free_port(), health_check_interval_s=0.3,
                             circuit_breaker_cooldown_s=1.0, **router_keys)
    dc = DiscoveryConfig(mode="static", prefill=tuple(prefill), decode=tuple(decode))
    return Config(model=ModelConfig(page_size=16, max_context_tokens=0), router=rc, discovery=dc)


def cluster_router(cluster, model_dir, model_keys: dict | None = None, **router_keys) -> RouterThread:
    """A started router over the live workers of a WorkerCluster (static discovery; the model and
    store sections the cluster's, with `model_keys` changed)."""
    from engine.tokenizer import Tokenizer

    addresses = {role: [w.address for w in cluster.workers if w.role == role and w.proc.poll() is None]
                 for role in ("prefill", "decode")}
    base = router_config(addresses["prefill"], addresses["decode"], **router_keys)
    cfg = dataclasses.replace(cluster.cfg, router=base.router, discovery=base.discovery,
                              model=dataclasses.replace(cluster.cfg.model, **(model_keys or {})))
    return RouterThread(cfg, Tokenizer.from_dir(model_dir), model_dir).start()


@dataclasses.dataclass
class Etcd:
    endpoint: str
    client_port: int
    peer_port: int
    data_dir: str
    log_path: str
    proc: subprocess.Popen | None = None


def _start_etcd(e: Etcd) -> None:
    binary = shutil.which("etcd")
    if binary is None:
        raise RuntimeError("the `etcd` binary is not installed (make setup installs Debian's etcd-server)")
    with open(e.log_path, "ab") as log:
        e.proc = subprocess.Popen(
            [binary, "--name", "test", "--data-dir", e.data_dir,
             "--listen-client-urls", f"http://127.0.0.1:{e.client_port}",
             "--advertise-client-urls", f"http://127.0.0.1:{e.client_port}",
             "--listen-peer-urls", f"http://127.0.0.1:{e.peer_port}",
             "--initial-advertise-peer-urls", f"http://127.0.0.1:{e.peer_port}",
             "--initial-cluster", f"test=http://127.0.0.1:{e.peer_port}"],
            stdout=subprocess.DEVNULL, stderr=log, start_new_session=True)
    wait_for_port(e.client_port, 20, e.proc)


def start_etcd(directory) -> Etcd:
    """A real etcd on free loopback ports, its data and log in `directory`; the caller stops it by PID."""
    client_port, peer_port = free_port(), free_port()
    e = Etcd(f"127.0.0.1:{client_port}", client_port, peer_port, str(directory / "etcd"), str(directory / "etcd.log"))
    _start_etcd(e)
    return e


def restart_etcd(e: Etcd) -> None:
    """Stop etcd (by PID) and start it again on the same ports and data dir."""
    stop_process(e.proc)
    _start_etcd(e)
