"""actuator kubernetes: the prefill and decode Deployments' replicas through their scale subresource.

Uses the official `kubernetes` client: `AppsV1Api.read_namespaced_deployment_scale` for `current()` (the scale's
spec.replicas: what the Deployment is converging to; pods terminating after a scale-down are not counted) and
`patch_namespaced_deployment_scale` for `apply` (a merge patch of spec.replicas, only for a role whose count
differs). Credentials: the pod's service account (in-cluster), else the kubeconfig. The Role this needs: get and
patch on deployments/scale in planner.k8s_namespace (the chart creates it). Every call has a deadline
(`timeout_s`). A scale-down drains in Kubernetes: the pod's preStop and terminationGracePeriodSeconds.
"""

from __future__ import annotations

import logging

from pdorch.planner.actuator import ROLES

log = logging.getLogger(__name__)


def load_api_client(host: str = ""):
    """An ApiClient: in-cluster config, falling back to the kubeconfig; `host` (tests) talks to that URL."""
    from kubernetes import client, config
    if host:
        configuration = client.Configuration()
        configuration.host = host
        return client.ApiClient(configuration)
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    return client.ApiClient()


class KubernetesActuator:
    name = "kubernetes"

    def __init__(self, namespace: str, deployments: dict[str, str], api_client=None, timeout_s: float = 10.0):
        from kubernetes import client
        missing = [r for r in ROLES if not deployments.get(r)]
        if missing:
            raise ValueError(f"no Deployment named for role(s) {', '.join(missing)}")
        self.namespace = namespace
        self.deployments = dict(deployments)
        self.timeout_s = timeout_s
        self._api = client.AppsV1Api(api_client if api_client is not None else load_api_client())

    @classmethod
    def from_config(cls, cfg, api_client=None) -> KubernetesActuator:
        p = cfg.planner
        return cls(p.k8s_namespace, {"prefill": p.k8s_prefill_deployment, "decode": p.k8s_decode_deployment},
                   api_client, timeout_s=p.scrape_timeout_s)

    def current(self) -> dict[str, int]:
        out = {}
        for role in ROLES:
            scale = self._api.read_namespaced_deployment_scale(self.deployments[role], self.namespace,
                                                               _request_timeout=self.timeout_s)
            out[role] = int(scale.spec.replicas or 0) if scale.spec is not None else 0
        return out

    def apply(self, desired: dict[str, int]) -> None:
        now = self.current()
        for role, n in desired.items():
            if now.get(role) == n:
                continue
            log.info("planner: scaling deployment %s/%s from %s to %d", self.namespace, self.deployments[role],
                     now.get(role), n)
            self._api.patch_namespaced_deployment_scale(self.deployments[role], self.namespace,
                                                        {"spec": {"replicas": int(n)}},
                                                        _request_timeout=self.timeout_s)
