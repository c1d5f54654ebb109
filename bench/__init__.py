"""The benchmarks (docs/benchmarks.md), one package per study; a package so that pytest, collecting
bench/*/test_*.py, puts the repository root on sys.path rather than bench/ (bench/engine would shadow engine)."""
