"""The router's dispatch room: what the handlers share (`service.py`: tokenization, admission, job
runs), the P/D choice (`policies.py`), running a request on a pair with one deadline across retries
(`dispatch.py`), mid-stream failover, and the workers themselves (discovery, health, circuit
breakers). It reads the KV index of `router.kv` and streams through `router.grpc`."""
