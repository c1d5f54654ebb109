"""`python -m bench.profile ...`: the same as `pdorch bench profile ...` (bench/profile/cli.py)."""

from bench.profile.cli import main

raise SystemExit(main())
