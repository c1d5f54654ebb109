"""bench/autoscale: the planner against fixed fleets on a simulated fleet (the latency model: world.py).

    python -m bench.autoscale [--json] [--duration-s S] [--max-prefill N] [--max-decode M] [--seed N]
    (= pdorch bench autoscale ...)

This machine cannot add compute by adding workers, so replicas are simulated: each one behaves as the committed
profile (profile.json, SmolLM2-135M on CPU, in `pdorch bench profile`'s format) says one replica does. Arrivals:
arrivals.py's bursty shape with a fixed seed. Reported: for every fixed fleet and for the planner, the fraction of
intervals meeting both SLOs and the replica-seconds; the planner's cost over the cheapest fixed fleet that meets
the SLOs in >= 95% of intervals (goal: <= 0.7 with the planner itself >= 95%).
"""
