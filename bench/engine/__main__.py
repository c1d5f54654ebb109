"""python -m bench.engine (see bench/engine/run.py)."""

from bench.engine.run import main

raise SystemExit(main())
