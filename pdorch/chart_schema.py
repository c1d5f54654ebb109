"""Generate charts/pdorch/values.schema.json: the chart's own keys + pdorch's config schema.

    python -m pdorch.chart_schema           rewrite the file
    python -m pdorch.chart_schema --check   exit 1 if the committed file is stale (a test runs this)

The `config` subtree comes from pdorch/config.py (pdorch.config_schema), so `helm install` and
`helm lint` reject a key, type, range or choice that pdorch's config loader rejects. The chart's
own keys are declared below; Kubernetes-native blocks (resources, affinity, ...) are passed
through to the pod spec and left to the API server's own validation.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from pdorch.config_schema import config_json_schema
from pdorch.generated_file import write_or_check
from pdorch.worker.kv_events import MAX_SUBSCRIBERS

SCHEMA_PATH = Path(__file__).resolve().parent.parent / "charts" / "pdorch" / "values.schema.json"

BOOL = {"type": "boolean"}
STR = {"type": "string"}
COUNT = {"type": "integer", "minimum": 0}
PORT = {"type": "integer", "minimum": 1, "maximum": 65535}
OBJ = {"type": "object"}  # a Kubernetes-native block, passed through
LIST = {"type": "array"}
QUANTITY = {"type": ["string", "integer"]}  # a Kubernetes quantity: "2Gi", 2


def obj(description: str, **props: dict) -> dict[str, Any]:
    return {"type": "object", "additionalProperties": False, "description": description, "properties": props}


GRACE = {"type": "integer", "minimum": 0}


def _placement() -> dict[str, dict]:
    """Where and how a pod runs (pdorch.podCommon)."""
    return {"nodeSelector": OBJ, "tolerations": LIST, "affinity": OBJ, "topologySpreadConstraints": LIST,
            "priorityClassName": STR, "runtimeClassName": STR, "schedulerName": STR,
            "terminationGracePeriodSeconds": GRACE, "podAnnotations": OBJ}


def _budget(description: str) -> dict[str, Any]:
    return obj(description, enabled=BOOL, minAvailable=QUANTITY, maxUnavailable=QUANTITY)


def _pod(description: str, **props: dict) -> dict[str, Any]:
    return obj(description, replicas=COUNT, resources=OBJ, extraEnv=LIST, envFrom=LIST, extraVolumes=LIST,
               extraVolumeMounts=LIST, initContainers=LIST, strategy=OBJ,
               startupSeconds={"type": "integer", "minimum": 5}, **_placement(), **props)


# NOTE: a quantity the chart compares (templates/_ssd.tpl parses it): a string without exponent
# (a number from values may reach the template as a float and render as 1e+09); empty = unset.
SIZE = {"type": "string", "pattern": r"^([0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?)?$"}


def _when_type(value: str, block: str, field: str) -> dict[str, Any]:
    """With `type: value`, `block.field` must be given."""
    return {"if": {"properties": {"type": {"const": value}}, "required": ["type"]},
            "then": {"required": [block], "properties": {block: {"required": [field],
                                                                 "properties": {field: {"minLength": 1}}}}}}


def _ssd_volume(role: str) -> dict[str, Any]:
    """The volume at config.store.ssd_path (templates/_ssd.tpl)."""
    schema = obj(f"{role} workers' SSD tier volume, mounted at config.store.ssd_path",
                 type={"enum": ["", "emptyDir", "hostPath", "pvc"]},
                 emptyDir=obj("emptyDir", sizeLimit=SIZE, medium={"enum": ["", "Memory"]}),
                 hostPath=obj("hostPath", path={"type": "string", "pattern": "^(/.*)?$"},
                              type={"enum": ["DirectoryOrCreate", "Directory"]}),
                 pvc=obj("an existing PersistentVolumeClaim", claimName=STR))
    schema["allOf"] = [_when_type("hostPath", "hostPath", "path"), _when_type("pvc", "pvc", "claimName")]
    return schema


def _worker(role: str) -> dict[str, Any]:
    return _pod(f"{role} worker Deployment",
                gpus=COUNT, tpSize={"enum": [1, 2, 4, 8]}, shmSize=QUANTITY,
                podDisruptionBudget=_budget(f"{role} PDB"),
                ssdVolume=_ssd_volume(role),
                rdma=obj("RDMA device and IPC_LOCK", enabled=BOOL, resourceName=STR,
                         count={"type": "integer", "minimum": 1}),
                hugepages=obj("huge pages for the store segment and transfer buffers", enabled=BOOL,
                              pageSize={"enum": ["2Mi", "1Gi"]}, size=QUANTITY))


def values_schema() -> dict[str, Any]:
    image = obj("pdorch image", repository={"type": "string", "minLength": 1}, tag=STR, slimTag=STR,
                pullPolicy={"enum": ["IfNotPresent", "Always", "Never"]})
    model_volume = obj("where the model directory comes from",
                       type={"enum": ["image", "pvc", "hostPath", "initContainer"]},
                       mountPath={"type": "string", "pattern": "^/"}, subPath=STR,
                       pvc=obj("PersistentVolumeClaim", claimName=STR),
                       hostPath=obj("hostPath volume", path=STR, type=STR),
                       initContainer=obj("init container filling an emptyDir", image=STR, command=LIST, args=LIST,
                                         env=LIST, envFrom=LIST, resources=OBJ, sizeLimit=QUANTITY))
    router = _pod("router Deployment",
                  service=obj("router Service", type={"enum": ["ClusterIP", "NodePort", "LoadBalancer"]},
                              port=PORT, annotations=OBJ),
                  autoscaling=obj("router HPA", enabled=BOOL, minReplicas={"type": "integer", "minimum": 1},
                                  # NOTE: each replica holds a KV event stream per worker, which serves
                                  # at most MAX_SUBSCRIBERS (pdorch/worker/kv_events.py)
                                  maxReplicas={"type": "integer", "minimum": 1, "maximum": MAX_SUBSCRIBERS},
                                  targetCPUUtilizationPercentage={"type": "integer", "minimum": 1,
                                                                  "maximum": 100}),
                  podDisruptionBudget=_budget("router PDB"),
                  preStopSleepSeconds={"type": "integer", "minimum": 0, "maximum": 300})
    master = obj("mooncake_master Deployment", enabled=BOOL, replicas={"type": "integer", "minimum": 1}, rpcPort=PORT, metadataPort=PORT, metricsPort=PORT,
                 extraArgs={"type": "array", "items": STR}, resources=OBJ,
                 podDisruptionBudget=_budget("master PDB"), **_placement())
    etcd = obj("etcd StatefulSet or external endpoints", enabled=BOOL,
               replicas=COUNT, allowSingleMember=BOOL, clientPort=PORT, peerPort=PORT,
               autoCompactionMode={"enum": ["periodic", "revision"]},
               autoCompactionRetention={"type": ["string", "integer"]},
               quotaBackendBytes={"type": "integer", "minimum": 1},
               externalEndpoints={"type": "array", "items": {"type": "string", "pattern": r"^[^\s:/]+:\d{1,5}$"}},
               image=obj("etcd image", repository=STR, tag=STR),
               persistence=obj("etcd data volume", enabled={"type": ["boolean", "null"]}, size=QUANTITY,
                                 storageClass=STR),
               resources=OBJ, **_placement())
    planner = obj("the planner Deployment (`pdorch planner`)", enabled=BOOL,
                  actuator={"enum": ["kubernetes", "external"]}, metricsPort=PORT,
                  profile=obj("the profile `pdorch bench profile` wrote", json=STR, existingConfigMap=STR,
                              key={"type": "string", "pattern": r"^[-._a-zA-Z0-9]+$"}),
                  resources=OBJ, **_placement())
    store_memory = obj("the store-memory node Deployment (`pdorch store-memory`)",
                       enabled={"type": ["boolean", "null"]}, replicas={"type": "integer", "minimum": 1}, port=PORT,
                       resources=OBJ, **_placement())
    monitoring = obj("Prometheus Operator and Grafana objects",
                     serviceMonitor=obj("ServiceMonitor", enabled=BOOL, interval=STR, labels=OBJ),
                     prometheusRule=obj("PrometheusRule", enabled=BOOL, labels=OBJ,
                                        hitRateDropRatio={"type": "number", "exclusiveMinimum": 0, "maximum": 1},
                                        queueDepthThreshold=COUNT,
                                        ttftP99Seconds={"type": "number", "exclusiveMinimum": 0},
                                        errorRatioThreshold={"type": "number", "exclusiveMinimum": 0, "maximum": 1},
                                        masterEvictionsPerSecond={"type": "number", "minimum": 0},
                                        preemptionsPerMinute={"type": "number", "minimum": 0}),
                     grafanaDashboard=obj("Grafana dashboard ConfigMap", enabled=BOOL, labels=OBJ))
    schema = obj("pdorch Helm chart values (generated by `python -m pdorch.chart_schema`; do not edit)",
                 image=image, imagePullSecrets={"type": "array", "items": STR},
                 nameOverride=STR, fullnameOverride=STR,
                 serviceAccount=obj("the pods' ServiceAccount", create=BOOL, name=STR, annotations=OBJ),
                 podSecurityContext=OBJ, securityContext=OBJ, modelVolume=model_volume,
                 config=config_json_schema(),
                 auth=obj("API, admin and worker gRPC keys", existingSecret=STR, apiKey=STR, adminKey=STR,
                          previousApiKey=STR, grpcToken=STR, grpcPreviousToken=STR),
                 grpcTls=obj("worker gRPC over TLS", enabled=BOOL, secretName=STR, serverName=STR),
                 router=router, prefill=_worker("prefill"), decode=_worker("decode"), master=master, etcd=etcd,
                 planner=planner, storeMemory=store_memory, monitoring=monitoring,
                 networkPolicy=obj("NetworkPolicies", enabled=BOOL, routerFrom=LIST, metricsFrom=LIST))
    return {"$schema": "https://json-schema.org/draft-07/schema#", **schema}


def render() -> str:
    return json.dumps(values_schema(), indent=2) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pdorch.chart_schema", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the committed schema is stale")
    args = parser.parse_args(argv)
    return write_or_check(SCHEMA_PATH, render(), args.check, "python -m pdorch.chart_schema")


if __name__ == "__main__":
    sys.exit(main())
