from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SamplingParams(_message.Message):
    __slots__ = ("temperature", "top_p", "top_k", "max_tokens", "stop", "stop_token_ids", "ignore_eos", "seed", "min_p", "grammar", "logprobs", "presence_penalty", "frequency_penalty", "repetition_penalty", "logit_bias", "min_tokens", "resumed_tokens", "n", "prompt_logprobs", "include_stop_str_in_output", "skip_special_tokens", "spaces_between_special_tokens", "allowed_token_ids", "bad_words")
    class LogitBiasEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: float
        def __init__(self, key: _Optional[int] = ..., value: _Optional[float] = ...) -> None: ...
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    STOP_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    IGNORE_EOS_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    MIN_P_FIELD_NUMBER: _ClassVar[int]
    GRAMMAR_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    PRESENCE_PENALTY_FIELD_NUMBER: _ClassVar[int]
    FREQUENCY_PENALTY_FIELD_NUMBER: _ClassVar[int]
    REPETITION_PENALTY_FIELD_NUMBER: _ClassVar[int]
    LOGIT_BIAS_FIELD_NUMBER: _ClassVar[int]
    MIN_TOKENS_FIELD_NUMBER: _ClassVar[int]
    RESUMED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    N_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_STOP_STR_IN_OUTPUT_FIELD_NUMBER: _ClassVar[int]
    SKIP_SPECIAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SPACES_BETWEEN_SPECIAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ALLOWED_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    BAD_WORDS_FIELD_NUMBER: _ClassVar[int]
    temperature: float
    top_p: float
    top_k: int
    max_tokens: int
    stop: _containers.RepeatedScalarFieldContainer[str]
    stop_token_ids: _containers.RepeatedScalarFieldContainer[int]
    ignore_eos: bool
    seed: int
    min_p: float
    grammar: Grammar
    logprobs: int
    presence_penalty: float
    frequency_penalty: float
    repetition_penalty: float
    logit_bias: _containers.ScalarMap[int, float]
    min_tokens: int
    resumed_tokens: int
    n: int
    prompt_logprobs: int
    include_stop_str_in_output: bool
    skip_special_tokens: bool
    spaces_between_special_tokens: bool
    allowed_token_ids: _containers.RepeatedScalarFieldContainer[int]
    bad_words: _containers.RepeatedCompositeFieldContainer[TokenIds]
    def __init__(self, temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., top_k: _Optional[int] = ..., max_tokens: _Optional[int] = ..., stop: _Optional[_Iterable[str]] = ..., stop_token_ids: _Optional[_Iterable[int]] = ..., ignore_eos: _Optional[bool] = ..., seed: _Optional[int] = ..., min_p: _Optional[float] = ..., grammar: _Optional[_Union[Grammar, _Mapping]] = ..., logprobs: _Optional[int] = ..., presence_penalty: _Optional[float] = ..., frequency_penalty: _Optional[float] = ..., repetition_penalty: _Optional[float] = ..., logit_bias: _Optional[_Mapping[int, float]] = ..., min_tokens: _Optional[int] = ..., resumed_tokens: _Optional[int] = ..., n: _Optional[int] = ..., prompt_logprobs: _Optional[int] = ..., include_stop_str_in_output: _Optional[bool] = ..., skip_special_tokens: _Optional[bool] = ..., spaces_between_special_tokens: _Optional[bool] = ..., allowed_token_ids: _Optional[_Iterable[int]] = ..., bad_words: _Optional[_Iterable[_Union[TokenIds, _Mapping]]] = ...) -> None: ...

class TokenIds(_message.Message):
    __slots__ = ("ids",)
    IDS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, ids: _Optional[_Iterable[int]] = ...) -> None: ...

class TokenLogprob(_message.Message):
    __slots__ = ("logprob", "top_ids", "top_logprobs", "rank")
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    TOP_IDS_FIELD_NUMBER: _ClassVar[int]
    TOP_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    logprob: float
    top_ids: _containers.RepeatedScalarFieldContainer[int]
    top_logprobs: _containers.RepeatedScalarFieldContainer[float]
    rank: int
    def __init__(self, logprob: _Optional[float] = ..., top_ids: _Optional[_Iterable[int]] = ..., top_logprobs: _Optional[_Iterable[float]] = ..., rank: _Optional[int] = ...) -> None: ...

class Grammar(_message.Message):
    __slots__ = ("kind", "spec")
    KIND_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    kind: str
    spec: str
    def __init__(self, kind: _Optional[str] = ..., spec: _Optional[str] = ...) -> None: ...

