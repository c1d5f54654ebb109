"""The planner section: bounds between keys and URL lists are refused naming the key."""

import pytest

from pdorch.config_loader import ConfigError, load_config


def test_min_above_max_is_refused_naming_the_key():
    with pytest.raises(ConfigError, match=r"planner.min_decode: expected a value at most planner.max_decode \(2\), "
                       "got 3"):
        load_config(None, {"planner.min_decode": "3", "planner.max_decode": "2"})
    cfg = load_config(None, {"planner.min_prefill": "2", "planner.max_prefill": "2"})
    assert (cfg.planner.min_prefill, cfg.planner.max_prefill) == (2, 2)


def test_router_urls_must_be_urls_and_mode_a_choice():
    with pytest.raises(ConfigError, match=r"planner.router_urls: expected a list of http:// or https:// URLs"):
        load_config(None, {"planner.router_urls": "127.0.0.1:8390"})
    with pytest.raises(ConfigError, match=r"planner.mode: expected one of act, dry-run"):
        load_config(None, {"planner.mode": "yes"})
    cfg = load_config(None, {"planner.router_urls": "http://r0:8390,http://r1:8390"})
    assert cfg.planner.router_urls == ("http://r0:8390", "http://r1:8390")


def test_scale_down_utilisation_above_scale_up_is_refused():
    with pytest.raises(ConfigError, match=r"planner.scale_down_utilization: expected a value at most "
                       r"planner.scale_up_utilization \(0.7\), got 0.8"):
        load_config(None, {"planner.scale_up_utilization": "0.7", "planner.scale_down_utilization": "0.8"})
