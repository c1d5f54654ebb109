"""bench/reliability: the stack under faults and pressure: worker and master failover, decode preemption,
overload, a soak (soak/), a worker's exit (worker_exit.py). Each runs as
`python -m bench.reliability.<name>`."""