class CachedTokens(_message.Message):
    __slots__ = ("device", "host", "store", "ssd", "inflight")
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    STORE_FIELD_NUMBER: _ClassVar[int]
    SSD_FIELD_NUMBER: _ClassVar[int]
    INFLIGHT_FIELD_NUMBER: _ClassVar[int]
    device: int
    host: int
    store: int
    ssd: int
    inflight: int
    def __init__(self, device: _Optional[int] = ..., host: _Optional[int] = ..., store: _Optional[int] = ..., ssd: _Optional[int] = ..., inflight: _Optional[int] = ...) -> None: ...

class PrefillRequest(_message.Message):
    __slots__ = ("request_id", "token_ids", "sampling", "decode_segment", "dest_page_addrs", "timeout_s", "page_size", "model_fingerprint", "page_hashes", "decode_loaded_pages", "decode_cached_pages", "decode_ranks")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    DECODE_SEGMENT_FIELD_NUMBER: _ClassVar[int]
    DEST_PAGE_ADDRS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    MODEL_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    PAGE_HASHES_FIELD_NUMBER: _ClassVar[int]
    DECODE_LOADED_PAGES_FIELD_NUMBER: _ClassVar[int]
    DECODE_CACHED_PAGES_FIELD_NUMBER: _ClassVar[int]
    DECODE_RANKS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    sampling: SamplingParams
    decode_segment: str
    dest_page_addrs: _containers.RepeatedScalarFieldContainer[int]
    timeout_s: float
    page_size: int
    model_fingerprint: str
    page_hashes: _containers.RepeatedScalarFieldContainer[str]
    decode_loaded_pages: _containers.RepeatedScalarFieldContainer[int]
    decode_cached_pages: _containers.RepeatedScalarFieldContainer[int]
    decode_ranks: _containers.RepeatedCompositeFieldContainer[PoolRank]
    def __init__(self, request_id: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., sampling: _Optional[_Union[SamplingParams, _Mapping]] = ..., decode_segment: _Optional[str] = ..., dest_page_addrs: _Optional[_Iterable[int]] = ..., timeout_s: _Optional[float] = ..., page_size: _Optional[int] = ..., model_fingerprint: _Optional[str] = ..., page_hashes: _Optional[_Iterable[str]] = ..., decode_loaded_pages: _Optional[_Iterable[int]] = ..., decode_cached_pages: _Optional[_Iterable[int]] = ..., decode_ranks: _Optional[_Iterable[_Union[PoolRank, _Mapping]]] = ...) -> None: ...

class PoolRank(_message.Message):
    __slots__ = ("segment", "pool_base", "page_nbytes", "kv_head_start", "kv_head_count")
    SEGMENT_FIELD_NUMBER: _ClassVar[int]
    POOL_BASE_FIELD_NUMBER: _ClassVar[int]
    PAGE_NBYTES_FIELD_NUMBER: _ClassVar[int]
    KV_HEAD_START_FIELD_NUMBER: _ClassVar[int]
    KV_HEAD_COUNT_FIELD_NUMBER: _ClassVar[int]
    segment: str
    pool_base: int
    page_nbytes: int
    kv_head_start: int
    kv_head_count: int
    def __init__(self, segment: _Optional[str] = ..., pool_base: _Optional[int] = ..., page_nbytes: _Optional[int] = ..., kv_head_start: _Optional[int] = ..., kv_head_count: _Optional[int] = ...) -> None: ...

class PrefillResponse(_message.Message):
    __slots__ = ("request_id", "first_token_id", "prompt_tokens", "cached", "transfer_bytes", "transfer_s", "compute_s", "sampler_state", "unstored_pages", "first_logprob", "more_first", "prompt_logprobs")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    FIRST_TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHED_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_BYTES_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_S_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_S_FIELD_NUMBER: _ClassVar[int]
    SAMPLER_STATE_FIELD_NUMBER: _ClassVar[int]
    UNSTORED_PAGES_FIELD_NUMBER: _ClassVar[int]
    FIRST_LOGPROB_FIELD_NUMBER: _ClassVar[int]
    MORE_FIRST_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    first_token_id: int
    prompt_tokens: int
    cached: CachedTokens
    transfer_bytes: int
    transfer_s: float
    compute_s: float
    sampler_state: bytes
    unstored_pages: _containers.RepeatedScalarFieldContainer[int]
    first_logprob: TokenLogprob
    more_first: _containers.RepeatedCompositeFieldContainer[FirstToken]
    prompt_logprobs: _containers.RepeatedCompositeFieldContainer[TokenLogprob]
    def __init__(self, request_id: _Optional[str] = ..., first_token_id: _Optional[int] = ..., prompt_tokens: _Optional[int] = ..., cached: _Optional[_Union[CachedTokens, _Mapping]] = ..., transfer_bytes: _Optional[int] = ..., transfer_s: _Optional[float] = ..., compute_s: _Optional[float] = ..., sampler_state: _Optional[bytes] = ..., unstored_pages: _Optional[_Iterable[int]] = ..., first_logprob: _Optional[_Union[TokenLogprob, _Mapping]] = ..., more_first: _Optional[_Iterable[_Union[FirstToken, _Mapping]]] = ..., prompt_logprobs: _Optional[_Iterable[_Union[TokenLogprob, _Mapping]]] = ...) -> None: ...

