"""The type checker holds the packages named in pyproject.toml's [tool.mypy] (router/, decode_node/,
prefill_node/, pdorch/worker/, store_client/): wrong attribute and argument types fail the suite.

Runs mypy as `make test` runs everything else (its cache, .mypy_cache/, makes a rerun a few seconds).
To see the errors by hand: `.venv/bin/python -m mypy`."""

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_named_packages_type_check_clean():
    run = subprocess.run([sys.executable, "-m", "mypy"], check=False, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, f"mypy found errors:\n{run.stdout}{run.stderr}"
    assert "Success: no issues found" in run.stdout, run.stdout
