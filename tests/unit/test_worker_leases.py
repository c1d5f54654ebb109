"""IOLeases (pdorch/worker/leases.py): a lease taken twice or given back unheld raises, naming it."""

import pytest

from pdorch.worker.leases import IOLeases, LeaseError


def test_leases_are_named_and_counted_exactly():
    io = IOLeases()
    io.take(("step_write", 3))
    io.take(("step_write", 4))
    assert len(io) == 2 and ("step_write", 3) in io
    with pytest.raises(LeaseError, match="taken twice"):
        io.take(("step_write", 4))
    io.give_back(("step_write", 3))
    with pytest.raises(LeaseError, match="not held"):
        io.give_back(("step_write", 3))  # a doubled completion: caught, not a count gone negative
    io.give_back(("step_write", 4))
    assert len(io) == 0
