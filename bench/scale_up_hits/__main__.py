"""`python -m bench.scale_up_hits ...`: the same as `pdorch bench scale-up-hits ...` (bench/scale_up_hits/cli.py)."""

from bench.scale_up_hits.cli import main

raise SystemExit(main())
