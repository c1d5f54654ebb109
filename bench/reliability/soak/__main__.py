"""`python -m bench.reliability.soak ...`: the same as `pdorch bench soak ...` (bench/reliability/soak/cli.py)."""

from bench.reliability.soak.cli import main

raise SystemExit(main())
