"""Scale-up and the hit rate (`python -m bench.scale_up_hits`, `pdorch bench scale-up-hits`): the same
multi-turn workload on a fixed 2+2 fleet and on a fleet that starts 1+1 and grows to 2+2 partway;
per phase the hit rate, the new workers' share and the load spread. One concept per module: stack
(the real local stack with a LocalFleet), workload (conversations and phases), run (one measured
run), cli (runs, medians, JSON).
"""
