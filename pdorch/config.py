"""The configuration schema: one frozen dataclass per YAML section (docs/design.md section 7).

This module only declares the keys, their types and defaults. Loading YAML, validating ranges
and applying CLI / env overrides lives in `pdorch/config_loader.py`. No torch import here: the
router and store_client use these types too.

Field metadata: `help` (one line for docs/configuration.md), optional `min` / `max` / `choices`,
`format` ("host:port", "device"; see config_values.FORMATS), `required=True` (must not be empty) or
`required_when=(other_key, value)` (must not be empty when another key of the section has that value).
A field without a default is required too.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# The `store:` section is store_client's own config (store_client depends on nothing in pdorch).
from store_client.config import StoreConfig

SMOLLM2_SERVED_NAME = "SmolLM2-135M-Instruct"


def _key(default, help: str, **rules):
    """A config key with its documentation and validation rules."""
    return field(default=default, metadata={"help": help, **rules})


@dataclass(frozen=True)
class ModelConfig:
    """The model every worker serves, where it is prepared, and the KV page geometry."""

    source: str = _key("smollm2", "Model to serve: `smollm2` (the packaged SmolLM2-135M-Instruct), a Hugging Face "
                       "directory of a supported family (Llama 1-3.x, Mistral, Qwen2/2.5, Qwen3; docs/models.md) "
                       "or a .gguf file; prepared once into cache_dir", required=True)
    name: str = _key("", "Model name served by the API (`model` field); empty = from source: "
                     "SmolLM2-135M-Instruct for smollm2, else the directory's (or file's) name")
    cache_dir: str = _key("~/.cache/pdorch/models", "Where `pdorch model prepare` writes converted models")
    device: str = _key("cpu", "torch device of the workers: cpu, cuda, cuda:N", format="device")
    dtype: str = _key("auto", "Compute dtype; auto = the checkpoint's torch_dtype on a GPU (bfloat16 if it does "
                      "not say), float32 on CPU", choices=["auto", "float32", "bfloat16", "float16"])
    kv_dtype: str = _key("auto", "KV cache dtype (store and transfer bytes scale with it); auto = the same as dtype. "
                         "Every prefill and decode worker of a cluster must agree on it (checked at registration)",
                         choices=["auto", "float32", "bfloat16", "float16"])
    page_size: int = _key(16, "Tokens per KV page (the unit of caching, store I/O and P -> D transfer; "
                          "in the store one object per group of KV heads)", min=1, max=1024)
    max_context_tokens: int = _key(0, "Longest prompt + output in tokens; 0 = the model's own limit", min=0)
    torch_threads: int = _key(0, "torch threads per worker; 0 = cores divided among local workers", min=0)
    attention_backend: str = _key("auto", "Attention over the paged KV pool: paged (K/V read in place through page "
                                  "tables by Triton kernels on CUDA), torch (the reference: pages copied out, SDPA); "
                                  "auto = paged on CUDA, torch on CPU", choices=["auto", "paged", "torch"])
    gpu_memory_utilization: float = _key(0.9, "With num_pages auto: the share of the GPU's memory this worker may "
                                         "take (weights, activations, CUDA graphs and the KV pool)", min=0.05,
                                         max=1.0)
    tool_call_parser: str = _key("auto", "The model's tool-call format: how the router reads calls in its output "
                                 "and writes forced calls' grammars (docs/api.md): hermes (<tool_call> JSON: "
                                 "Qwen2.5, Qwen3), llama3_json, mistral, none (tool_choice auto refused, forced "
                                 "calls as bare JSON); auto = from the model's family",
                                 choices=["auto", "none", "hermes", "llama3_json", "mistral"])
    generation_config: str = _key("auto", "auto: requests that leave temperature, top_p, top_k, min_p or "
                                  "repetition_penalty unset get the model's generation_config.json values (as vLLM's "
                                  "--generation-config auto); none: the API's own defaults",
                                  choices=["auto", "none"])
    reasoning_parser: str = _key("auto", "How the router splits a reasoning model's thinking into "
                                 "reasoning_content (docs/api.md): qwen3 (<think>...</think>), deepseek_r1 (the "
                                 "template opens <think>), none; auto = from the model's family (Qwen3: qwen3)",
                                 choices=["auto", "none", "qwen3", "deepseek_r1"])
    chat_template: str = _key("", "A Jinja chat template file that replaces the checkpoint's (vLLM's --chat-template); "
                              "empty = the checkpoint's. Either one, when it ignores tools, renders tool turns with "
                              "the built-in tool template of its chat format (docs/api.md, \"Chat template\"). A "
                              "file that cannot be read, compiled or rendered stops the router at start")
    tp_timeout_s: float = _key(60.0, "Tensor-parallel workers (prefill.tp_size / decode.tp_size > 1): a collective "
                               "between a worker's ranks (each step's broadcast over the CPU group, the model's all-reduces "
                               "and logits gather) that takes "
                               "longer fails, and the worker exits to be restarted as a group; idle ranks exchange a "
                               "heartbeat every tp_timeout_s / 4. Forming the group at start has a bound of its own (120 s, or this "
                               "if longer): a rank's start may take longer than a collective", min=2.0, max=3600.0)
    local_devices: tuple[str, ...] = _key((), "pdorch serve: the devices its local workers take in turn "
                                          "(prefill-0, prefill-1, ..., decode-0, ...); empty = with device cuda, "
                                          "one visible GPU each (shared round-robin when there are fewer)",
                                          format="device")

    @property
    def served_name(self) -> str:
        """The name clients send as `model`: `name`, else derived from `source`."""
        if self.name:
            return self.name
        if self.source == "smollm2":
            return SMOLLM2_SERVED_NAME
        stem = self.source.rstrip("/").rsplit("/", 1)[-1]
        return stem.removesuffix(".gguf")


@dataclass(frozen=True)
class PrefillConfig:
    """Prefill workers: gRPC PrefillService, chunked prefill, L1 prefix cache."""

    host: str = _key("127.0.0.1", "gRPC listen host")
    port: int = _key(50161, "gRPC listen port", min=1, max=65535)
    metrics_port: int = _key(9161, "Prometheus /metrics port; 0 = disabled", min=0, max=65535)
    num_pages: int = _key(512, "KV pool pages (L1 prefix cache lives in the same pool); auto (stored as 0) = "
                          "what the GPU's memory holds after the weights (model.gpu_memory_utilization)", min=2, auto=0)
    chunk_tokens: int = _key(512, "Prefill token budget per scheduler step (chunked prefill)", min=1)
    tp_size: int = _key(1, "Tensor-parallel ranks of each prefill worker: processes of one worker, each holding its "
                        "share of the heads and ffn columns (one GPU each on CUDA); must divide the model's attention "
                        "heads and divide or be a multiple of its KV heads (docs/workers.md, \"Tensor parallelism\")",
                        choices=[1, 2, 4, 8])
    max_queued_requests: int = _key(256, "Requests waiting before new ones are rejected", min=1)
    prefix_cache: bool = _key(True, "Keep computed pages in the L1 prefix cache")
    share_inflight_prefix: bool = _key(True, "A request whose prefix pages another request on this worker is "
                                       "computing right now waits for them instead of computing them again (as long "
                                       "as that is cheaper), and counts them as cached tier inflight")
    persist_wait_s: float = _key(0.5, "Under pool pressure a request waits up to this long for store writes "
                                 "of L1 pages (write-back, write-before-evict) before unpersisted pages are "
                                 "evicted anyway (counted by reason)", min=0.0, max=60.0)
    prefetch_policy: str = _key("wait_complete", "How long a request waits for its store load (the prefix pages L1 "
                                "lacks): wait_complete = until it completes; timeout = at most prefetch_timeout_base_s "
                                "+ prefetch_timeout_per_page_s per page loaded, then the pages not arrived are computed; "
                                "best_effort = not at all while nothing else is to compute: they are computed instead "
                                "(docs/workers.md, \"Prefetch policies\")",
                                choices=["wait_complete", "timeout", "best_effort"])
    prefetch_timeout_base_s: float = _key(1.0, "prefetch_policy timeout: the fixed part of the wait for the store load",
                                          min=0.0, max=600.0)
    prefetch_timeout_per_page_s: float = _key(0.004, "prefetch_policy timeout: the wait added per page the store "
                                              "load reads", min=0.0, max=10.0)
    request_timeout_s: float = _key(60.0, "Default deadline when the caller gives none", min=0.1)
    drain_timeout_s: float = _key(10.0, "On SIGTERM, after leaving discovery: running prefills get this long to "
                                  "finish before the server stops", min=0.0, max=3600.0)
    drain_writeback_s: float = _key(10.0, "On SIGTERM, once its prefills are over: the L1 pages the store lacks "
                                    "(write_back, write_through_selective, failed writes) get this long to be "
                                    "written back, so the next turns read them from the store", min=0.0, max=3600.0)


@dataclass(frozen=True)
class DecodeConfig:
    """Decode workers: gRPC DecodeService, continuous-batching decode, generated-KV offload."""

    host: str = _key("127.0.0.1", "gRPC listen host")
    port: int = _key(50171, "gRPC listen port", min=1, max=65535)
    metrics_port: int = _key(9171, "Prometheus /metrics port; 0 = disabled", min=0, max=65535)
    num_pages: int = _key(1024, "KV pool pages; auto (stored as 0) = what the GPU's memory holds after the weights "
                          "(model.gpu_memory_utilization)", min=2, auto=0)
    tp_size: int = _key(1, "Tensor-parallel ranks of each decode worker: processes of one worker, each holding its "
                        "share of the heads and ffn columns (one GPU each on CUDA); must divide the model's attention "
                        "heads and divide or be a multiple of its KV heads (docs/workers.md, \"Tensor parallelism\")",
                        choices=[1, 2, 4, 8])
    cuda_graph_max_batch: int = _key(128, "CUDA only: decode steps of up to this many requests replay a CUDA graph "
                                     "captured at start-up for their batch-size bucket; 0 = off", min=0, max=1024)
    max_running_requests: int = _key(32, "Sequences decoded together in one batch", min=1)
    max_queued_requests: int = _key(256, "Requests waiting for admission before new ones are rejected", min=1)
    kv_watermark: float = _key(0.95, "Admit a request only while pool usage stays below this fraction",
                               min=0.1, max=1.0)
    preemption: bool = _key(True, "When the pool cannot give a running request its next page, preempt the "
                            "request that joined last (its stream pauses; it resumes from its pages still "
                            "in the pool, then the store, computing only what neither holds) instead of "
                            "failing the request RESOURCE_EXHAUSTED")
    growth_reserve: float = _key(0.7, "Admission keeps back this fraction of the pages the admitted requests "
                                 "may still grow to (prompt + max_tokens), so that running requests rarely "
                                 "need preempting; falls to growth_reserve_min over 600 decode steps without "
                                 "a preemption, back to this value at each one (SGLang's new_token_ratio); "
                                 "0 = admission checks only the prompt's pages", min=0.0, max=1.0)
    growth_reserve_min: float = _key(0.1, "The floor growth_reserve falls to while no request is preempted",
                                     min=0.0, max=1.0)
    offload_generated_kv: bool = _key(True, "Write pages filled during decode to the store (next turn hits)")
    prefix_cache: bool = _key(True, "Keep the KV of served requests in the pool (the decode worker's own L1 "
                              "prefix cache): the next turn takes its prefix from there first, and a prefill "
                              "worker computing a long tail reads the pages held here instead of the store")
    load_prefix_from_store: bool = _key(True, "With the store on: the decode worker reads the prompt pages the "
                                        "store holds into its own pages itself, while the prefill worker computes "
                                        "the rest and pushes only the pages the decode worker lacks")
    share_inflight_prefix: bool = _key(True, "A request whose prompt pages another request on this decode worker "
                                       "is receiving from a prefill worker (or computing) right now waits for them and "
                                       "shares them in the pool instead of having them pushed again (cached tier "
                                       "inflight); needs prefix_cache")
    max_local_prefill_tokens: int = _key(256, "Conditional disaggregation: when the decode worker's prefix cache "
                                         "or the store holds the prompt's prefix and at most this many prompt "
                                         "tokens are left to compute, the decode worker takes the prefix and "
                                         "computes them itself in its batch, calling no prefill worker; 0 = "
                                         "always call one", min=0)
    prefill_timeout_s: float = _key(30.0, "Caps the prefill call for requests that arrive without a deadline of "
                                    "their own (a request's own deadline always governs)", min=0.1)
    request_timeout_s: float = _key(600.0, "Default whole-request deadline when the caller gives none",
                                    min=0.1)
    drain_timeout_s: float = _key(30.0, "On SIGTERM, after leaving discovery: streams get this long to finish; "
                                  "the rest are handed to other decode workers (ended UNAVAILABLE once their "
                                  "offloaded pages are written; the router resumes them: router.mid_stream_failover)",
                                  min=0.0, max=3600.0)
    drain_writeback_s: float = _key(5.0, "On SIGTERM, once its streams are over or handed on: the prefix-cache "
                                    "pages the store lacks (failed writes, offload off) get this long to be written "
                                    "back, so the next turns read them from the store", min=0.0, max=3600.0)


@dataclass(frozen=True)
class RouterConfig:
    """The HTTP router: OpenAI / SGLang-native API, worker selection, auth, health checks."""

    host: str = _key("127.0.0.1", "HTTP listen host")
    port: int = _key(8390, "HTTP listen port", min=1, max=65535)
    policy: str = _key("cache_aware", "Prefill selection policy",
                       choices=["cache_aware", "least_load", "round_robin"])
    cache_index_pages: int = _key(65536, "Page hashes remembered per prefill worker (cache_aware LRU)", min=1)
    load_imbalance_threshold: int = _key(8, "cache_aware falls back to least load when the best-match "
                                         "worker has this many more requests than the least loaded", min=0)
    store_aware_routing: bool = _key(True, "cache_aware with the store on: a prefix the store already holds goes "
                                     "to the least-loaded prefill worker instead of queueing behind the one whose "
                                     "L1 holds it (a store read is cheaper than the wait)")
    kv_events: bool = _key(True, "cache_aware routes on the workers' KV events (WatchKV: what each worker's prefix "
                           "cache and the store hold, as a snapshot then deltas), so every router replica keeps "
                           "the same index; off = only the routing-time guess (what this router sent where)")
    kv_l1_weight: float = _key(1.0, "With kv_events: score of each prompt page a worker's own prefix cache holds",
                               min=0.0)
    kv_store_weight: float = _key(0.5, "With kv_events: score of each further prompt page the store holds (a "
                                  "batched store read, cheaper than computing, dearer than the worker's own cache)",
                                  min=0.0)
    kv_speculative_ttl_s: float = _key(10.0, "With kv_events: seconds a routing-time guess (the prompt's pages "
                                       "counted in the chosen worker's cache before its events say so) lives "
                                       "unless an event confirms it", min=0.0)
    kv_stale_after_s: float = _key(3.0, "With kv_events: a worker's stream silent this long (workers send a "
                                   "batch at least every second) is stale: the policy routes to it on the guess",
                                   min=0.5)
    mid_stream_failover: str = _key("auto", "A stream whose decode worker dies (connection lost) resumes on another "
                                     "decode worker with the prompt + the tokens already streamed, the client's "
                                     "stream going on unbroken; auto = only with the store on and "
                                     "decode.offload_generated_kv (the new worker loads the generated pages from "
                                     "the store), on = also without (prefill recomputes them), off = the stream "
                                     "ends with an error event", choices=["auto", "on", "off"])
    session_affinity_header: str = _key("", "HTTP header whose value pins a session to one prefill worker")
    api_key: str = _key("", "Bearer key clients must send; empty = no auth (env PDORCH_ROUTER_API_KEY)")
    admin_key: str = _key("", "Bearer key for /flush_cache and /workers (env PDORCH_ROUTER_ADMIN_KEY)")
    previous_api_key: str = _key("", "During an API key rotation: the old key, still accepted like api_key until "
                                 "clients have moved; empty = none (env PDORCH_ROUTER_PREVIOUS_API_KEY)")
    max_queued_requests: int = _key(1024, "Requests in flight before the router answers 429", min=1)
    max_n: int = _key(16, "Largest `n` (output sequences per prompt) a request may ask for; they share one "
                      "prefill and the prompt's KV pages on the decode worker", min=1, max=128)
    request_timeout_s: float = _key(600.0, "Whole-request deadline", min=0.1)
    keepalive_s: float = _key(15.0, "A streamed response (SSE) silent this long gets a comment line (`: keep-alive`, "
                              "ignored by clients) so that proxies and load balancers with an idle timeout do not "
                              "cut it; one also goes out at once when the decode worker preempts the request. Keep "
                              "it under every idle timeout between client and router (nginx: 60 s); 0 = off",
                              min=0.0)
    drain_timeout_s: float = _key(30.0, "On SIGTERM: the router stops accepting connections and gives requests "
                                  "in flight this long to finish (cover router.request_timeout_s for no cut stream)",
                                  min=0.0, max=3600.0)
    health_check_interval_s: float = _key(2.0, "Seconds between worker health checks", min=0.1)
    circuit_breaker_failures: int = _key(3, "Consecutive failures that open a worker's circuit", min=1)
    circuit_breaker_cooldown_s: float = _key(10.0, "Seconds before an open circuit is retried", min=0.1)
    max_body_mb: int = _key(8, "Largest HTTP request body in MiB (a 128k-token prompt as token ids is ~1 MiB); "
                            "a larger one is answered 413", min=1, max=1024)
    responses_store_max_entries: int = _key(100000, "/v1/responses with store: at most this many stored responses "
                                            "(what previous_response_id continues, GET /v1/responses/{id} returns); "
                                            "the least recently used go first", min=1)
    responses_store_max_mb: int = _key(256, "/v1/responses with store: at most this many MiB of stored responses "
                                       "(each kept as compact JSON: its turn's messages and its Response object)",
                                       min=1, max=65536)
    responses_store_ttl_s: float = _key(86400.0, "/v1/responses with store: a stored response unused this long is "
                                        "gone (its chain's next turn is a 404)", min=1.0)
    metrics_port: int = _key(0, "Prometheus /metrics on a port of its own too (scrapers reach it where the API "
                             "port is closed to them; the chart uses 9390); 0 = only on the HTTP port, where it is "
                             "always served", min=0, max=65535)


@dataclass(frozen=True)
class GrpcConfig:
    """Worker gRPC (router -> decode -> prefill): an optional shared token and TLS, alike in every process."""

    token: str = _key("", "Shared secret every call to a worker must carry (`authorization: Bearer`); calls "
                      "without it are rejected UNAUTHENTICATED; empty = no check (env PDORCH_GRPC_TOKEN)")
    previous_token: str = _key("", "During a token rotation: the old token, still accepted by workers, and sent by "
                               "callers to a worker that refuses `token` (one not rolled yet); empty after the "
                               "rotation (env PDORCH_GRPC_PREVIOUS_TOKEN)")
    tls: bool = _key(False, "Workers serve gRPC over TLS; the router and decode workers call them over TLS")
    tls_cert: str = _key("", "Workers with tls: PEM certificate (chain) file they serve")
    tls_key: str = _key("", "Workers with tls: PEM private key file of tls_cert")
    tls_ca: str = _key("", "Callers with tls: PEM CA bundle that signed the workers' certificates; empty = the "
                       "system's trusted roots")
    tls_server_name: str = _key("", "Callers with tls: the name the workers' certificates are checked for; "
                                "empty = the host part of the address called")


@dataclass(frozen=True)
class DiscoveryConfig:
    """How the router finds workers: a static address list or etcd leases."""

    mode: str = _key("static", "How the router finds workers", choices=["static", "etcd"])
    prefill: tuple[str, ...] = _key(("127.0.0.1:50161",), "static: prefill worker gRPC addresses",
                                   format="host:port", required_when=("mode", "static"))
    decode: tuple[str, ...] = _key(("127.0.0.1:50171",), "static: decode worker gRPC addresses",
                                  format="host:port", required_when=("mode", "static"))
    etcd_endpoints: tuple[str, ...] = _key(("127.0.0.1:2379",), "etcd: endpoints host:port",
                                          format="host:port", required_when=("mode", "etcd"))
    cluster: str = _key("pdorch", "etcd: key prefix; workers register /{cluster}/workers/{role}/{id}")
    lease_ttl_s: int = _key(10, "etcd: worker lease TTL (a dead worker disappears within it)", min=1)


@dataclass(frozen=True)
class PlannerConfig:
    """The planner (`pdorch planner`, `pdorch serve --autoscale`): replicas per role against TTFT / ITL targets."""

    mode: str = _key("dry-run", "act: apply each decision through the actuator; dry-run: decide, log and export "
                     "the decisions, change nothing", choices=["act", "dry-run"])
    actuator: str = _key("external", "What changes the fleet: local (`pdorch serve --autoscale` starts and stops "
                         "its worker processes), kubernetes (patches the prefill and decode Deployments' scale), "
                         "external (exports the desired replicas as the gauge "
                         "pdorch_planner_external_desired_replicas for KEDA or an HPA)",
                         choices=["local", "kubernetes", "external"])
    interval_s: float = _key(30.0, "Seconds between decisions (each one reads the metrics of the interval before)",
                             min=1.0, max=3600.0)
    ttft_p90_s: float = _key(2.0, "TTFT target: p90 time to first token in seconds", min=0.001)
    itl_p90_s: float = _key(0.1, "ITL target: p90 inter-token latency in seconds", min=0.0001)
    min_prefill: int = _key(1, "Fewest prefill replicas", min=1, at_most="max_prefill")
    max_prefill: int = _key(4, "Most prefill replicas", min=1)
    min_decode: int = _key(1, "Fewest decode replicas", min=1, at_most="max_decode")
    max_decode: int = _key(4, "Most decode replicas", min=1)
    profile_path: str = _key("", "The per-replica profile `pdorch bench profile` wrote (JSON); the planner "
                             "refuses to start without one")
    up_cooldown_s: float = _key(60.0, "A role scales up no sooner than this after its last change (new replicas "
                                "need time to start and warm up before their effect shows)", min=0.0)
    down_cooldown_s: float = _key(300.0, "A role scales down no sooner than this after its last change", min=0.0)
    scale_up_utilization: float = _key(0.9, "Headroom: a role scales up to the replicas that carry the load at "
                                       "this fraction of their capacity within the SLOs", min=0.1, max=1.0)
    scale_down_utilization: float = _key(0.8, "Hysteresis: a role scales down only to a fleet the load keeps at or "
                                         "below this fraction of its capacity", min=0.1, max=1.0,
                                         at_most="scale_up_utilization")
    replica_startup_s: float = _key(60.0, "Seconds from asking for a replica to its first served request: the "
                                    "planner sizes for the highest load predicted up to then", min=0.0)
    load_margin: float = _key(1.0, "The planner sizes for the predicted request rate plus this many RMS of its "
                              "recent forecast errors (0 = the forecast itself)", min=0.0, max=10.0)
    error_window: int = _key(10, "Intervals whose forecast errors load_margin's RMS is taken over", min=1,
                             max=1000)
    predictor_window: int = _key(4, "Intervals the load predictor (moving average plus trend) looks back over",
                                 min=1, max=1000)
    attainment_window: int = _key(20, "Intervals pdorch_planner_slo_attainment is the fraction of", min=1,
                                  max=10000)
    router_urls: tuple[str, ...] = _key((), "Routers whose /metrics the planner reads (every replica: their "
                                        "counters are summed); empty = http://router.host:router.port",
                                        format="http_url")
    worker_metrics_urls: tuple[str, ...] = _key((), "Workers' /metrics URLs for queue depths and KV pool use "
                                                "(logged with each decision); empty = none", format="http_url")
    scrape_timeout_s: float = _key(5.0, "Deadline of each /metrics request", min=0.1, max=60.0)
    metrics_port: int = _key(9490, "The planner's own port: Prometheus /metrics and /status (JSON); 0 = off",
                             min=0, max=65535)
    status_url: str = _key("", "Where `pdorch status` asks the planner for its /status; empty = "
                           "http://127.0.0.1:planner.metrics_port (none when that is 0)")
    k8s_namespace: str = _key("default", "actuator kubernetes: the Deployments' namespace")
    k8s_prefill_deployment: str = _key("pdorch-prefill", "actuator kubernetes: the prefill Deployment")
    k8s_decode_deployment: str = _key("pdorch-decode", "actuator kubernetes: the decode Deployment")


@dataclass(frozen=True)
class ObservabilityConfig:
    """Traces (pdorch/tracing/): OpenTelemetry spans of each request, exported over OTLP and/or kept in memory
    for `pdorch trace`. Off (both empty/0) by default, and then free: no tracer, no header parsed."""

    otlp_endpoint: str = _key("", "OTLP collector the spans are exported to in batches, off the serving threads: "
                              "http://host:4317 (otlp_protocol grpc) or http://host:4318/v1/traces (http); "
                              "https:// for TLS; empty = no export", format="http_url")
    otlp_protocol: str = _key("grpc", "OTLP transport of otlp_endpoint", choices=["grpc", "http"])
    sample_ratio: float = _key(1.0, "Share of new traces recorded (a trace the caller's traceparent brings "
                               "follows the caller's decision: parent-based)", min=0.0, max=1.0)
    keep_traces: int = _key(0, "Last N traces each process keeps in memory for `pdorch trace` and "
                            "/admin/traces (served by the router, gathered from the workers' Traces RPC); "
                            "0 = none", min=0, max=100_000)
    max_spans_per_trace: int = _key(256, "Spans kept of one trace in memory (a very long request's later spans "
                                    "are dropped from the ring; the export keeps them)", min=1, max=100_000)
    export_queue_size: int = _key(4096, "Spans waiting for export; a full queue drops new spans (the SDK logs it) "
                                  "rather than slow a request", min=1, max=1_000_000)
    export_delay_ms: int = _key(500, "Longest a span waits before its batch is exported", min=1, max=60_000)
    shutdown_timeout_s: float = _key(2.0, "At shutdown, how long the last spans get to be exported", min=0.0,
                                     max=60.0)
    traces_rpc_timeout_s: float = _key(2.0, "The router's deadline on each worker's Traces call "
                                       "(/admin/traces, `pdorch trace`)", min=0.05, max=60.0)


@dataclass(frozen=True)
class Config:
    """The whole configuration: one frozen section object per YAML section."""

    model: ModelConfig = field(default_factory=ModelConfig)
    store: StoreConfig = field(default_factory=StoreConfig)
    prefill: PrefillConfig = field(default_factory=PrefillConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    router: RouterConfig = field(default_factory=RouterConfig)
    discovery: DiscoveryConfig = field(default_factory=DiscoveryConfig)
    grpc: GrpcConfig = field(default_factory=GrpcConfig)
    planner: PlannerConfig = field(default_factory=PlannerConfig)
    observability: ObservabilityConfig = field(default_factory=ObservabilityConfig)
