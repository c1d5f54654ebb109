"""python -m bench.gpu_check (see bench/gpu_check/run.py)."""

from bench.gpu_check.run import main

raise SystemExit(main())
