"""`python -m bench.trace ...`: the same as `pdorch bench trace ...` (bench/trace/cli.py)."""

from bench.trace.cli import main

raise SystemExit(main())
