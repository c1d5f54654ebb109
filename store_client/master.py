"""A real `mooncake_master` child process (with its HTTP metadata server) on its own free ports.

Used by tests, benchmarks and the local launcher (`pdorch serve`). Started with `start()`, stopped
by PID with `stop()`; `restart()` keeps the same ports so clients can reconnect to the same address.

NOTE: a restarted master starts empty (objects and segments live in its memory); clients must
re-mount their segments, which KVStore does when it reconnects.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Self

from store_client.ports import free_port

MASTER_BINARY = "mooncake_master"


class MasterError(RuntimeError):
    """mooncake_master could not be found, started or reached."""


def find_master_binary() -> str:
    """`mooncake_master` next to the running interpreter (a venv's bin dir) or on PATH."""
    return find_mooncake_binary(MASTER_BINARY)


def find_mooncake_binary(name: str) -> str:
    """One of Mooncake's programs (mooncake_master, mooncake_client) next to the running interpreter
    (a venv's bin dir) or on PATH; MasterError otherwise."""
    candidate = Path(sys.executable).parent / name
    if candidate.is_file() and os.access(candidate, os.X_OK):
        return str(candidate)
    found = shutil.which(name)
    if found:
        return found
    raise MasterError(f"{name} not found next to {sys.executable} nor on PATH; "
                      "install mooncake-transfer-engine-non-cuda (CPU) or mooncake-transfer-engine (GPU)")


def local_masters() -> list[tuple[int, dict[str, str]]]:
    """(pid, {flag: value}) of every mooncake_master running on this host (Linux /proc; `pdorch
    status` names the local masters and their pids by it)."""
    out = []
    for entry in Path("/proc").iterdir() if Path("/proc").is_dir() else ():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if argv and os.path.basename(argv[0]) == MASTER_BINARY:
            flags = dict(a[2:].partition("=")[::2] for a in argv[1:] if a.startswith("--"))
            out.append((int(entry.name), flags))
    return sorted(out)


def _port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


class MasterProcess:
    """One `mooncake_master` on loopback. Ports default to three distinct free ports.

    NOTE: the master's defaults (8080, 50051, 9003) collide between masters; always pass all three.
    """

    def __init__(self, rpc_port: int = 0, metadata_port: int = 0, metrics_port: int = 0,
                 host: str = "127.0.0.1", kv_lease_ttl_ms: int = 10000, client_ttl_s: int = 10,
                 eviction_high_watermark_ratio: float = 0.9, log_dir: str | None = None,
                 binary: str | None = None, eviction_ratio: float = 0.05, enable_offload: bool = False,
                 bind_host: str | None = None, offload_on_evict: bool = False, ha_etcd: tuple[str, ...] = (),
                 cluster_id: str = "mooncake_cluster", extra_args: tuple[str, ...] = ()):
        """`ha_etcd`: etcd endpoints (host:port): run in HA mode (leader election in etcd, metadata
        replicated to the standbys by Mooncake's oplog); clients then address the masters as
        etcd://... and keep the transfer engine's metadata in etcd (no HTTP metadata server).
        `extra_args`: more mooncake_master flags, appended as given."""
        ports: set[int] = set()
        chosen = []
        for p in (rpc_port, metadata_port, metrics_port):
            while not p or p in ports:  # three distinct ports, even when free_port repeats one
                p = free_port()
            ports.add(p)
            chosen.append(p)
        self.rpc_port, self.metadata_port, self.metrics_port = chosen
        self.host = host
        self.kv_lease_ttl_ms = kv_lease_ttl_ms
        self.client_ttl_s = client_ttl_s
        self.eviction_high_watermark_ratio = eviction_high_watermark_ratio
        self.eviction_ratio = eviction_ratio
        self.enable_offload = enable_offload
        self.offload_on_evict = offload_on_evict and enable_offload  # disk copies made as DRAM evicts
        # Where the metadata and metrics servers listen (the RPC port always binds 0.0.0.0); a pod
        # listens on every interface while clients dial its Service name (`host`).
        self.bind_host = bind_host or host
        self.ha_etcd, self.cluster_id = tuple(ha_etcd), cluster_id
        self.extra_args = tuple(extra_args)
        self.binary = binary or find_master_binary()
        self.log_dir = log_dir or tempfile.mkdtemp(prefix="mooncake_master_")
        self.log_path = os.path.join(self.log_dir, f"master_{self.rpc_port}.log")
        self._proc: subprocess.Popen | None = None

    @property
    def master_address(self) -> str:
        return f"{self.host}:{self.rpc_port}"

    @property
    def metadata_url(self) -> str:
        return f"http://{self.host}:{self.metadata_port}/metadata"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.host}:{self.metrics_port}/metrics"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def ha_master_address(self) -> str:
        """The address clients give for the HA masters (store.master_address)."""
        return "etcd://" + ";".join(self.ha_etcd)

    def role(self, timeout_s: float = 1.0) -> str | None:
        """HA mode: "leader" or "standby" (the master's /role), None when it does not answer."""
        try:
            with urllib.request.urlopen(f"http://{self.host}:{self.metrics_port}/role", timeout=timeout_s) as r:
                return r.read().decode().strip()
        except (urllib.error.URLError, OSError):
            return None

    def ha_state(self, timeout_s: float = 1.0) -> str | None:
        """HA mode: the master's phase (its /ha_status): "standby", "leader_warmup" (it won the election
        and waits one lease before it serves), "serving"; None when it does not answer."""
        try:
            with urllib.request.urlopen(f"http://{self.host}:{self.metrics_port}/ha_status", timeout=timeout_s) as r:
                return r.read().decode().strip()
        except (urllib.error.URLError, OSError):
            return None

    def command(self) -> list[str]:
        if self.ha_etcd:  # NOTE: --rpc_address: what the leader writes into etcd for the clients
            own = ["--enable_ha=true", f"--etcd_endpoints={';'.join(self.ha_etcd)}", f"--rpc_address={self.host}",
                   f"--cluster_id={self.cluster_id}", "--enable_oplog=true", "--enable_http_metadata_server=false"]
        else:
            own = ["--enable_http_metadata_server=true", f"--http_metadata_server_host={self.bind_host}",
                   f"--http_metadata_server_port={self.metadata_port}"]
        return [
            self.binary, *own,
            f"--rpc_port={self.rpc_port}",
            f"--metrics_host={self.bind_host}",
            f"--metrics_port={self.metrics_port}",
            f"--default_kv_lease_ttl={self.kv_lease_ttl_ms}",
            f"--client_ttl={self.client_ttl_s}",
            f"--eviction_high_watermark_ratio={self.eviction_high_watermark_ratio}",
            f"--eviction_ratio={self.eviction_ratio}",
            f"--enable_offload={str(self.enable_offload).lower()}",
        ] + (["--offload_on_evict=true"] if self.offload_on_evict else []) + list(self.extra_args)

    def start(self, timeout_s: float = 20.0) -> Self:
        """Start and wait until the RPC, metadata and metrics ports all answer (deadline timeout_s)."""
        if self.running():
            raise MasterError(f"master already running with pid {self.pid}")
        # NOTE: the master binds 0.0.0.0 with port reuse, so a busy port does not make it fail; it
        # would run beside the other listener and our readiness probe would talk to the wrong one.
        busy = [p for p in (self.rpc_port, self.metadata_port, self.metrics_port) if _port_open(p)]
        if busy:
            raise MasterError(f"cannot start mooncake_master: port(s) {busy} already in use on 127.0.0.1")
        with open(self.log_path, "ab") as log:
            # start_new_session: our signals (Ctrl-C in a test run) don't reach it; we stop it by PID.
            self._proc = proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT,
                                                 stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            self._wait_ready(proc, timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self, proc: subprocess.Popen, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise MasterError(f"mooncake_master exited with {proc.returncode} during start-up; "
                                  f"log: {self.log_path}\n{self.log_tail()}")
            # NOTE: HA: a standby serves no RPC and no master runs a metadata server: metrics only
            ports = (self.metrics_port,) if self.ha_etcd else (self.rpc_port, self.metadata_port, self.metrics_port)
            if all(_port_open(p) for p in ports):
                try:
                    with urllib.request.urlopen(self.metrics_url, timeout=1.0) as r:
                        if r.status == 200:
                            return
                except (urllib.error.URLError, OSError):
                    pass
            time.sleep(0.1)
        raise MasterError(f"mooncake_master not ready within {timeout_s}s on rpc {self.rpc_port}, "
                          f"metadata {self.metadata_port}, metrics {self.metrics_port}; log: {self.log_path}\n"
                          f"{self.log_tail()}")

    def log_tail(self, nbytes: int = 2000) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - nbytes))
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def metrics_text(self, timeout_s: float = 2.0) -> str:
        with urllib.request.urlopen(self.metrics_url, timeout=timeout_s) as r:
            return r.read().decode()

    def kill(self) -> None:
        """SIGKILL (a crash, as tests simulate it) and reap."""
        proc = self._proc
        if proc is not None and proc.poll() is None:  # running()
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM by PID, SIGKILL after timeout_s; idempotent."""
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        try:
            os.kill(proc.pid, signal.SIGTERM)
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=timeout_s)
        except ProcessLookupError:
            pass

    def restart(self, timeout_s: float = 20.0) -> Self:
        """Stop (if running) and start again on the same ports."""
        self.stop()
        return self.start(timeout_s)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
