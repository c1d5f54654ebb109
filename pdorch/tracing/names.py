"""Span and attribute names every process uses, in one place (docs/operations.md, "Reading a trace").

Attribute names are `pdorch.<noun>[.<detail>]`, lower case, values plain (str, int, float, bool, or a list
of one of them): `pdorch trace` prints the ones in KEY_ATTRIBUTES next to each span.
"""

from __future__ import annotations

# Service names (the OpenTelemetry resource's service.name): which process a span comes from.
ROUTER_SERVICE = "pdorch-router"
DECODE_SERVICE = "pdorch-decode"
PREFILL_SERVICE = "pdorch-prefill"

# --- attributes every request span carries
REQUEST_ID = "pdorch.request_id"
MODEL = "pdorch.model"

# --- the router's request span
POLICY = "pdorch.policy"  # the P choice's policy (round_robin, least_load, cache_aware)
POLICY_SCORES = "pdorch.policy.scores"  # the candidates as the policy weighed them: "address load=N, ..."
PREFILL_WORKER = "pdorch.prefill"  # chosen P (address)
DECODE_WORKER = "pdorch.decode"  # chosen D (address)
RETRIES = "pdorch.retries"
FAILOVERS = "pdorch.failovers"
PREEMPTIONS = "pdorch.preemptions"
PROMPT_TOKENS = "pdorch.prompt_tokens"
COMPLETION_TOKENS = "pdorch.completion_tokens"
CACHED_TOKENS = "pdorch.cached_tokens"  # + "." + tier (device, host, store, ssd, inflight)
FINISH_REASON = "pdorch.finish_reason"
HTTP_STATUS = "http.response.status_code"  # the status the client saw
ERROR_CODE = "pdorch.error.code"  # the OpenAI error code the client saw

# --- worker spans (filled in by the workers: pages by tier, miss reasons, bytes, durations)
PAGES = "pdorch.pages"  # + "." + tier or "." + miss reason
BYTES = "pdorch.bytes"
TRANSPORT = "pdorch.transport"
KEYS = "pdorch.keys"
CHUNKS = "pdorch.chunks"
WORKER_ID = "pdorch.worker"

# The attributes `pdorch trace` prints next to a span, in this order (CACHED_TOKENS and PAGES: each
# tier's and reason's, pdorch.cached_tokens.store, pdorch.pages.evicted, ...; the rest: that name only).
KEY_ATTRIBUTES = (POLICY, "pdorch.policy.decision", PREFILL_WORKER, DECODE_WORKER, RETRIES, FAILOVERS,
                  PREEMPTIONS, CACHED_TOKENS, PAGES, BYTES, TRANSPORT, CHUNKS, FINISH_REASON, HTTP_STATUS, ERROR_CODE)
KEY_PREFIXES = (CACHED_TOKENS, PAGES)

# --- the workers' spans (docs/operations.md, "Worker spans"); each a child of the worker's RPC span
# (decode.generate / prefill.prefill), but the store writes: spans of their own LINKED to the requests.
DECODE_ADMISSION = "decode.admission"  # pages for the prompt: D's prefix-cache hits, the wait under the watermark
DECODE_PREFIX = "decode.prefix_match"  # where each prompt page comes from (the prompt plan) and what D read
DECODE_STORE_READ = "decode.store_read"  # D's own store read of prompt pages
DECODE_FIRST_TOKEN = "decode.first_token"  # the Generate call's arrival -> its first token
DECODE_STREAM = "decode.stream"  # first token -> the stream's end (finish reason or error)
DECODE_PREEMPTED = "decode.preempted"  # preempted -> resumed (and an event of that name on decode.generate)
DECODE_STORE_WRITE = "decode.store_write"  # one decode step's store write (offload, local write-back)
PREFILL_QUEUE = "prefill.queue"  # Prefill arrived -> its pages allocated
PREFILL_PREFIX = "prefill.prefix_match"  # pages allocated -> every reusable page in place or known missing
PREFILL_STORE_READ = "prefill.store_read"  # the task's one store load
PREFILL_DECODE_READ = "prefill.decode_read"  # the read of prefix pages from D's pool
PREFILL_COMPUTE = "prefill.compute"  # first forward -> first token sampled (pdorch.chunks forwards)
PREFILL_PUSH = "prefill.kv_push"  # the KV transfer into D's pages
PREFILL_STORE_WRITE = "prefill.store_write"  # the task's write-back (and backfill) to the store

# Miss reasons: pdorch.pages.<reason> counts the reusable pages recomputed for that reason.
# NOTE: the store answers "absent" alike for a page never written and for one evicted, so that is
# NOT_IN_STORE; EVICTED only where the page was seen in the store moments before (D's existence check).
MISS_NOT_IN_STORE = "not_in_store"
MISS_EVICTED = "evicted"  # present at D's existence check, gone at its read
MISS_STORE_UNAVAILABLE = "store_unavailable"  # the store off, disconnected, timed out or too slow to answer
MISS_LAYOUT_MISMATCH = "layout_mismatch"  # an object of another size under the page's key
MISS_TRANSFER_FAILED = "transfer_failed"  # the store had it; moving its bytes failed
MISS_GIVEN_UP = "load_given_up"  # prefill.prefetch_policy stopped waiting for the store load
MISS_DECODE_READ_FAILED = "decode_read_failed"  # the read from D's pool failed
MISS_NOT_REUSED = "not_reused"  # prompt_logprobs asked: every position is computed
MISS_REASONS = (MISS_NOT_IN_STORE, MISS_EVICTED, MISS_STORE_UNAVAILABLE, MISS_LAYOUT_MISMATCH,
                MISS_TRANSFER_FAILED, MISS_GIVEN_UP, MISS_DECODE_READ_FAILED, MISS_NOT_REUSED)

PLAN = "pdorch.plan"  # decode: where the prompt KV comes from (local / prefill) and why, "prefill:long_tail"
QUEUE_S = "pdorch.queue_s"  # decode admission: seconds waited for pages
PAGES_HOLES = "pdorch.pages.holes"  # reusable pages computed (every miss reason summed)
PAGES_WRITTEN = "pdorch.pages.written"  # store writes: pages the store holds now (written or there already)
PAGES_FAILED = "pdorch.pages.failed"  # store writes: pages not written
WRITE_KIND = "pdorch.write.kind"  # store writes: offload, writeback (comma-joined when a step has both)
STORE_RESULT = "pdorch.store.result"  # a store op's answer: ok or the first failure's reason
TOKENS = "pdorch.tokens"  # tokens computed (prefill.compute) or generated (decode.stream)
LINKED_REQUESTS = "pdorch.requests"  # a write shared by several requests: their ids
