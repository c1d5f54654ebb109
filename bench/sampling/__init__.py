"""What the sampling features of issue 39 cost: grammar_overhead.py (structured outputs and
sampling controls, per decode step, in one process) and parallel.py (n > 1 against n requests of
one, on a `pdorch serve` cluster). One entry, `python -m bench.sampling STUDY` (__main__.py).
"""
