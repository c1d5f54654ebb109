"""What `pdorch serve` starts: every child's command line and ports, decided before anything runs.

Pure (no processes, no sockets), so the port and argument arithmetic is unit-tested on its own.

Ports of N prefill and M decode workers on loopback (worker i = base + i):

    prefill-0  prefill.port + 0   metrics prefill.metrics_port + 0   (metrics 0 = disabled stays 0)
    prefill-1  prefill.port + 1   ...
    decode-0   decode.port + 0    metrics decode.metrics_port + 0

Devices: with `model.local_devices` each worker takes the next one of that list in turn; else with
`model.device: cuda` (no index) worker k takes visible GPU k (round-robin when there are fewer GPUs
than workers); else every worker gets model.device as it is (cpu, or one pinned cuda:N). A worker at
tp_size N takes N GPUs: its model.device is the first, its ranks r take the next ones (cuda:i + r),
so the next worker starts N GPUs further.

Children get the user's config file (or the embedded default) plus the user's `--set` flags, then
the launcher's own `--set` flags (ports, static discovery lists, torch threads) last, because
the last `--set` wins and flags beat PDORCH_* env vars, which children inherit.

Secrets (`SECRET_KEYS`) never go on a command line: any local user reads argv in `ps`, and the
launcher logs every child's command line. A secret given with `--set` is left out of every argv;
its effective value reaches only the roles that use it, through its env var (`ChildSpec.env`),
and the launcher strips the secrets' env vars from every other child's environment.
NOTE: the effective config is not written to disk: it may hold API keys.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from urllib.parse import urlsplit

from pdorch.config import Config
from pdorch.config_loader import env_var

# "section.key" of every secret -> the roles that use it. A new secret key belongs here.
SECRET_KEYS: dict[str, tuple[str, ...]] = {
    "router.api_key": ("router",),
    "router.admin_key": ("router",),
    "router.previous_api_key": ("router",),
    "grpc.token": ("router", "prefill", "decode"),
    "grpc.previous_token": ("router", "prefill", "decode"),
}
SECRET_ENV_VARS = frozenset(env_var(*key.split(".", 1)) for key in SECRET_KEYS)
REDACTED = "<redacted>"


class PlanError(ValueError):
    """The configuration cannot be launched locally (e.g. two children on one port)."""


@dataclasses.dataclass(frozen=True)
class ChildSpec:
    name: str  # "etcd", "master" (or "master-0".. with --masters N), "prefill-0", "decode-1", "router"
    role: str  # "etcd" | "master" | "prefill" | "decode" | "router"
    argv: tuple[str, ...]
    host: str  # where its ports listen
    ports: tuple[tuple[str, int], ...]  # (config key, port) it listens on; ports[0] answers when ready
    # extra environment (the secrets this role uses); repr=False keeps them out of logs and tracebacks
    env: tuple[tuple[str, str], ...] = dataclasses.field(default=(), repr=False)


@dataclasses.dataclass(frozen=True)
class LaunchPlan:
    config: Config  # the effective config as the router sees it (ports and discovery filled in)
    children: tuple[ChildSpec, ...]  # in start order: etcd (when local), master, prefill-*, decode-*, router
    torch_threads: int
    router_url: str  # the first router's (with --routers N: router_urls[0])
    devices: tuple[str, ...] = ()  # each worker's model.device, prefill-0.. then decode-0..
    router_urls: tuple[str, ...] = ()  # every router replica's, in order (router.port + i)

    def by_role(self, role: str) -> list[ChildSpec]:
        return [c for c in self.children if c.role == role]


def split_host_port(address: str, key: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise PlanError(f"{key}: expected host:port, got {address!r}")
    return host.strip("[]"), int(port)


def _advertised(host: str) -> str:
    """The address peers dial for a listen host (a wildcard listen is reached over loopback)."""
    return "127.0.0.1" if host in ("0.0.0.0", "", "::") else host


def torch_threads_per_worker(cfg: Config, num_workers: int, cpu_count: int | None = None) -> int:
    """model.torch_threads, or (0) the machine's cores divided among the local workers, at least 1."""
    if cfg.model.torch_threads > 0:
        return cfg.model.torch_threads
    if cpu_count is None:
        cpu_count = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, cpu_count // max(1, num_workers))


def visible_gpu_count() -> int:
    """GPUs this process may use (torch only asked when model.device is plain cuda)."""
    import torch

    return torch.cuda.device_count() if torch.version.cuda else 0


def worker_devices(cfg: Config, widths: list[int], gpu_count: int | None = None) -> list[str]:
    """model.device of each local worker, in start order, worker k taking widths[k] devices (its TP
    ranks; see the module docstring)."""
    m = cfg.model
    starts = [sum(widths[:k]) for k in range(len(widths))]
    if m.local_devices:
        return [m.local_devices[i % len(m.local_devices)] for i in starts]
    if m.device != "cuda":
        return [m.device] * len(widths)
    count = visible_gpu_count() if gpu_count is None else gpu_count
    if count < 1:  # the workers' start-up check names what is missing
        return [m.device] * len(widths)
    return [f"cuda:{i % count}" for i in starts]