class FirstToken(_message.Message):
    __slots__ = ("token_id", "sampler_state", "logprob")
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    SAMPLER_STATE_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    token_id: int
    sampler_state: bytes
    logprob: TokenLogprob
    def __init__(self, token_id: _Optional[int] = ..., sampler_state: _Optional[bytes] = ..., logprob: _Optional[_Union[TokenLogprob, _Mapping]] = ...) -> None: ...

class AbortRequest(_message.Message):
    __slots__ = ("request_id",)
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    def __init__(self, request_id: _Optional[str] = ...) -> None: ...

class AbortResponse(_message.Message):
    __slots__ = ("found",)
    FOUND_FIELD_NUMBER: _ClassVar[int]
    found: bool
    def __init__(self, found: _Optional[bool] = ...) -> None: ...

class FlushRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class FlushResponse(_message.Message):
    __slots__ = ("pages_freed",)
    PAGES_FREED_FIELD_NUMBER: _ClassVar[int]
    pages_freed: int
    def __init__(self, pages_freed: _Optional[int] = ...) -> None: ...

class InfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WorkerInfo(_message.Message):
    __slots__ = ("role", "worker_id", "model", "model_fingerprint", "page_size", "total_pages", "free_pages", "queued_requests", "running_requests", "transfer_segment", "store_enabled", "max_context_tokens", "kv_dtype", "dtype", "model_family", "store_evicted_pages", "preemptions", "preempted_requests", "tp_size")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    MODEL_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    TOTAL_PAGES_FIELD_NUMBER: _ClassVar[int]
    FREE_PAGES_FIELD_NUMBER: _ClassVar[int]
    QUEUED_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    RUNNING_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_SEGMENT_FIELD_NUMBER: _ClassVar[int]
    STORE_ENABLED_FIELD_NUMBER: _ClassVar[int]
    MAX_CONTEXT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    KV_DTYPE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    MODEL_FAMILY_FIELD_NUMBER: _ClassVar[int]
    STORE_EVICTED_PAGES_FIELD_NUMBER: _ClassVar[int]
    PREEMPTIONS_FIELD_NUMBER: _ClassVar[int]
    PREEMPTED_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    TP_SIZE_FIELD_NUMBER: _ClassVar[int]
    role: str
    worker_id: str
    model: str
    model_fingerprint: str
    page_size: int
    total_pages: int
    free_pages: int
    queued_requests: int
    running_requests: int
    transfer_segment: str
    store_enabled: bool
    max_context_tokens: int
    kv_dtype: str
    dtype: str
    model_family: str
    store_evicted_pages: int
    preemptions: int
    preempted_requests: int
    tp_size: int
    def __init__(self, role: _Optional[str] = ..., worker_id: _Optional[str] = ..., model: _Optional[str] = ..., model_fingerprint: _Optional[str] = ..., page_size: _Optional[int] = ..., total_pages: _Optional[int] = ..., free_pages: _Optional[int] = ..., queued_requests: _Optional[int] = ..., running_requests: _Optional[int] = ..., transfer_segment: _Optional[str] = ..., store_enabled: _Optional[bool] = ..., max_context_tokens: _Optional[int] = ..., kv_dtype: _Optional[str] = ..., dtype: _Optional[str] = ..., model_family: _Optional[str] = ..., store_evicted_pages: _Optional[int] = ..., preemptions: _Optional[int] = ..., preempted_requests: _Optional[int] = ..., tp_size: _Optional[int] = ...) -> None: ...

class StatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WorkerStats(_message.Message):
    __slots__ = ("requests_finished", "requests_failed", "prompt_tokens_computed", "prompt_tokens_cached", "generated_tokens", "store_pages_written", "info", "pool_integrity_ok", "pool_integrity_error", "active_pages", "store_pages_loaded", "transfer_bytes", "requests_aborted")
    REQUESTS_FINISHED_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FAILED_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_COMPUTED_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_CACHED_FIELD_NUMBER: _ClassVar[int]
    GENERATED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STORE_PAGES_WRITTEN_FIELD_NUMBER: _ClassVar[int]
    INFO_FIELD_NUMBER: _ClassVar[int]
    POOL_INTEGRITY_OK_FIELD_NUMBER: _ClassVar[int]
    POOL_INTEGRITY_ERROR_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_PAGES_FIELD_NUMBER: _ClassVar[int]
    STORE_PAGES_LOADED_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_BYTES_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_ABORTED_FIELD_NUMBER: _ClassVar[int]
    requests_finished: int
    requests_failed: int
    prompt_tokens_computed: int
    prompt_tokens_cached: CachedTokens
    generated_tokens: int
    store_pages_written: int
    info: WorkerInfo
    pool_integrity_ok: bool
    pool_integrity_error: str
    active_pages: int
    store_pages_loaded: int
    transfer_bytes: int
    requests_aborted: int
    def __init__(self, requests_finished: _Optional[int] = ..., requests_failed: _Optional[int] = ..., prompt_tokens_computed: _Optional[int] = ..., prompt_tokens_cached: _Optional[_Union[CachedTokens, _Mapping]] = ..., generated_tokens: _Optional[int] = ..., store_pages_written: _Optional[int] = ..., info: _Optional[_Union[WorkerInfo, _Mapping]] = ..., pool_integrity_ok: _Optional[bool] = ..., pool_integrity_error: _Optional[str] = ..., active_pages: _Optional[int] = ..., store_pages_loaded: _Optional[int] = ..., transfer_bytes: _Optional[int] = ..., requests_aborted: _Optional[int] = ...) -> None: ...

class WatchKVRequest(_message.Message):
    __slots__ = ("hash_scheme", "page_size", "layout_version", "epoch", "after_seq", "subscriber")
    HASH_SCHEME_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_VERSION_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    AFTER_SEQ_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIBER_FIELD_NUMBER: _ClassVar[int]
    hash_scheme: str
    page_size: int
    layout_version: int
    epoch: str
    after_seq: int
    subscriber: str
    def __init__(self, hash_scheme: _Optional[str] = ..., page_size: _Optional[int] = ..., layout_version: _Optional[int] = ..., epoch: _Optional[str] = ..., after_seq: _Optional[int] = ..., subscriber: _Optional[str] = ...) -> None: ...

class KVEventBatch(_message.Message):
    __slots__ = ("worker_id", "epoch", "seq", "snapshot", "l1_stored", "l1_removed", "store_written", "store_removed", "free_pages", "queued_requests", "running_requests", "page_size", "inflight_claimed", "inflight_released")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    L1_STORED_FIELD_NUMBER: _ClassVar[int]
    L1_REMOVED_FIELD_NUMBER: _ClassVar[int]
    STORE_WRITTEN_FIELD_NUMBER: _ClassVar[int]
    STORE_REMOVED_FIELD_NUMBER: _ClassVar[int]
    FREE_PAGES_FIELD_NUMBER: _ClassVar[int]
    QUEUED_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    RUNNING_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    INFLIGHT_CLAIMED_FIELD_NUMBER: _ClassVar[int]
    INFLIGHT_RELEASED_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    epoch: str
    seq: int
    snapshot: bool
    l1_stored: _containers.RepeatedScalarFieldContainer[str]
    l1_removed: _containers.RepeatedScalarFieldContainer[str]
    store_written: _containers.RepeatedScalarFieldContainer[str]
    store_removed: _containers.RepeatedScalarFieldContainer[str]
    free_pages: int
    queued_requests: int
    running_requests: int
    page_size: int
    inflight_claimed: _containers.RepeatedScalarFieldContainer[str]
    inflight_released: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, worker_id: _Optional[str] = ..., epoch: _Optional[str] = ..., seq: _Optional[int] = ..., snapshot: _Optional[bool] = ..., l1_stored: _Optional[_Iterable[str]] = ..., l1_removed: _Optional[_Iterable[str]] = ..., store_written: _Optional[_Iterable[str]] = ..., store_removed: _Optional[_Iterable[str]] = ..., free_pages: _Optional[int] = ..., queued_requests: _Optional[int] = ..., running_requests: _Optional[int] = ..., page_size: _Optional[int] = ..., inflight_claimed: _Optional[_Iterable[str]] = ..., inflight_released: _Optional[_Iterable[str]] = ...) -> None: ...

