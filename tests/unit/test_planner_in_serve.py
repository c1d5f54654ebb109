"""The planner inside `pdorch serve --autoscale`: what is checked before anything starts."""

from __future__ import annotations

import socket

from pdorch.config_loader import load_config
from pdorch.planner.in_serve import planner_port_taken


def test_a_taken_planner_port_is_named_before_anything_starts():
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        s.listen()
        port = s.getsockname()[1]
        err = planner_port_taken(load_config(None, {"planner.metrics_port": port}, environ={}))
        assert err is not None and f"planner.metrics_port {port}" in err
    assert planner_port_taken(load_config(None, {"planner.metrics_port": port}, environ={})) is None
    assert planner_port_taken(load_config(None, {"planner.metrics_port": 0}, environ={})) is None