def plan_local_cluster(cfg: Config, num_prefill: int, num_decode: int, config_path: str,
                       user_overrides: tuple[str, ...] = (), python: str = sys.executable,
                       master_argv: tuple[str, ...] | None = None,
                       cpu_count: int | None = None, gpu_count: int | None = None,
                       num_routers: int = 1, master_argvs: tuple[tuple[str, ...], ...] = (),
                       etcd: ChildSpec | None = None) -> LaunchPlan:
    """Children for `pdorch serve`. `master_argv` is the mooncake_master command for the store's
    ports (None: store disabled or the caller builds it later); raises PlanError.
    `master_argvs` (two or more): masters in HA mode, master-i on store.master_rpc_port + i and
    store.master_metrics_port + i (master_ports(cfg, i)), one command each.
    `num_routers` > 1: router replicas on router.port + i (and router.metrics_port + i), named
    router-0.., all routing to the same workers (each keeps its own index from the workers' KV events).
    `etcd`: a local etcd (pdorch/local_etcd.py), the first child."""
    if num_prefill < 1 or num_decode < 1:
        raise PlanError(f"--prefill and --decode must be >= 1, got {num_prefill} and {num_decode}")
    if num_routers < 1:
        raise PlanError(f"--routers must be >= 1, got {num_routers}")
    threads = torch_threads_per_worker(cfg, num_prefill + num_decode, cpu_count)
    widths = [cfg.prefill.tp_size] * num_prefill + [cfg.decode.tp_size] * num_decode
    devices = iter(worker_devices(cfg, widths, gpu_count))
    base = child_base(config_path, user_overrides)
    children: list[ChildSpec] = [etcd] if etcd is not None else []
    if cfg.store.enabled and len(master_argvs) > 1:
        children += [_master_spec(cfg, argv, i) for i, argv in enumerate(master_argvs)]
    elif cfg.store.enabled:
        children.append(_master_spec(cfg, master_argv))
    addresses: dict[str, list[str]] = {}
    for role, section, count in (("prefill", cfg.prefill, num_prefill), ("decode", cfg.decode, num_decode)):
        workers = [_numbered_worker(cfg, role, section, i, base, python, threads, next(devices)) for i in range(count)]
        children += workers
        addresses[role] = [f"{_advertised(section.host)}:{w.ports[0][1]}" for w in workers]
    discovery = cfg.discovery
    router_sets: list[str] = []
    if discovery.mode == "static":  # etcd: the workers register themselves
        discovery = dataclasses.replace(discovery, prefill=tuple(addresses["prefill"]),
                                        decode=tuple(addresses["decode"]))
        router_sets = [f"discovery.prefill={','.join(discovery.prefill)}",
                       f"discovery.decode={','.join(discovery.decode)}"]
    urls = []
    for i in range(num_routers):
        port, metrics = cfg.router.port + i, cfg.router.metrics_port + i if cfg.router.metrics_port else 0
        if max(port, metrics) > 65535:
            raise PlanError(f"router.port: router-{i} would need port {max(port, metrics)}; choose a lower base port")
        sets = router_sets + ([f"router.port={port}", f"router.metrics_port={metrics}"] if num_routers > 1 else [])
        router_argv = (python, "-m", "router") + base + tuple(a for s in sets for a in ("--set", s))
        name = "router" if num_routers == 1 else f"router-{i}"
        ports = (("router.port", port),) + ((("router.metrics_port", metrics),) if metrics and num_routers > 1 else ())
        children.append(ChildSpec(name, "router", router_argv, cfg.router.host, ports, secret_env(cfg, "router")))
        urls.append(f"http://{_advertised(cfg.router.host)}:{port}")
    _check_distinct_ports(children)
    effective = dataclasses.replace(cfg, discovery=discovery)
    placed = tuple(s.partition("=")[2] for c in children for s in c.argv if s.startswith("model.device="))
    return LaunchPlan(effective, tuple(children), threads, urls[0], placed, tuple(urls))


def child_base(config_path: str, user_overrides: tuple[str, ...]) -> tuple[str, ...]:
    """Every child's first arguments: the config file and the user's `--set` flags, secrets left out."""
    public = tuple(o for o in user_overrides if _override_key(o) not in SECRET_KEYS)
    return ("--config", config_path) + tuple(a for o in public for a in ("--set", o))


def _numbered_worker(cfg: Config, role: str, section, i: int, base: tuple[str, ...], python: str, threads: int,
                     device: str) -> ChildSpec:
    """Worker i of `role` as `pdorch serve --prefill N --decode M` places it: section.port + i, metrics + i."""
    port = section.port + i
    metrics = section.metrics_port + i if section.metrics_port else 0
    for p, key in ((port, f"{role}.port"), (metrics, f"{role}.metrics_port")):
        if p > 65535:
            raise PlanError(f"{key}: {role}-{i} would need port {p}; choose a lower base port")
    return worker_spec(cfg, role, f"{role}-{i}", port, metrics, base, python, threads, device)


