"""Plans that survive the loss of one node: exposure, spread placement, the spread search."""

import pytest

from nereus.cost.candidate import Candidate, Layout
from nereus.errors import InfeasibleError
from nereus.plan.exposure import exposed_by_node, exposed_fraction
from nereus.plan.placement import GroupAssignment, place_phase
from nereus.plan.search import Planner, ReplicaExceedsNode, best_plan
from nereus.plan.types import Plan, StagePlan
from nereus.plan.validate import validate_plan
from nereus.spec import GpuPool, parse_job

JOB = {"model": "llama-3.1-8b", "algo": "ppo", "gpus": 16,
       "cluster": {"device": "h100-sxm-80gb", "devices_per_node": 8},
       "workload": {"response_len": 2000, "response_len_max": 3000}}


@pytest.fixture(scope="module")
def job():
    return parse_job(JOB)


def _plan(*stages):
    return Plan(tuple(StagePlan(name, Candidate(Layout(len(reps[0]), 1), len(reps), 1, 1), reps,
                                1.0, 0) for name, reps in stages), 1.0)


def test_a_stage_whose_replicas_all_touch_one_node_is_exposed_by_it(job):
    p = _plan(("a", ((0, 1), (8, 9))),          # a copy on each node
              ("b", ((2, 3), (4, 5))),          # both copies on node 0
              ("c", ((6, 7, 8, 9),)))           # one copy across both nodes
    by_node = exposed_by_node(p, job.cluster)
    assert by_node == {0: ("b", "c"), 1: ("c",)}
    assert exposed_fraction(p, job.cluster) == 1.0
    safe = _plan(("a", ((0, 1), (8, 9))), ("b", ((2, 3), (10, 11))))
    assert exposed_by_node(safe, job.cluster) == {0: (), 1: ()}
    assert exposed_fraction(safe, job.cluster) == 0.0


def test_a_copy_of_theta_exposes_a_node_only_with_its_training_stage(job):
    """Generation (a copy of the actor's θ) with every replica on node 1 is given θ again by
    actor_train while actor_train keeps a replica elsewhere; where actor_train is on node 1
    alone too, both are lost there. The frozen reference is read again either way."""
    wf = job.workflow
    p = _plan(("actor_gen", ((8, 9),)), ("reference_infer", ((10, 11),)),
              ("actor_train", ((0, 1), (12, 13))))
    assert exposed_by_node(p, job.cluster, wf) == {0: (), 1: ()}
    assert exposed_by_node(p, job.cluster) == {0: (), 1: ("actor_gen", "reference_infer")}
    q = _plan(("actor_gen", ((8, 9),)), ("reference_infer", ((10, 11),)),
              ("actor_train", ((12, 13),)))
    assert exposed_by_node(q, job.cluster, wf) == {1: ("actor_gen", "actor_train")}


def test_spread_placement_puts_replicas_on_different_nodes(job):
    pool = job.pool
    grp = [GroupAssignment(("x",), (Candidate(Layout(4, 1), 2, 1, 1),)),
           GroupAssignment(("y",), (Candidate(Layout(2, 2), 2, 1, 1),))]
    packed = place_phase(pool, grp)
    spread = place_phase(pool, grp, spread=True)
    node = job.cluster.node_of
    assert any(len({node(r[0]) for r in reps}) == 1 for reps in packed.values())  # best fit
    for reps in spread.values():
        assert len({node(r[0]) for r in reps}) == 2
        assert all(job.cluster.same_node(r) for r in reps)  # replicas stay inside nodes


def test_the_spread_plan_survives_any_one_node_and_is_valid(job):
    plain = Planner(job).best_placed()
    assert exposed_fraction(plain, job.cluster) > 0  # the packed plan leaves a last copy
    spread = best_plan(job, spread=True)
    # the best plan is the faster of the two (here the spread one: it syncs inside nodes)
    assert best_plan(job).step_latency_s == pytest.approx(
        min(plain.step_latency_s, spread.step_latency_s))
    assert all(v == () for v in exposed_by_node(spread, job.cluster).values())
    assert all(sp.candidate.dp >= 2 for sp in spread.stages)
    assert validate_plan(job, spread) == []
    # a constraint can only cost time, but for the weight sync: replicas over nodes can put
    # every generation GPU on a node with training GPUs (the node fabric, not the network)
    assert spread.step_latency_s - spread.terms["weight_sync"] >= \
        plain.step_latency_s - plain.terms["weight_sync"] - 1e-9


def test_a_spread_search_says_whether_more_gpus_could_help():
    """It said 'no layout with two replicas inside nodes that fits on 128 GPUs' also where a
    replica that fits memory spans more than a node, which no pool size changes."""
    big = parse_job({"model": "llama-3.3-70b", "gpus": 128})
    with pytest.raises(ReplicaExceedsNode) as e:
        Planner(big, spread=True)
    assert (e.value.stage, e.value.replica_gpus, e.value.node_gpus) == ("actor_train", 32, 8)
    assert "128" not in str(e.value)
    # nodes of 32: a replica of 32 fits one, two of them do not fit 48 GPUs, 64 would
    wide = parse_job({"model": "llama-3.3-70b", "gpus": 48, "cluster": {"devices_per_node": 32}})
    with pytest.raises(InfeasibleError, match="two replicas inside nodes that fits on 48") as f:
        Planner(wide, spread=True)
    assert not isinstance(f.value, ReplicaExceedsNode)


def test_spread_changes_nothing_on_one_node(job):
    one = job.with_pool(GpuPool(job.cluster, tuple(range(8))))
    assert not Planner(one, spread=True).spread
    assert best_plan(one, spread=True).to_dict() == best_plan(one).to_dict()


@pytest.mark.parametrize("gpus,execution", [(16, "sync"), (20, "sync"), (24, "async")])
def test_a_spread_planner_given_the_packed_planners_prices_plans_alike(gpus, execution):
    """``best`` hands the spread planner the candidates it already priced; filtering them by
    the spread rule must give the plan the spread planner finds by pricing its own."""
    from nereus.cost.model import CostModel

    job = parse_job({"model": "llama-3.1-8b", "algo": "ppo", "execution": execution,
                     "gpus": gpus, "workload": {"response_len": 2048}})
    cost = CostModel(job)
    own = Planner(job, cost=cost, spread=True).best_placed()
    given = Planner(job, cost=cost, spread=True,
                    evaluated=Planner(job, cost=cost).evaluated).best_placed()
    assert given.to_dict() == own.to_dict()
