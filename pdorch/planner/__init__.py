"""The planner: sizes the prefill and decode fleets against TTFT / ITL targets (docs/operations.md, "Autoscaling").

observe (routers' and workers' /metrics) -> predict (next interval's load) -> decide (replicas per role from a
profile's per-replica capacity, with bounds, cooldowns and hysteresis) -> an actuator (local, kubernetes,
external). `PlannerRunner` (runner.py) runs that loop. Torch-free.
"""
