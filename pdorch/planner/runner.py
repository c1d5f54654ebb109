"""PlannerRunner: observe -> predict -> decide -> act, every planner.interval_s, on a thread it owns.

    runner = PlannerRunner.from_config(cfg, actuator)        # router URLs from the config (or given)
    runner.start(); ...; runner.stop(timeout_s=5)

`step()` runs one round and returns its `Decision`; in planner.mode dry-run the actuator is asked what runs but
never told to change it. Each decision is logged as one line: "planner decision {json}" with its inputs (the
observed and predicted load, the capacities, current and desired replicas) and each role's reason.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry

from pdorch.planner.actuator import Actuator
from pdorch.planner.decide import Decider, Decision, SizingParams
from pdorch.planner.http_server import start_server
from pdorch.planner.load import Load
from pdorch.planner.observation import Observation
from pdorch.planner.observe import MetricsObserver
from pdorch.planner.planner_metrics import PlannerMetrics
from pdorch.planner.predictor import Predictor
from pdorch.planner.profile import Profile, load_profile
from pdorch.planner.upper_bound import predictor_from_config

log = logging.getLogger("pdorch.planner")


class PlannerRunner:
    def __init__(self, cfg, observer, predictor: Predictor, actuator: Actuator, profile: Profile,
                 registry: CollectorRegistry | None = None, clock: Callable[[], float] = time.time):
        self.cfg = cfg
        self.observer = observer
        self.predictor = predictor
        self.actuator = actuator
        self.params = SizingParams.from_config(cfg)
        self.decider = Decider(profile, self.params)
        self.registry = registry if registry is not None else CollectorRegistry()
        self.metrics = PlannerMetrics(self.registry, cfg.planner.attainment_window)
        self._clock = clock
        self._last_load: Load | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._server = None
        self.last_decision: Decision | None = None
        self._status: dict = {"mode": cfg.planner.mode, "actuator": actuator.name,
                              "interval_s": cfg.planner.interval_s, "last_decision_at": None, "roles": {}}

    @classmethod
    def from_config(cls, cfg, actuator: Actuator, router_urls: list[str] | None = None,
                    profile: Profile | None = None, registry: CollectorRegistry | None = None) -> PlannerRunner:
        """The runner a config describes: planner.router_urls (else `router_urls`, else the config's router),
        planner.worker_metrics_urls, the profile at planner.profile_path (else `profile`)."""
        p = cfg.planner
        if profile is None:
            if not p.profile_path:
                raise ValueError("planner.profile_path is empty: profile the workers with `pdorch bench profile` "
                                 "and set planner.profile_path to the file it wrote")
            profile = load_profile(p.profile_path)
        urls = list(p.router_urls) or list(router_urls or []) or [_router_url(cfg)]
        observer = MetricsObserver(urls, list(p.worker_metrics_urls), p.scrape_timeout_s, cfg.router.admin_key)
        return cls(cfg, observer, predictor_from_config(cfg), actuator, profile, registry)

    def step(self) -> Decision:
        observed = self.observer.observe()
        if observed is not None:
            self.predictor.observe(self._load_of(observed))
        load = self.predictor.predict()
        current = self.actuator.current()
        decision = self.decider.decide(load, current, self._clock(), self._missed(observed))
        acted = self.cfg.planner.mode == "act" and decision.desired != current
        if acted:
            self.actuator.apply(decision.desired)
        slos = {"ttft": self.params.ttft_p90_s, "itl": self.params.itl_p90_s}
        met = self.metrics.record(decision, current, observed, slos, self.params.max_replicas)
        log.info("planner decision %s", json.dumps(self._fields(decision, current, observed, met, acted)))
        self.last_decision = decision
        self._status = self._status_of(decision, current, acted)
        return decision

    def status(self) -> dict:
        """What /status serves: the last decision per role, when, and the SLO attainment (`pdorch status`)."""
        return self._status

    def _status_of(self, d: Decision, current: dict[str, int], acted: bool) -> dict:
        p = self.cfg.planner
        return {"mode": p.mode, "actuator": self.actuator.name, "interval_s": p.interval_s,
                "last_decision_at": d.at, "acted": acted,
                "roles": {r: {"current": current[r], "desired": rd.desired, "action": rd.action,
                              "reason": rd.reason, "min": self.params.min_replicas[r],
                              "max": self.params.max_replicas[r], "short_at_max": rd.short_at_max}
                          for r, rd in d.roles.items()},
                "slo_p90_s": {"ttft": self.params.ttft_p90_s, "itl": self.params.itl_p90_s},
                "slo_attainment": self.metrics.attainment_now()}

    def start(self) -> None:
        """The loop on its own thread, and /metrics and /status on planner.metrics_port (0: none)."""
        if self._thread is not None:
            raise RuntimeError("planner already started")
        if self.cfg.planner.metrics_port:
            self._server = start_server(self.cfg.planner.metrics_port, self.registry, self.status)
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="planner", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> bool:
        """Stop the loop (after its current step) and /metrics; False when the thread did not end in time."""
        self._stop.set()
        ended = True
        if self._thread is not None:
            self._thread.join(timeout_s)
            ended = not self._thread.is_alive()
            self._thread = None
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        return ended

    def _loop(self) -> None:
        interval = self.cfg.planner.interval_s
        while not self._stop.wait(interval):
            try:
                self.step()
            except Exception:  # an API server or a scrape that fails must not end the planner
                log.exception("planner: step failed; trying again in %.0fs", interval)

    def _missed(self, observed: Observation | None) -> dict[str, float]:
        """role -> observed p90 for the roles whose SLO the last interval missed (prefill: TTFT, decode: ITL)."""
        if observed is None:
            return {}
        out = {}
        if observed.ttft_p90_s is not None and observed.ttft_p90_s > self.params.ttft_p90_s:
            out["prefill"] = observed.ttft_p90_s
        if observed.itl_p90_s is not None and observed.itl_p90_s > self.params.itl_p90_s:
            out["decode"] = observed.itl_p90_s
        return out

    def _load_of(self, observed: Observation) -> Load:
        """The interval's load; an interval without requests keeps the last per-request means (rate 0)."""
        if observed.requests > 0 or self._last_load is None:
            self._last_load = observed.load()
            return self._last_load
        last = self._last_load
        return Load(0.0, last.mean_prompt_tokens, last.uncached_fraction, last.mean_output_tokens)

    def _fields(self, d: Decision, current: dict[str, int], observed: Observation | None, met: dict[str, bool],
                acted: bool) -> dict:
        out: dict = {"mode": self.cfg.planner.mode, "actuator": self.actuator.name, "acted": acted,
                     "current": current, "desired": d.desired,
                     "actions": {r: rd.action for r, rd in d.roles.items()}, "reason": d.reason,
                     "slo_met": met}
        if d.load is not None:
            out["predicted"] = {k: round(v, 4) for k, v in vars(d.load).items()}
        if d.sizing is not None:
            out["prefill_tokens_per_s_needed"] = round(d.sizing.prefill_demand, 2)
            out["prefill_tokens_per_s_per_replica"] = round(d.sizing.prefill.tokens_per_s, 2)
            out["decode_streams_needed"] = round(d.sizing.decode_demand, 3)
            out["decode_streams_per_replica"] = d.sizing.decode.streams
        if observed is not None:
            out["observed"] = observed.fields()
        return out


def _router_url(cfg) -> str:
    host = "127.0.0.1" if cfg.router.host in ("0.0.0.0", "") else cfg.router.host
    return f"http://{host}:{cfg.router.port}"
