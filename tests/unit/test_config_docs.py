"""docs/configuration.md is generated from the schema and must not go stale."""

from __future__ import annotations

import dataclasses

from pdorch import config_docs
from pdorch.config_loader import SECTIONS, env_var


def test_configuration_md_is_up_to_date():
    assert config_docs.DOC_PATH.read_text() == config_docs.render(), (
        "docs/configuration.md is stale; run: python -m pdorch.config_docs")


def test_check_mode_detects_a_stale_file(tmp_path):
    stale = tmp_path / "configuration.md"
    stale.write_text(config_docs.render().replace("decode", "deocde", 1))
    assert config_docs.main(["--check", "--path", str(stale)]) == 1
    assert config_docs.main(["--path", str(stale)]) == 0
    assert config_docs.main(["--check", "--path", str(stale)]) == 0


def test_every_key_has_help_and_appears_with_its_env_var():
    text = config_docs.render()
    for section, cls in SECTIONS.items():
        assert f"## `{section}`" in text
        assert cls.__doc__ and not cls.__doc__.startswith(cls.__name__ + "("), f"{cls.__name__} needs a docstring"
        for f in dataclasses.fields(cls):
            assert f.metadata.get("help"), f"{section}.{f.name} has no help text"
            assert f"| `{f.name}` |" in text and env_var(section, f.name) in text


def test_readme_quickstart_matches_the_embedded_config():
    from pdorch.config_loader import default_config_path, load_config

    cfg = load_config(default_config_path(), environ={})
    readme = (config_docs.DOC_PATH.parent.parent / "README.md").read_text()
    url = f"http://{cfg.router.host}:{cfg.router.port}"
    assert f"curl -s {url}/v1/chat/completions" in readme
    assert f'base_url="{url}/v1"' in readme
    assert readme.count(f'"model": "{cfg.model.served_name}"') + readme.count(f'model="{cfg.model.served_name}"') == 2
