"""LocalFleet: the local actuator. Prefill and decode worker processes on this machine, as many per
role as the planner asks for, found by the routers through etcd discovery (each registers itself
once ready: pdorch/worker/main.py).

    apply({"prefill": 2, "decode": 3})   records the target and returns at once (any thread)
    tick()                               on the owner's thread (pdorch serve's loop, every 0.2 s):
        reap       a worker that exited: a drained one is gone; one that died unasked is started
                   again (backoff 1, 2, ... 30 s while it keeps dying within a minute)
        kill       a draining worker past its drain budget (pdorch/worker/drain.py) + KILL_MARGIN_S
                   gets SIGKILL: only a drain that hangs is cut
        converge   fewer serving than the target: start one on free ports (device: the next slot);
                   more: SIGTERM the newest (its drain: leave discovery, finish or hand on its work,
                   write its L1 back, exit), counted as draining from then on
    current()                            per role, workers serving or starting (draining ones not)

NOTE: processes are started by tick() only, on one thread: a child asks for SIGTERM when the
thread that forked it ends (PR_SET_PDEATHSIG, pdorch/child_process.py), so a planner thread that
started workers itself would take them down with it when it stops.

Implements the planner's Actuator protocol (name, current, apply) structurally.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from pdorch.child_process import Child, stop_children
from pdorch.config import Config
from pdorch.launch_plan import ChildSpec, child_env, worker_devices, worker_spec
from pdorch.ports import free_port, port_answers
from pdorch.worker.drain import drain_budget_s

log = logging.getLogger(__name__)

ROLES = ("prefill", "decode")
KILL_MARGIN_S = 5.0  # past the drain budget: the drain hangs
STACK_DUMP_S = 0.3  # a hung worker writes its stacks (faulthandler, from C) before its SIGKILL
RESTART_BACKOFF_S = 1.0
RESTART_BACKOFF_MAX_S = 30.0
QUICK_DEATH_S = 60.0  # a worker that died sooner counts as one more failure in a row


@dataclasses.dataclass
class FleetWorker:
    role: str
    slot: int  # which device it took (worker_devices), free again once it exited
    spec: ChildSpec
    child: Child
    kill_at: float | None = None  # set when it was asked to drain

    @property
    def draining(self) -> bool:
        return self.kill_at is not None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.spec.ports[0][1]}"

    def ready(self) -> bool:
        return self.child.running() and all(port_answers(self.spec.host, p) for _, p in self.spec.ports)


class LocalFleet:
    name = "local"

    def __init__(self, cfg: Config, base: tuple[str, ...], log_dir: Path, torch_threads: int,
                 python: str = sys.executable, say: Callable[[str], None] | None = None):
        """`base`: the children's first arguments (launch_plan.child_base: config file and --set flags;
        discovery.mode must be etcd there, as the routers find the workers through it)."""
        if cfg.discovery.mode != "etcd":
            raise ValueError("the local fleet needs discovery.mode etcd: its workers come and go on free ports")
        self.cfg, self.base, self.log_dir = cfg, base, Path(log_dir)
        self.torch_threads, self.python = torch_threads, python
        self.say = say or log.info
        self.workers: list[FleetWorker] = []  # serving, starting and draining; exited ones are dropped
        self._lock = threading.Lock()
        self._desired = {role: 0 for role in ROLES}
        self._started = {role: 0 for role in ROLES}  # names role-0, role-1 ... never reused (log files)
        self._failures = {role: 0 for role in ROLES}
        self._start_after = {role: 0.0 for role in ROLES}

    # ------------------------------------------------------------------ the Actuator protocol
    def current(self) -> dict[str, int]:
        with self._lock:
            return {role: sum(1 for w in self.workers if w.role == role and not w.draining) for role in ROLES}

    def apply(self, desired: dict[str, int]) -> None:
        unknown = set(desired) - set(ROLES)
        if unknown or any(n < 0 for n in desired.values()):
            raise ValueError(f"desired replicas: roles {ROLES}, counts >= 0; got {desired}")
        with self._lock:
            self._desired.update(desired)

    # ------------------------------------------------------------------ the owner's thread
    def desired(self) -> dict[str, int]:
        with self._lock:
            return dict(self._desired)

    def tick(self) -> list[FleetWorker]:
        """Reap, kill hung drains, converge to the target; the workers that died unasked since the last tick."""
        now = time.monotonic()
        died = self._reap(now)
        for w in self.workers:
            if w.draining and now > w.kill_at and w.child.group_alive():
                self.say(f"pdorch serve: {w.spec.name} still draining past its budget; its threads' stacks go to "
                         f"its log (SIGUSR2), then SIGKILL")
                w.child.signal_group(signal.SIGUSR2)  # pdorch/worker/main.py: faulthandler writes every stack
                time.sleep(STACK_DUMP_S)
                w.child.signal_group(signal.SIGKILL)
                w.kill_at = float("inf")  # once
        desired = self.desired()
        for role in ROLES:
            serving = [w for w in self.workers if w.role == role and not w.draining]
            if len(serving) > desired[role]:
                for w in serving[desired[role]:][::-1]:  # the newest go first: the coldest caches
                    self._drain(w, now)
            elif len(serving) < desired[role] and now >= self._start_after[role]:
                self._start(role)
        return died

    def ready(self) -> bool:
        """Every serving worker answers on its ports, and as many as the target."""
        desired = self.desired()
        with self._lock:
            serving = [w for w in self.workers if not w.draining]
        return (all(w.ready() for w in serving)
                and all(sum(1 for w in serving if w.role == role) == desired[role] for role in ROLES))

    def settled(self) -> bool:
        """Ready and no worker draining."""
        return self.ready() and not any(w.draining for w in self.workers)

    def converge(self, timeout_s: float, until: Callable[[], bool] | None = None) -> None:
        """tick() until `until` (default: settled) holds; TimeoutError naming the workers otherwise."""
        until = until or self.settled
        deadline = time.monotonic() + timeout_s
        while True:
            self.tick()
            if until():
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"local fleet not converged within {timeout_s:.0f} s: target {self.desired()}, "
                                   f"workers {[(w.spec.name, 'draining' if w.draining else 'serving') for w in self.workers]}"
                                   f"; logs in {self.log_dir}")
            time.sleep(0.1)

    def stop(self, timeout_s: float) -> list[str]:
        """Stop every worker (SIGTERM: each drains; SIGKILL past timeout_s); the names SIGKILLed."""
        with self._lock:
            self._desired = {role: 0 for role in ROLES}
            workers, self.workers = list(self.workers), []
        return stop_children([w.child for w in workers], timeout_s)

    # ------------------------------------------------------------------ steps
    def _reap(self, now: float) -> list[FleetWorker]:
        died = []
        for w in [w for w in self.workers if w.child.exit_code() is not None and not w.child.group_alive()]:
            with self._lock:
                self.workers.remove(w)
            if w.draining:
                self.say(f"pdorch serve: {w.spec.name} drained and exited ({w.child.exit_code()})")
                continue
            quick = now - w.child.started_at < QUICK_DEATH_S
            self._failures[w.role] = self._failures[w.role] + 1 if quick else 1
            delay = min(RESTART_BACKOFF_MAX_S, RESTART_BACKOFF_S * 2 ** (self._failures[w.role] - 1))
            self._start_after[w.role] = now + delay
            self.say(f"pdorch serve: {w.spec.name} exited ({w.child.exit_code()}) unasked; another {w.role} "
                     f"worker starts in {delay:g} s. Last lines of {w.child.log_path}:\n"
                     + "\n".join(f"  | {line}" for line in w.child.log_tail(10).splitlines()))
            died.append(w)
        return died

    def _drain(self, w: FleetWorker, now: float) -> None:
        with self._lock:
            w.kill_at = now + drain_budget_s(self.cfg, w.role) + KILL_MARGIN_S
        w.child.signal_group(signal.SIGTERM)
        self.say(f"pdorch serve: scaling {w.role} down: {w.spec.name} (pid {w.child.pid}) drains")

    def _start(self, role: str) -> None:
        section = getattr(self.cfg, role)
        used = {w.slot for w in self.workers}
        slot = next(i for i in range(len(used) + 1) if i not in used)
        width = section.tp_size
        device = worker_devices(self.cfg, [width] * (slot + 1))[slot]
        name = f"{role}-{self._started[role]}"
        self._started[role] += 1
        metrics = free_port() if section.metrics_port else 0
        spec = worker_spec(self.cfg, role, name, free_port(), metrics, self.base, self.python,
                           self.torch_threads, device)
        env = child_env(dict(os.environ, PYTHONUNBUFFERED="1"), spec)
        # NOTE: BLAS/OpenMP pools ignore torch.set_num_threads at import; pin them too.
        env.update(OMP_NUM_THREADS=str(self.torch_threads), MKL_NUM_THREADS=str(self.torch_threads))
        child = Child(name, spec.argv, self.log_dir / f"{name}.log", env)
        child.start()  # OSError: the caller's (nothing was added)
        with self._lock:
            self.workers.append(FleetWorker(role, slot, spec, child))
        self.say(f"pdorch serve: scaling {role} up: {name} on :{spec.ports[0][1]} (pid {child.pid}, {device})")
