"""A local cluster for a benchmark, started exactly as a user starts one: `pdorch serve` as a child
process (the launcher plans, starts, watches and stops mooncake_master, the workers and the router),
on free ports, with the benchmark's `--set` overrides after the user's.

    ServeCluster(...).start()  -> waits for "pdorch is ready at" (deadline), finds the children
    .processes()                -> {"serve": pid, "master": pid, "prefill-0": pid, ..., "router": pid}
    .stop()                     -> SIGTERM to `pdorch serve` (it stops its children in order), then
                                   SIGKILL by PID whatever is still there after the deadline

Children import from this checkout (PYTHONPATH and cwd), so a benchmark run from another worktree
measures that worktree's code.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pdorch.child_process import pid_alive, popen_dying_with_parent, proc_stat
from pdorch.config import Config
from pdorch.config_loader import (
    ConfigError,
    default_config_path,
    exit_on_config_error,
    load_config,
    parse_overrides,
)
from pdorch.ports import free_port, free_port_run

ROOT = Path(__file__).resolve().parents[2]
READY_LINE = "pdorch is ready at"
_ROLES = (("mooncake_master", "master"), ("prefill_node", "prefill"), ("decode_node", "decode"),
          ("-m router", "router"))


def port_overrides(num_prefill: int, num_decode: int, num_routers: int = 1) -> list[str]:
    """--set flags moving every listening port of the cluster to free ones."""
    h = "127.0.0.1"
    return [f"store.master_address={h}:{free_port(h)}", f"store.metadata_server=http://{h}:{free_port(h)}/metadata",
            f"store.master_metrics_port={free_port(h)}",
            f"prefill.port={free_port_run(num_prefill, h)}", f"prefill.metrics_port={free_port_run(num_prefill, h)}",
            f"decode.port={free_port_run(num_decode, h)}", f"decode.metrics_port={free_port_run(num_decode, h)}",
            f"router.port={free_port_run(num_routers, h)}"]


def effective_config(config_path: str | None, overrides: list[str]) -> Config:
    """The config every child sees: file, PDORCH_* env, then the --set flags in order."""
    return load_config(config_path, parse_overrides(overrides))


def bench_config(args, prog: str) -> Config:
    """A benchmark's effective config from its arguments (`--config`, `--set`, `--url`, `--test-model`):
    the embedded default config unless it replays against a running router; a test model goes in before
    the user's own --set, which win. A config error ends the program, naming the key."""
    from bench.multiturn.facts import test_model_dir

    if args.config is None and not args.url:
        args.config = str(default_config_path())
    if args.test_model:
        args.config_overrides = [f"model.source={test_model_dir(args.test_model)}", "model.name=",
                                 *args.config_overrides]
    try:
        return effective_config(args.config, args.config_overrides)
    except ConfigError as e:
        exit_on_config_error(e, prog)


def metrics_urls(cfg: Config, num_prefill: int, num_decode: int) -> tuple[list[str], str | None]:
    """(/metrics of every worker, /metrics of mooncake_master or None when the store is off)."""
    def url(host: str, port: int) -> str:
        return f"http://{'127.0.0.1' if host in ('0.0.0.0', '') else host}:{port}/metrics"
    workers = [url(cfg.prefill.host, cfg.prefill.metrics_port + i) for i in range(num_prefill)
               if cfg.prefill.metrics_port]
    workers += [url(cfg.decode.host, cfg.decode.metrics_port + i) for i in range(num_decode)
                if cfg.decode.metrics_port]
    master_host = cfg.store.master_address.rpartition(":")[0]
    master = url(master_host, cfg.store.master_metrics_port) if cfg.store.enabled else None
    return workers, master


