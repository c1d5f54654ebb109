"""`python -m bench.sampling STUDY ...`: what the sampling features of issue 39 cost, one study per
sub-command, each with its own flags (--help).

    python -m bench.sampling grammar-overhead [--json] [...]   structured outputs and sampling controls:
                                                               their cost per decode step (grammar_overhead.py)
    python -m bench.sampling parallel [--json] [...]           n > 1: the P -> D bytes and wall time of one
                                                               request of n against n of one (parallel.py)
    python -m bench.sampling penalty-overhead [--json] [...]   penalties per decode step: counts kept per request
                                                               against rebuilt from each history (penalty_overhead.py)
    python -m bench.sampling token-masks [--json] [...]        allowed_token_ids, bad_words, min_tokens and the
                                                               no-token check: their cost per step (token_masks.py)
"""

import importlib
import sys

STUDIES = {"grammar-overhead": "grammar_overhead", "parallel": "parallel", "penalty-overhead": "penalty_overhead",
           "token-masks": "token_masks"}


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in STUDIES:
        print(__doc__, file=sys.stderr)
        return 0 if argv[:1] in (["-h"], ["--help"]) else 2
    return importlib.import_module(f"bench.sampling.{STUDIES[argv[0]]}").main(argv[1:])


raise SystemExit(main(sys.argv[1:]))
