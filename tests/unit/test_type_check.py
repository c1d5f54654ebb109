"""The type checker holds the packages named in pyproject.toml's [tool.mypy] (router/, decode_node/,
prefill_node/, pdorch/worker/, store_client/): wrong attribute and argument types fail the suite.

mypy runs as `make test` runs everything else, started when the session's tests are collected
(tests/fixtures/early_children.py: beside the other tests, at the lowest priority); its cache, .mypy_cache/,
makes a rerun a few seconds. To see the errors by hand: `.venv/bin/python -m mypy`."""


def test_named_packages_type_check_clean(type_check):
    code, output, errors = type_check.result()
    output += errors
    assert code == 0, f"mypy found errors:\n{output}"
    assert "Success: no issues found" in output, output