class ServeCluster:
    def __init__(self, config_path: str | None, overrides: list[str], num_prefill: int = 1, num_decode: int = 1,
                 log_dir: str | None = None, ready_timeout_s: float = 600.0, stop_timeout_s: float = 60.0,
                 num_routers: int = 1):
        self.config_path, self.overrides = config_path, list(overrides)
        self.num_prefill, self.num_decode, self.num_routers = num_prefill, num_decode, num_routers
        self.log_dir = Path(log_dir or tempfile.mkdtemp(prefix="pdorch-bench-"))
        self.ready_timeout_s, self.stop_timeout_s = ready_timeout_s, stop_timeout_s
        self.cfg = effective_config(config_path, self.overrides)
        self.url = ""
        self.urls: list[str] = []  # every router replica's (router.port + i); url is the first
        self.proc: subprocess.Popen | None = None
        self._children: dict[str, int] = {}

    @property
    def out_path(self) -> Path:
        return self.log_dir / "serve.out"

    def output(self) -> str:
        return self.out_path.read_text(errors="replace") if self.out_path.exists() else ""

    def start(self) -> ServeCluster:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        argv = [sys.executable, "-m", "pdorch.cli", "serve", "--prefill", str(self.num_prefill),
                "--decode", str(self.num_decode), "--routers", str(self.num_routers), "--log-dir", str(self.log_dir),
                "--startup-timeout", str(self.ready_timeout_s)]
        argv += ["--config", self.config_path] if self.config_path else []
        argv += [a for s in self.overrides for a in ("--set", s)]
        env = dict(os.environ, PYTHONUNBUFFERED="1",
                   PYTHONPATH=os.pathsep.join([str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
        with open(self.out_path, "wb") as out:
            # NOTE: dying with its parent: a benchmark killed outright must not leave its cluster running.
            self.proc = popen_dying_with_parent(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                                cwd=ROOT, env=env, start_new_session=True)
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.ready_timeout_s
        while True:
            m = re.search(READY_LINE + r" (\S+)", self.output())
            if m:
                self.url = m.group(1)
                base = self.url.rpartition(":")
                self.urls = [f"{base[0]}:{int(base[2]) + i}" for i in range(self.num_routers)]
                self._children = self._find_children()
                return
            if self.proc.poll() is not None:
                raise RuntimeError(f"pdorch serve exited with {self.proc.returncode} before it was ready:\n"
                                   + self.output()[-3000:])
            if time.monotonic() > deadline:
                raise TimeoutError(f"pdorch serve not ready within {self.ready_timeout_s:.0f} s:\n"
                                   + self.output()[-3000:])
            time.sleep(0.3)

    def _find_children(self) -> dict[str, int]:
        """{name: pid} of the live children of `pdorch serve`, named like the launcher names them."""
        found: dict[str, list[tuple[int, int]]] = {}
        for entry in os.listdir("/proc"):
            fields = proc_stat(int(entry)) if entry.isdigit() else None
            if fields is None or int(fields[1]) != self.proc.pid:
                continue
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            role = next((r for key, r in _ROLES if key in cmd), None)
            if role is None:
                continue
            port = re.findall(rf"{role}\.port=(\d+)", cmd)  # the launcher's own --set comes last
            found.setdefault(role, []).append((int(port[-1]) if port else 0, int(entry)))
        names = {"serve": self.proc.pid}
        for role, items in found.items():
            for i, (_, pid) in enumerate(sorted(items)):
                single = role == "master" or (role == "router" and len(items) == 1)
                names[role if single else f"{role}-{i}"] = pid
        return names

    def processes(self) -> dict[str, int]:
        return dict(self._children)

    def refresh(self) -> dict[str, int]:
        """processes() again: the launcher restarts a child that died under a new PID."""
        self._children = self._find_children()
        return dict(self._children)

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            try:
                os.kill(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=self.stop_timeout_s)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
            except ProcessLookupError:
                pass
        # NOTE: `pdorch serve` stops its children itself; this only catches what a killed serve left.
        deadline = time.monotonic() + 15
        left = [pid for name, pid in self._children.items() if name != "serve"]
        while time.monotonic() < deadline and any(pid_alive(p) for p in left):
            time.sleep(0.1)
        for pid in left:
            if pid_alive(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        self.proc = None
