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
