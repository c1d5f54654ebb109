"""The multi-turn benchmark (`pdorch bench multiturn`, `python -m bench.multiturn`), one concept
per module: cli (flags, variants), run (one measured run), driver (clients x rounds, arrivals,
barrier), conversation + text (what each client sends), client (HTTP streaming, TTFT/ITL),
engine_backend (the single-process engine variant), cluster (`pdorch serve` on free ports),
presets, sweep (the grid of cache shapes), metrics (counters, RSS), stats (ideals, percentiles,
JSON), report (tables), plots, facts (commit, model facts, the test model). Other benchmarks
reuse these pieces.
"""
