"""The router's fleet room: the workers it knows (`workers.py`: channels, health, load, circuit state),
how they join and leave (`discovery.py`: a static list or etcd), the circuit breaker (`circuit.py`) and
the KV layout a worker must share to join (`layout.py`). Both `router.dispatch` and `router.kv` read it;
it imports neither (only `router.grpc`, for a worker's Generate channel)."""
