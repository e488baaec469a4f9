"""A pool larger than the cluster it is to run on: said as GPUs when ``gpus`` is a count, as
device ids when it lists them."""

import pytest

from nereus.errors import InputError
from nereus.spec import parse_job


def _job(gpus: object, cluster: dict) -> dict:
    return {"model": "llama-3.1-8b", "gpus": gpus, "cluster": cluster}


@pytest.mark.parametrize("gpus,cluster,says", [
    (16, {"nodes": 1},
     "gpus: 16 GPUs exceed the cluster's 1 node x 8 (allowed: 1..8, or more cluster.nodes)"),
    (64, {"nodes": 2},
     "gpus: 64 GPUs exceed the cluster's 2 nodes x 8 (allowed: 1..16, or more cluster.nodes)"),
    (9, {"nodes": 2, "devices_per_node": 4},
     "gpus: 9 GPUs exceed the cluster's 2 nodes x 4 (allowed: 1..8, or more cluster.nodes)"),
])
def test_a_gpu_count_past_the_cluster_is_said_as_a_count(gpus, cluster, says):
    """`gpus: 16` on one node of 8 said 'device ids up to 15 do not fit the cluster': ids the
    user never wrote."""
    with pytest.raises(InputError) as e:
        parse_job(_job(gpus, cluster))
    assert str(e.value) == says


def test_device_ids_past_the_cluster_keep_the_ids_message():
    with pytest.raises(InputError) as e:
        parse_job(_job([0, 15], {"nodes": 1}))
    assert str(e.value) == "gpus: device ids up to 15 do not fit the cluster (allowed: 0..7)"


def test_a_count_that_fills_the_cluster_builds():
    assert parse_job(_job(16, {"nodes": 2})).pool.size == 16
