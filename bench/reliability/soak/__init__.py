"""The soak (`pdorch bench soak`, `python -m bench.reliability.soak`): cli.py drives N minutes of steady
multi-turn traffic and judges it; report.py reads the cluster besides its HTTP answers (pool states,
idle wait, the cluster start) and judges and draws the RSS series. The overload and failover
benchmarks read the cluster through report.py too.
"""
