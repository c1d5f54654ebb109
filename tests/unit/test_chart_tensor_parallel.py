"""The chart's tensor-parallel workers: prefill/decode.tpSize sets config.<role>.tp_size (the ranks, in
one pod) and the pod's GPUs (gpus per rank x tpSize); a config that disagrees is refused by name."""

from __future__ import annotations

import pytest
import yaml

from tests.fixtures.chart import FULLNAME, containers, find, render_chart

GPU_VALUES = {"config": {"model": {"device": "cuda"}}, "prefill": {"tpSize": 2, "gpus": 1},
              "decode": {"tpSize": 4, "gpus": 1}}


def test_tp_size_sets_the_config_and_the_gpus_of_each_pod():
    objs = render_chart(GPU_VALUES)
    cfg = yaml.safe_load(find(objs, "ConfigMap", f"{FULLNAME}-config")["data"]["config.yaml"])
    assert (cfg["prefill"]["tp_size"], cfg["decode"]["tp_size"]) == (2, 4)
    for role, gpus in (("prefill", 2), ("decode", 4)):
        res = containers(find(objs, "Deployment", f"{FULLNAME}-{role}"))[0]["resources"]
        assert res["limits"]["nvidia.com/gpu"] == gpus and res["requests"]["nvidia.com/gpu"] == gpus


def test_default_is_one_rank_and_no_gpu():
    objs = render_chart({})
    cfg = yaml.safe_load(find(objs, "ConfigMap", f"{FULLNAME}-config")["data"]["config.yaml"])
    assert (cfg["prefill"]["tp_size"], cfg["decode"]["tp_size"]) == (1, 1)
    res = containers(find(objs, "Deployment", f"{FULLNAME}-decode"))[0]["resources"]
    assert "nvidia.com/gpu" not in res["limits"]


def test_a_config_tp_size_other_than_tp_size_is_refused_by_name():
    with pytest.raises(Exception, match=r"config.decode.tp_size \(2\) differs from decode.tpSize \(4\)"):
        render_chart({**GPU_VALUES, "config": {"model": {"device": "cuda"}, "decode": {"tp_size": 2}}})


def test_a_tp_size_the_workers_do_not_support_is_refused_by_the_schema():
    from helm_python import HelmValuesError

    with pytest.raises(HelmValuesError, match="tpSize"):
        render_chart({"prefill": {"tpSize": 3}})
