"""Fixtures for bench/scale_up_hits/test_stack.py: kept beside the test, not in tests/, so the two
share only pdorch/local_stack/ and the project."""

from __future__ import annotations

import pytest

from engine.prepare import make_tiny_model


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("tiny_model"))
