from nereus.plan.overlap import critical_path, overlap_graph
from nereus.spec.workflow import get_workflow

LAT = {"actor_gen": 10.0, "reference_infer": 2.0, "reward_infer": 3.0, "critic_infer": 4.0,
       "actor_train": 6.0, "critic_train": 5.0}


def test_sync_phases_add_and_groups_serialize():
    wf = get_workflow("ppo")
    concurrent = [("actor_gen",), ("reference_infer",), ("reward_infer",), ("critic_infer",),
                  ("actor_train",), ("critic_train",)]
    length, path = critical_path(overlap_graph(wf, concurrent, LAT, 1.0))
    assert length == 10 + 4 + 6 + 1
    assert path == ["actor_gen", "critic_infer", "actor_train", "weight_sync"]
    shared = [("actor_gen",), ("reference_infer", "reward_infer", "critic_infer"),
              ("actor_train", "critic_train")]
    length, _ = critical_path(overlap_graph(wf, shared, LAT, 1.0))
    assert length == 10 + 9 + 11 + 1


def test_async_interval_overlaps_generation():
    wf = get_workflow("grpo", "async")
    groups = [("actor_gen",), ("reference_infer",), ("reward_infer",), ("actor_train",)]
    length, _ = critical_path(overlap_graph(wf, groups, LAT, 0.5))
    assert length == max(10, 3 + 6) + 0.5
