"""Start-up checks: each misconfiguration is one line naming the key or the package."""

import subprocess
import sys

import pytest

from pdorch.config import Config, ModelConfig
from pdorch.worker.startup_checks import MachineFacts, probe, problems
from store_client.config import StoreConfig

CPU_BOX = MachineFacts("2.13.0+cpu", None, 0, ("mooncake-transfer-engine-non-cuda",), ())
GPU_BOX = MachineFacts("2.13.0+cu130", "13.0", 2, ("mooncake-transfer-engine",), ("mlx5_0", "mlx5_1"))


def cfg(device="cpu", protocol="tcp", device_name=""):
    return Config(model=ModelConfig(device=device), store=StoreConfig(protocol=protocol, device_name=device_name))


def test_a_good_setup_has_no_problem():
    assert problems(cfg(), CPU_BOX) == []
    assert problems(cfg("cuda:1", "rdma", "mlx5_1"), GPU_BOX) == []


def test_cuda_device_without_cuda_torch():
    (line,) = problems(cfg("cuda"), MachineFacts("2.13.0+cpu", None, 0, (), ()))
    assert line.startswith("model.device cuda: this torch (2.13.0+cpu) is a CPU build")


def test_gpu_index_not_visible():
    (line,) = problems(cfg("cuda:2"), GPU_BOX)
    assert line.startswith("model.device cuda:2: 2 GPU(s) visible")


def test_cuda_pool_with_the_non_cuda_mooncake_wheel():
    box = MachineFacts("2.13.0+cu130", "13.0", 1, ("mooncake-transfer-engine-non-cuda",), ())
    (line,) = problems(cfg("cuda"), box)
    assert "mooncake-transfer-engine-non-cuda cannot register GPU memory" in line
    assert "install mooncake-transfer-engine instead" in line


def test_rdma_without_devices_and_unknown_device_name():
    (line,) = problems(cfg(protocol="rdma"), CPU_BOX)
    assert line.startswith("store.protocol rdma: no RDMA device on this machine")
    (line,) = problems(cfg("cuda", "rdma", "mlx5_0,mlx5_9"), GPU_BOX)
    assert line == "store.device_name mlx5_9: no such RDMA device (found: mlx5_0, mlx5_1)"


def test_every_problem_is_reported_at_once():
    lines = problems(cfg("cuda", "rdma"), CPU_BOX)
    assert [line.split(":")[0] for line in lines] == ["model.device cuda", "model.device cuda", "store.protocol rdma"]


def test_probe_reads_this_machine():
    import torch

    facts = probe()
    assert facts.torch_version == torch.__version__ and facts.torch_cuda == torch.version.cuda
    assert "mooncake-transfer-engine-non-cuda" in facts.mooncake_wheels  # what make setup installs


def test_worker_refuses_cuda_here_with_one_line_and_no_traceback(tmp_path):
    """This CPU machine, `device: cuda`: the decode worker exits at once naming the key and the wheel."""
    proc = subprocess.run([sys.executable, "-m", "decode_node", "--set", "model.device=cuda",
                           "--set", f"model.cache_dir={tmp_path}"], capture_output=True, text=True, timeout=120,
                          check=False)
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert "Traceback" not in proc.stderr
    assert lines[-2].startswith("python -m decode_node: model.device cuda: this torch")
    assert "mooncake-transfer-engine-non-cuda cannot register GPU memory" in lines[-1]


@pytest.mark.parametrize("tp_size, words", [
    (8, "tp_size=8 must divide num_attention_heads"),  # the tiny model: 4 query heads, 2 KV heads
])
def test_a_tp_size_the_model_cannot_be_split_by_is_refused_naming_the_keys(tiny_model_dir, tmp_path, tp_size,
                                                                          words):
    from dataclasses import replace

    from pdorch.config_loader import load_config
    from pdorch.worker.runtime import prepare
    from pdorch.worker.startup_checks import StartupError

    config = load_config(None)
    config = replace(config, model=replace(config.model, source=str(tiny_model_dir), cache_dir=str(tmp_path)))
    with pytest.raises(StartupError, match=rf"prefill.tp_size / decode.tp_size: {words}"):
        prepare(config, tp_size)
    model_dir, _ = prepare(config, 4)  # 4 ranks of 4 query heads, the 2 KV heads replicated: fine
    assert model_dir.exists()
