"""store_client/ports.py: ports for test servers never come from the kernel's ephemeral range."""

from __future__ import annotations

import socket

from store_client import ports


def test_free_ports_are_below_the_ephemeral_range_distinct_and_bindable():
    low = ports._ephemeral_start()
    got = [ports.free_port() for _ in range(200)]
    assert len(set(got)) == len(got)
    assert all(10000 <= p < low for p in got)
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