def worker_spec(cfg: Config, role: str, name: str, port: int, metrics_port: int, base: tuple[str, ...],
                python: str, threads: int, device: str) -> ChildSpec:
    """One worker child: its ports (metrics 0 = none), threads and device as the launcher's own `--set`
    flags, after `base` (child_base). The local fleet (pdorch/local_fleet.py) starts its workers with it."""
    section = getattr(cfg, role)
    sets = [f"{role}.port={port}", f"{role}.metrics_port={metrics_port}", f"model.torch_threads={threads}",
            f"model.device={device}"]
    argv = (python, "-m", f"{role}_node") + base + tuple(a for s in sets for a in ("--set", s))
    ports = ((f"{role}.port", port),) + (((f"{role}.metrics_port", metrics_port),) if metrics_port else ())
    return ChildSpec(name, role, argv, section.host, ports, secret_env(cfg, role))


def _override_key(override: str) -> str:
    """"router.api_key=x" -> "router.api_key" (as config_loader.parse_overrides reads it)."""
    return override.partition("=")[0].strip()


def secret_env(cfg: Config, role: str) -> tuple[tuple[str, str], ...]:
    """(env var, effective value) of each secret `role` uses and the config sets."""
    out = []
    for key, roles in SECRET_KEYS.items():
        section, _, name = key.partition(".")
        value = getattr(getattr(cfg, section), name)
        if role in roles and value:
            out.append((env_var(section, name), value))
    return tuple(out)


def child_env(base: dict[str, str], spec: ChildSpec) -> dict[str, str]:
    """`base` (the launcher's environment) without any secret, plus the secrets `spec` uses."""
    env = {k: v for k, v in base.items() if k not in SECRET_ENV_VARS}
    env.update(spec.env)
    return env


def redact_argv(argv) -> list[str]:
    """argv as it may be logged: the value of any secret `section.key=value` replaced."""
    out = []
    for arg in argv:
        prefix = "--set=" if arg.startswith("--set=") else ""
        item = arg[len(prefix):]
        key = _override_key(item)
        out.append(f"{prefix}{key}={REDACTED}" if "=" in item and key in SECRET_KEYS else arg)
    return out


def master_ports(cfg: Config, index: int = 0) -> tuple[str, int, int, int]:
    """(host, rpc port, metadata port, metrics port) of the local mooncake_master from `store.*`.
    Masters in HA mode (store.master_address etcd://...): this host's RPC port is
    store.master_rpc_port and the transfer engine's metadata is in etcd (no metadata server: 0);
    master `index` of several on one host (pdorch serve --masters N) takes both ports + index."""
    from store_client.addresses import parse_master_address

    s = cfg.store
    if parse_master_address(s.master_address).ha:
        if not s.metadata_server.startswith("etcd://"):
            raise PlanError("store.metadata_server: masters in HA mode (store.master_address etcd://...) run no "
                            "metadata server, so expected etcd://host:port (the transfer engine's metadata in "
                            f"etcd), got {s.metadata_server!r}")
        return s.local_hostname, s.master_rpc_port + index, 0, s.master_metrics_port + index
    if index:
        raise PlanError(f"--masters: several masters run in HA mode only; set store.master_address to "
                        f"etcd://host:port (their etcd), got {s.master_address!r}")
    host, rpc = split_host_port(cfg.store.master_address, "store.master_address")
    url = urlsplit(cfg.store.metadata_server)
    if url.scheme != "http" or url.port is None:
        raise PlanError("store.metadata_server: pdorch serve runs the master's HTTP metadata server, so "
                        f"expected http://host:port/metadata, got {cfg.store.metadata_server!r}")
    return host, rpc, url.port, cfg.store.master_metrics_port


def _master_spec(cfg: Config, master_argv: tuple[str, ...] | None, index: int | None = None) -> ChildSpec:
    """The master, or master-`index` of several in HA mode. NOTE: in HA mode the metrics port comes
    first (what the launcher waits for): a standby opens no RPC port until it leads."""
    host, rpc, metadata, metrics = master_ports(cfg, index or 0)
    ha = metadata == 0
    ports = ((("store.master_metrics_port", metrics), ("store.master_rpc_port", rpc)) if ha else
             (("store.master_address", rpc), ("store.metadata_server", metadata), ("store.master_metrics_port", metrics)))
    name = "master" if index is None else f"master-{index}"
    return ChildSpec(name, "master", tuple(master_argv or ()), host, ports)


def _check_distinct_ports(children: list[ChildSpec]) -> None:
    seen: dict[int, str] = {}
    for child in children:
        for key, port in child.ports:
            if port in seen:
                raise PlanError(f"{key}: port {port} of {child.name} is also {seen[port]}; "
                                "set the base ports further apart (--set section.port=...)")
            seen[port] = f"{key} of " + child.name
