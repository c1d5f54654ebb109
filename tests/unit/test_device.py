"""engine/device.py: a worker makes its CUDA device current (Triton and CUDA graphs use the current
device, not the tensors'); on CPU it touches nothing CUDA."""

import pytest
import torch

from engine.device import use_device


@pytest.fixture
def calls(monkeypatch):
    seen = []
    monkeypatch.setattr(torch.cuda, "set_device", seen.append)
    return seen


@pytest.mark.parametrize("device, expected", [("cuda:1", [1]), ("cuda:0", [0]), ("cuda", []), ("cpu", [])])
def test_use_device_sets_the_named_cuda_device(calls, device, expected):
    use_device(device)
    assert calls == expected


def test_a_worker_sets_its_device_before_it_loads_anything(monkeypatch, calls):
    """build_runtime() makes model.device current right after the start-up checks, before the model is prepared."""
    from pdorch.config_loader import load_config
    from pdorch.worker import runtime

    class Stop(Exception):
        pass

    def prepare(cfg, tp_size):
        assert calls == [2], "prepare ran before the device was made current"
        raise Stop

    monkeypatch.setattr(runtime, "prepare", prepare)
    monkeypatch.setattr("pdorch.worker.startup_checks.check_startup", lambda cfg: None)
    cfg = load_config(None, {"model.device": "cuda:2"}, environ={})
    with pytest.raises(Stop):
        runtime.build_runtime(cfg, num_pages=16, use_store=False)
