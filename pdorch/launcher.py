"""`pdorch serve`: run a whole local cluster (master, workers, router) as children, until stopped.

    prepare model -> check ports free -> [etcd] -> mooncake_master -> [store-memory] -> N prefill + M decode
    workers -> router
    -> wait for /health_generate -> print URL + curl -> watch children
    Ctrl-C / SIGTERM: stop all (SIGTERM, deadline, SIGKILL), exit 0.
    A child dies during start-up (or with --exit-on-failure): stop the rest, show its last log
    lines, exit 1.
    A child dies once the cluster is ready: restart it with exponential backoff (1 s, 2 s, ... up
    to 30 s; back to 1 s after it ran a minute), as Kubernetes restarts a pod's container; the
    router routes around it meanwhile and finds it again by its health checks.

A local etcd (pdorch/local_etcd.py) starts first when --masters N >= 2 or --autoscale needs one and
the config names none. With --autoscale the workers are a LocalFleet's (pdorch/local_fleet.py): it
starts them on free ports (etcd discovery), and `attach` gives a planner the fleet to drive once
the cluster is ready. The store's memory is then a store-memory node's (pdorch/store_memory.py),
started after the master(s): workers and routers are pure clients, so a removed worker takes no
page with it.

Every wait has a deadline and checks, each tick, for a stop signal and for dead children.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import TextIO

from pdorch.child_process import Child, stop_children
from pdorch.config import Config
from pdorch.config_loader import config_to_dict, load_config, parse_overrides
from pdorch.launch_plan import ChildSpec, LaunchPlan, PlanError, child_base, child_env, plan_local_cluster
from pdorch.local_etcd import LocalEtcd, etcd_needs
from pdorch.local_fleet import LocalFleet
from pdorch.master_cmd import etcd_unreachable, master_process
from pdorch.ports import free_port, port_answers
from pdorch.progress import Progress
from pdorch.serve_model import ServeError, chat_template_summary, curl_example, prepare_model_with_progress
from pdorch.serve_probes import PORT_LABELS, health_ok, masters_ready, port_in_use
from pdorch.store_memory import MEMORY_NODE_BINARY, memory_node_spec, memory_node_wanted

__all__ = ["LocalCluster", "ServeError", "ServeOptions", "chat_template_summary", "curl_example", "port_in_use",
           "prepare_model_with_progress"]

_TICK_S = 0.2
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class _Stopped(Exception):
    """A stop signal arrived."""


class _ChildDied(Exception):
    def __init__(self, child: Child):
        super().__init__(child.name)
        self.child = child


@dataclasses.dataclass(frozen=True)
class ServeOptions:
    num_prefill: int = 1
    num_decode: int = 1
    log_dir: str | None = None  # None: a new temp dir
    startup_timeout_s: float = 600.0
    stop_timeout_s: float = 10.0
    prepare: bool = True  # prepare the model first (progress shown) so workers find it cached
    restart: bool = True  # once ready, restart a dead child (False: stop everything, exit 1)
    restart_backoff_s: float = 1.0  # first restart delay; doubles per consecutive failure
    restart_backoff_max_s: float = 30.0
    restart_reset_s: float = 60.0  # a child that ran this long starts again from restart_backoff_s
    num_routers: int = 1  # router replicas (router.port + i), all routing to the same workers
    num_masters: int = 1  # mooncake_masters; > 1: HA mode (store.master_address etcd://), ports + i
    autoscale: bool = False  # workers in a LocalFleet (num_prefill/num_decode to start), a planner may attach


class LocalCluster:
    """The children of one `pdorch serve` run and the loop that watches them."""

    def __init__(self, cfg: Config, config_path: str, user_overrides: tuple[str, ...], opts: ServeOptions,
                 out: TextIO = sys.stdout, plan: LaunchPlan | None = None):
        """`plan`: run these children instead of planning them from `cfg` (tests)."""
        self.cfg, self.config_path, self.user_overrides = cfg, config_path, user_overrides
        self.opts, self.out = opts, out
        self.log_dir = Path(opts.log_dir or tempfile.mkdtemp(prefix="pdorch-serve-"))
        self.children: list[Child] = []
        self.plan = plan
        self._signal: int | None = None
        self._ready = False  # restarts only once the whole cluster has been ready
        self._failures: dict[str, int] = {}  # child name -> consecutive quick deaths
        self._restart_at: dict[str, float] = {}  # child name -> when to start it again
        self.fleet: LocalFleet | None = None  # --autoscale: the workers, made with the plan
        self._attached: list = []  # start(fleet) -> stop, called once ready (attach)
        self._detach: list = []  # the stops they returned, called first when serve stops

    def attach(self, start) -> None:
        """`start(fleet) -> stop` runs once the cluster is ready (--autoscale: a planner driving the
        fleet); the `stop` it returns (or None) runs first when serve stops."""
        self._attached.append(start)

    # ------------------------------------------------------------------ entry
    def run(self) -> int:
        """Start, wait for ready, watch until a signal (exit 0) or a child's death (exit 1)."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._say(f"pdorch serve: logs in {self.log_dir}")
        try:
            self.plan = self.plan or self._make_plan()
            self._check_ports_free(self.plan)  # before the (possibly long) model conversion: fail fast
            if self.opts.prepare:
                self._say(f"[0] model {self.cfg.model.source} (cache {self.cfg.model.cache_dir})")
                prepare_model_with_progress(self.cfg, self.out)
                self._say(f"[0] {chat_template_summary(self.cfg)}")
        except (ServeError, PlanError) as e:
            self._say(f"pdorch serve: {e}")
            return 2
        old = {s: signal.signal(s, self._on_signal) for s in _STOP_SIGNALS}
        try:
            return self._start_and_watch()
        except _Stopped:
            self._say(f"\npdorch serve: {signal.Signals(self._signal).name} received, stopping")
            return 0
        except _ChildDied as died:
            self._report_death(died.child)
            return 1
        except ServeError as e:
            self._say(f"pdorch serve: {e}")
            return 1
        finally:
            self._stop_all()
            for s, handler in old.items():
                signal.signal(s, handler)

    def _on_signal(self, signum, frame) -> None:
        self._signal = signum

    # ------------------------------------------------------------------ start-up
    def _make_plan(self) -> LaunchPlan:
        master_argv, master_argvs = None, ()
        if self.opts.num_masters < 1:
            raise ServeError(f"--masters must be >= 1, got {self.opts.num_masters}")
        etcd = self._local_etcd()
        memory = memory_node_wanted(self.cfg, self.opts.autoscale)
        if memory:  # every other store client is a pure one: no page on a worker that may leave
            self._override(("store.global_segment_size_mb=0",))
        if self.opts.num_masters > 1:
            from store_client.addresses import parse_master_address
            if not parse_master_address(self.cfg.store.master_address).ha:
                raise ServeError(f"--masters {self.opts.num_masters}: several masters run in HA mode only; set "
                                 "store.master_address=etcd://host:port (an etcd they elect their leader in) and "
                                 f"store.metadata_server=etcd://host:port, got {self.cfg.store.master_address!r}")
        if self.cfg.store.enabled:
            err = None if etcd else etcd_unreachable(self.cfg)  # HA masters would wait until the start-up timeout
            if err:
                raise ServeError(err)
            from store_client.master import MasterError  # NOTE: lazy, only serve needs it
            try:  # the same flags as `pdorch master` and the chart's master pod; HA: master-i on ports + i
                argvs = tuple(tuple(master_process(self.cfg, log_dir=str(self.log_dir), index=i).command())
                              for i in range(self.opts.num_masters))
            except MasterError as e:
                raise ServeError(str(e)) from None
            master_argv = argvs[0]
            if len(argvs) > 1:  # masters in HA mode (launch_plan)
                master_argvs = argvs
            if memory:
                from store_client.master import find_mooncake_binary
                try:
                    memory = memory_node_spec(self.cfg, find_mooncake_binary(MEMORY_NODE_BINARY), free_port())
                except MasterError as e:
                    raise ServeError(f"{e} (the store-memory node of --autoscale; store.memory_node_segment_mb=0 "
                                     "runs without it)") from None
        elif self.opts.num_masters > 1:
            raise ServeError("--masters: store.enabled is false; there is no store to run masters for")
        plan = plan_local_cluster(self.cfg, self.opts.num_prefill, self.opts.num_decode, self.config_path,
                                  self.user_overrides, master_argv=master_argv, num_routers=self.opts.num_routers,
                                  master_argvs=master_argvs, etcd=etcd.spec() if etcd else None)
        if memory:  # after the master(s), before the workers (_stages)
            plan = dataclasses.replace(plan, children=plan.children + (memory,))
        if not self.opts.autoscale:
            return plan
        # The fleet starts the workers (free ports, etcd discovery); the plan keeps the others.
        self.fleet = LocalFleet(self.cfg, child_base(self.config_path, self.user_overrides), self.log_dir,
                                plan.torch_threads, say=self._say)
        return dataclasses.replace(plan, children=tuple(c for c in plan.children
                                                        if c.role not in ("prefill", "decode")))

    def _local_etcd(self) -> LocalEtcd | None:
        """A local etcd when the cluster needs one the config does not name; the children (and this
        process) are pointed at it with `--set` flags. ServeError when a named one does not answer."""
        needs = etcd_needs(self.cfg, self.opts.num_masters, self.opts.autoscale)
        if self.opts.autoscale and not needs.discovery:
            from store_client.connector import reachable
            endpoints = [tuple(e.rsplit(":", 1)) for e in self.cfg.discovery.etcd_endpoints]
            err = reachable([(h, int(p)) for h, p in endpoints], 2.0)
            if err:
                raise ServeError(f"discovery.etcd_endpoints: no endpoint answers ({err})")
        if not needs.any:
            return None
        etcd = LocalEtcd.on_free_ports(str(self.log_dir / "etcd-data"))
        self._override(etcd.overrides(needs))
        return etcd

    def _override(self, sets: tuple[str, ...]) -> None:
        """`--set` flags of the launcher's own, for this process's config and every child's (last: they win)."""
        self.user_overrides = self.user_overrides + sets
        values = {f"{section}.{key}": value for section, keys in config_to_dict(self.cfg).items()
                  for key, value in keys.items()}
        self.cfg = load_config(None, {**values, **parse_overrides(list(sets))}, environ={})

    def _check_ports_free(self, plan: LaunchPlan) -> None:
        taken = [f"{port} ({key} of {c.name})" for c in plan.children for key, port in c.ports
                 if port_in_use(c.host, port)]
        if taken:
            raise PlanError("ports already in use: " + ", ".join(taken) + "; is another pdorch serve "
                            "running? Stop it, or move the ports with --set section.key=...")

    def _start_and_watch(self) -> int:
        plan, t0 = self.plan, time.monotonic()
        deadline = t0 + self.opts.startup_timeout_s
        for step, (role, specs) in enumerate(self._stages(plan), 1):
            started = time.monotonic()
            if role == "fleet":
                self._start_fleet(step, deadline)
                continue
            for spec in specs:
                self._spawn(spec, plan.torch_threads)
            pids = {c.name: c.pid for c in self.children}
            if role == "etcd":
                what = f"etcd {specs[0].host}:{specs[0].ports[0][1]}"
            elif role == "master":
                what = "mooncake_master " + "; ".join(
                    (f"{s.name} " if len(specs) > 1 else "") + ", ".join(f"{PORT_LABELS[k]} :{p}" for k, p in s.ports)
                    for s in specs)
            elif role == "store-memory":
                what = f"store-memory node :{specs[0].ports[0][1]} ({self.cfg.store.memory_node_segment_mb} MiB)"
            elif role == "router":
                what = "router " + ", ".join(plan.router_urls)
            else:
                what = "workers " + ", ".join(f"{s.name} :{s.ports[0][1]}" for s in specs)
            if role == "router":
                self._wait(f"[{step}] {what}: waiting for /health_generate", deadline,
                           lambda: all(health_ok(u + "/health_generate", 30.0) for u in plan.router_urls))
            elif role == "master":
                self._wait(f"[{step}] {what}: starting", deadline, lambda specs=specs: masters_ready(specs))
            elif role in ("etcd", "store-memory"):
                self._wait(f"[{step}] {what}: starting", deadline,
                           lambda spec=specs[0]: port_answers(spec.host, spec.ports[0][1]))
            else:
                self._wait(f"[{step}] {what}: loading the model", deadline,
                           lambda specs=specs: all(port_answers(s.host, p) for s in specs for _, p in s.ports))
            pid_list = ", ".join(f"{s.name} {pids[s.name]}" for s in specs)
            self._say(f"[{step}] {what}: ready in {time.monotonic() - started:.1f} s (pid {pid_list})")
        self._announce_ready(time.monotonic() - t0)
        self._ready = True
        for start in self._attached:
            self._detach.append(start(self.fleet))
        while True:
            self._tick()
            time.sleep(_TICK_S)

    def _stages(self, plan: LaunchPlan):
        stages = [("etcd", plan.by_role("etcd")), ("master", plan.by_role("master")),
                  ("store-memory", plan.by_role("store-memory")),
                  ("workers", plan.by_role("prefill") + plan.by_role("decode")),
                  ("fleet", [None] if self.fleet else []), ("router", plan.by_role("router"))]
        return [(role, specs) for role, specs in stages if specs]

    def _start_fleet(self, step: int, deadline: float) -> None:
        started = time.monotonic()
        self.fleet.apply({"prefill": self.opts.num_prefill, "decode": self.opts.num_decode})
        self._wait(f"[{step}] fleet of {self.opts.num_prefill} prefill + {self.opts.num_decode} decode workers: "
                   "loading the model", deadline, self.fleet.ready)
        self._say(f"[{step}] fleet ready in {time.monotonic() - started:.1f} s: "
                  + ", ".join(f"{w.spec.name} :{w.spec.ports[0][1]} (pid {w.child.pid})" for w in self.fleet.workers))

    def _spawn(self, spec: ChildSpec, torch_threads: int) -> None:
        env = child_env(dict(os.environ, PYTHONUNBUFFERED="1"), spec)  # secrets only where they are used
        if spec.role in ("prefill", "decode"):
            # NOTE: BLAS/OpenMP pools ignore torch.set_num_threads at import; pin them too.
            env.update(OMP_NUM_THREADS=str(torch_threads), MKL_NUM_THREADS=str(torch_threads))
        child = Child(spec.name, spec.argv, self.log_dir / f"{spec.name}.log", env)
        try:
            child.start()
        except OSError as e:
            raise ServeError(f"cannot start {spec.name} ({spec.argv[0]}): {e}") from None
        self.children.append(child)

    def _wait(self, what: str, deadline: float, ready) -> None:
        progress = Progress(self.out, what)
        try:
            while True:
                self._tick()
                if ready():
                    return
                if time.monotonic() > deadline:
                    raise ServeError(f"not ready within {self.opts.startup_timeout_s:.0f} s ({what}); "
                                     f"see the logs in {self.log_dir}")
                progress.update()
                time.sleep(_TICK_S)
        finally:
            progress.close()

    def _tick(self) -> None:
        if self._signal is not None:
            raise _Stopped()
        if self.fleet is not None:
            died = self.fleet.tick()  # it starts another in their place (with backoff)
            if died and not (self._ready and self.opts.restart):
                raise _ChildDied(died[0].child)
        for child in self.children:
            if child.exit_code() is not None:
                if not (self._ready and self.opts.restart):
                    raise _ChildDied(child)
                self._supervise(child)

    def _supervise(self, child: Child) -> None:
        """A dead child after start-up: schedule its restart with backoff, or restart it when due."""
        now = time.monotonic()
        due = self._restart_at.get(child.name)
        if due is None:
            quick = now - child.started_at < self.opts.restart_reset_s
            failures = self._failures.get(child.name, 0) + 1 if quick else 1
            self._failures[child.name] = failures
            delay = min(self.opts.restart_backoff_max_s, self.opts.restart_backoff_s * 2 ** (failures - 1))
            self._restart_at[child.name] = now + delay
            self._say(f"\npdorch serve: {child.name} (pid {child.pid}) {_how_it_ended(child)}; restarting it "
                      f"in {delay:g} s (failure {failures} in a row). Last lines of {child.log_path}:")
            for line in child.log_tail(10).splitlines():
                self._say(f"  | {line}")
            return
        if now < due:
            return
        del self._restart_at[child.name]
        child.signal_group(signal.SIGKILL)  # what the dead child left in its group
        try:
            child.start()
        except OSError as e:  # counted as another quick failure by the next tick
            child.started_at = time.monotonic()
            self._say(f"pdorch serve: cannot restart {child.name}: {e}")
            return
        self._say(f"pdorch serve: {child.name} restarted (pid {child.pid}, start {child.starts})")

    # ------------------------------------------------------------------ reporting and stop
    def _announce_ready(self, elapsed_s: float) -> None:
        plan, cfg = self.plan, self.cfg
        store = "store on" if cfg.store.enabled else "store off"
        devices = ", ".join(f"{c.name} {d}" for c, d in zip(plan.by_role("prefill") + plan.by_role("decode"),
                                                             plan.devices))
        more = f"; {len(plan.router_urls)} router replicas: {' '.join(plan.router_urls)}" \
            if len(plan.router_urls) > 1 else ""
        self._say(f"\npdorch is ready at {plan.router_url} ({self.opts.num_prefill} prefill + "
                  f"{self.opts.num_decode} decode, {store}, {plan.torch_threads} torch thread(s) per worker{more}; "
                  f"devices: {devices}; "
                  f"started in {elapsed_s:.1f} s)\n\nTry it:\n"
                  f"{curl_example(plan.router_url, cfg.model.served_name, bool(cfg.router.api_key))}\n\n"
                  f"Workers and cache hit rates: pdorch status --url {plan.router_url}\n"
                  f"Logs: {self.log_dir}\nPress Ctrl-C to stop.")

    def _report_death(self, child: Child) -> None:
        self._say(f"\npdorch serve: {child.name} (pid {child.pid}) {_how_it_ended(child)}; stopping the others. "
                  f"Last lines of {child.log_path}:")
        for line in child.log_tail(20).splitlines():
            self._say(f"  | {line}")

    def _stop_all(self) -> None:
        for stop in self._detach:  # the planner first: nothing scales while the cluster stops
            if stop is not None:
                stop()
        if not self.children:
            return
        # Router first (stop taking requests), then the workers, then the master last.
        # NOTE: in stages, not all at once: a worker's shutdown still talks to the master
        # (unmounting its store segment) and hangs until SIGKILL when the master is gone first.
        # etcd after the master (it leads through it) and the workers (they leave discovery through it).
        router = [c for c in self.children if c.name.partition("-")[0] == "router"]
        master = [c for c in self.children if c.name.partition("-")[0] == "master"]
        etcd = [c for c in self.children if c.name == "etcd"]
        memory = [c for c in self.children if c.name == "store-memory"]  # after the workers: it holds their pages
        workers = [c for c in self.children if c not in router + master + etcd + memory]
        killed, fleet = [], len(self.fleet.workers) if self.fleet else 0
        for stage in (router, workers, memory, master, etcd):
            if stage is workers and self.fleet is not None:
                killed += self.fleet.stop(self.opts.stop_timeout_s)
            killed += stop_children(stage, self.opts.stop_timeout_s) if stage else []
        note = f" ({', '.join(killed)} needed SIGKILL)" if killed else ""
        self._say(f"pdorch serve: stopped {len(self.children) + fleet} processes{note}; logs in {self.log_dir}")

    def _say(self, text: str) -> None:
        print(text, file=self.out, flush=True)


def _how_it_ended(child: Child) -> str:
    code = child.exit_code()
    if code is not None and code < 0:
        return f"was killed by {signal.Signals(-code).name}"
    return f"exited with {code}"
