"""`python -m bench.soak ...`: the same as `pdorch bench soak ...` (bench/soak/cli.py)."""

from bench.soak.cli import main

raise SystemExit(main())
