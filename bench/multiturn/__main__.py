"""`python -m bench.multiturn ...`: the same as `pdorch bench multiturn ...` (bench/multiturn/cli.py)."""

from bench.multiturn.cli import main

raise SystemExit(main())
