"""Shared pytest fixtures. Each area keeps its fixtures in its own plugin module."""

pytest_plugins = [
    "tests.fixtures.processes",
    "tests.fixtures.model",
    "tests.fixtures.store",
    "tests.fixtures.router",
    "tests.fixtures.early_children",
]
