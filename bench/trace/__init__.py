"""Trace replay (`pdorch bench trace`, `python -m bench.trace`), one concept per module: cli (flags,
the runs, the output), formats (which reader) and the readers mooncake, bailian, aiperf (jsonl: the
shared field checks; sessions: sessions of a trace that records none), request (a request as every
reader gives it), plan (sessions kept, time compressed, cuts), tokens (hash blocks -> exact token
ids), replay (open-loop sends, timed), run (one replay on a started or running cluster), counters
(the prefill workers' counters), ideals (instant and causal), summary, report, plots, generate
(synthetic traces in Mooncake's format). The cluster and the HTTP client are bench/multiturn's.
"""
