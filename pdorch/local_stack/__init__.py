"""A pdorch stack started on this machine, for the tests and the benchmarks alike: tiny random
checkpoints, stand-in workers, a real mooncake_master / etcd / worker processes, the router on a thread.
Not production code: nothing under the served packages imports it."""
