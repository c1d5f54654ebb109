"""The router's dispatch room: the P/D choice (`policies.py`), running a request on a pair with one
deadline across retries (`dispatch.py`), mid-stream failover (`failover.py`) and each request's spans
(`request_trace.py`). It reads the KV index of `router.kv`, the workers of `router.fleet`, and streams
through `router.grpc`; it knows nothing of HTTP (router/http/ calls it, never the other way)."""