class SpanRecord(_message.Message):
    __slots__ = ("trace_id", "span_id", "parent_span_id", "name", "service", "instance", "start_unix_ns", "end_unix_ns", "attributes_json", "status_code", "status_message", "links")
    TRACE_ID_FIELD_NUMBER: _ClassVar[int]
    SPAN_ID_FIELD_NUMBER: _ClassVar[int]
    PARENT_SPAN_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    SERVICE_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    START_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    END_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTES_JSON_FIELD_NUMBER: _ClassVar[int]
    STATUS_CODE_FIELD_NUMBER: _ClassVar[int]
    STATUS_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    LINKS_FIELD_NUMBER: _ClassVar[int]
    trace_id: str
    span_id: str
    parent_span_id: str
    name: str
    service: str
    instance: str
    start_unix_ns: int
    end_unix_ns: int
    attributes_json: str
    status_code: int
    status_message: str
    links: _containers.RepeatedCompositeFieldContainer[SpanLink]
    def __init__(self, trace_id: _Optional[str] = ..., span_id: _Optional[str] = ..., parent_span_id: _Optional[str] = ..., name: _Optional[str] = ..., service: _Optional[str] = ..., instance: _Optional[str] = ..., start_unix_ns: _Optional[int] = ..., end_unix_ns: _Optional[int] = ..., attributes_json: _Optional[str] = ..., status_code: _Optional[int] = ..., status_message: _Optional[str] = ..., links: _Optional[_Iterable[_Union[SpanLink, _Mapping]]] = ...) -> None: ...

class SpanLink(_message.Message):
    __slots__ = ("trace_id", "span_id")
    TRACE_ID_FIELD_NUMBER: _ClassVar[int]
    SPAN_ID_FIELD_NUMBER: _ClassVar[int]
    trace_id: str
    span_id: str
    def __init__(self, trace_id: _Optional[str] = ..., span_id: _Optional[str] = ...) -> None: ...

class TracesRequest(_message.Message):
    __slots__ = ("trace_id", "request_id")
    TRACE_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    trace_id: str
    request_id: str
    def __init__(self, trace_id: _Optional[str] = ..., request_id: _Optional[str] = ...) -> None: ...

class TracesReply(_message.Message):
    __slots__ = ("spans",)
    SPANS_FIELD_NUMBER: _ClassVar[int]
    spans: _containers.RepeatedCompositeFieldContainer[SpanRecord]
    def __init__(self, spans: _Optional[_Iterable[_Union[SpanRecord, _Mapping]]] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("request_id", "token_ids", "sampling", "prefill_address", "timeout_s")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    PREFILL_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    sampling: SamplingParams
    prefill_address: str
    timeout_s: float
    def __init__(self, request_id: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., sampling: _Optional[_Union[SamplingParams, _Mapping]] = ..., prefill_address: _Optional[str] = ..., timeout_s: _Optional[float] = ...) -> None: ...

class GenerateResponse(_message.Message):
    __slots__ = ("request_id", "token_ids", "text", "prompt_tokens", "cached", "finish_reason", "matched_stop", "preemptions", "paused_s", "logprobs", "index", "prompt_logprobs", "paused")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHED_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    MATCHED_STOP_FIELD_NUMBER: _ClassVar[int]
    PREEMPTIONS_FIELD_NUMBER: _ClassVar[int]
    PAUSED_S_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    PAUSED_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    text: str
    prompt_tokens: int
    cached: CachedTokens
    finish_reason: str
    matched_stop: str
    preemptions: int
    paused_s: float
    logprobs: _containers.RepeatedCompositeFieldContainer[TokenLogprob]
    index: int
    prompt_logprobs: _containers.RepeatedCompositeFieldContainer[TokenLogprob]
    paused: bool
    def __init__(self, request_id: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., text: _Optional[str] = ..., prompt_tokens: _Optional[int] = ..., cached: _Optional[_Union[CachedTokens, _Mapping]] = ..., finish_reason: _Optional[str] = ..., matched_stop: _Optional[str] = ..., preemptions: _Optional[int] = ..., paused_s: _Optional[float] = ..., logprobs: _Optional[_Iterable[_Union[TokenLogprob, _Mapping]]] = ..., index: _Optional[int] = ..., prompt_logprobs: _Optional[_Iterable[_Union[TokenLogprob, _Mapping]]] = ..., paused: _Optional[bool] = ...) -> None: ...
