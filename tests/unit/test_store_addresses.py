"""store.master_address and store.metadata_server: both forms Mooncake deployments use."""

from __future__ import annotations

import pytest

from pdorch.config_loader import load_config, parse_overrides
from store_client.addresses import check_metadata_server, metadata_for_mooncake, parse_master_address


def test_one_master_and_ha_masters_behind_etcd():
    one = parse_master_address("10.0.0.5:50051")
    assert not one.ha and one.endpoints == (("10.0.0.5", 50051),) and one.mooncake == "10.0.0.5:50051"
    ha = parse_master_address("etcd://e1:2379;etcd://e2:2379;e3:2379")
    assert ha.ha and ha.endpoints == (("e1", 2379), ("e2", 2379), ("e3", 2379))
    assert ha.etcd_endpoints == ("e1:2379", "e2:2379", "e3:2379")
    assert ha.mooncake == "etcd://e1:2379;e2:2379;e3:2379"
    assert parse_master_address("[::1]:7").endpoints == (("[::1]", 7),)


@pytest.mark.parametrize("bad", ["etcd://", "etcd://e1", "etcd://e1:2379;", "etcd://e1:99999", "e1", "http://e1:1",
                                 "etcd://e1:2379;http://e2:1"])
def test_a_malformed_master_address_names_the_key_and_the_forms(bad):
    with pytest.raises(ValueError) as e:
        parse_master_address(bad)
    assert "store.master_address" in str(e.value) and "etcd://host:port" in str(e.value)
    with pytest.raises(ValueError) as e:  # the config loader refuses it too, naming the key
        load_config(None, parse_overrides([f"store.master_address={bad}"]))
    assert "store.master_address" in str(e.value)


def test_metadata_server_http_or_etcd():
    check_metadata_server("http://127.0.0.1:8180/metadata")
    check_metadata_server("etcd://e1:2379;etcd://e2:2379")
    assert metadata_for_mooncake("http://m:8180/metadata") == "http://m:8180/metadata"
    assert metadata_for_mooncake("etcd://e1:2379;etcd://e2:2379") == "etcd://e1:2379;e2:2379"
    for bad in ("e1:2379", "etcd://e1", "ftp://x"):
        with pytest.raises(ValueError, match="store.metadata_server"):
            check_metadata_server(bad)
        with pytest.raises(ValueError, match="store.metadata_server"):
            load_config(None, parse_overrides([f"store.metadata_server={bad}"]))
