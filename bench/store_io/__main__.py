"""python -m bench.store_io (see bench/store_io/run.py)."""

from bench.store_io.run import main

raise SystemExit(main())
