"""store_client/ports.py: ports for test servers never come from the kernel's ephemeral range."""

from __future__ import annotations

import socket

from store_client import ports


def test_free_ports_are_below_the_ephemeral_range_distinct_and_bindable():
    low = ports._ephemeral_start()
    got = [ports.free_port() for _ in range(200)]
    assert len(set(got)) == len(got)
    assert all(10000 <= p < low for p in got)
    assert not [p for p in got if 12300 <= p <= 14300 or 15000 <= p <= 17000]  # Mooncake picks its own there
    with socket.socket() as s:
        s.bind(("127.0.0.1", got[-1]))


def test_a_taken_or_already_given_port_is_not_returned(monkeypatch):
    given, taken, fresh = ports.free_port(), ports.free_port(), ports.free_port()
    ports._handed_out.discard(taken)
    ports._handed_out.discard(fresh)
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", taken))
        holder.listen()
        picks = iter([given, taken, fresh])
        monkeypatch.setattr(ports.random, "randrange", lambda a, b: next(picks))
        assert ports.free_port() == fresh


def test_a_run_of_ports_is_free_consecutive_and_outside_mooncakes_ranges():
    for _ in range(50):
        base = ports.free_port_run(4)
        run = range(base, base + 4)
        assert not [p for p in run if ports.mooncake_may_take(p)]
        with socket.socket() as a, socket.socket() as b:
            a.bind(("127.0.0.1", run[1]))
            b.bind(("127.0.0.1", run[3]))
