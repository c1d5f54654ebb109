"""A file generated from the code and committed (docs/configuration.md, the chart's values schema)."""

from __future__ import annotations

import sys
from pathlib import Path


def write_or_check(path: Path, text: str, check: bool, command: str) -> int:
    """Write `text` to `path`, or with `check` only compare: exit status 1 (and say to run `command`)
    when the file is missing or differs, else 0."""
    if check:
        if not path.is_file() or path.read_text() != text:
            print(f"{path} is stale; run: {command}", file=sys.stderr)
            return 1
        return 0
    path.write_text(text)
    print(f"wrote {path}")
    return 0
