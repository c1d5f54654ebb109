"""bench/engine: the engine in one process: against transformers (run.py), model load, decode staging,
tensor-parallel steps and transfers."""
