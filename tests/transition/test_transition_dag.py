"""Local DAGs (order, last copy, no copies of resident shards) and the global DAG's resource
edges (release before acquire, ownership, acyclicity, infeasibility reasons)."""

from __future__ import annotations

from dataclasses import replace
from itertools import pairwise

import networkx as nx
import pytest

from nereus.cost.candidate import Layout
from nereus.cost.ops import OpClass
from nereus.errors import InputError
from nereus.plan.types import Plan
from nereus.transition.global_dag import RESOURCE, STATE
from nereus.transition.planner import in_two_moves, plan_transition, transition_dag
from nereus.transition.primitives import Destroy, Extend, Merge, Split
from nereus.transition.validate import validate

from transition_testlib import job8b, sp, tiny_job

CAP_1MB = 1e6 / 0.9 / 2**30  # device memory (GiB) whose 90 % is 1 MB
CAP_05MB = 5e5 / 0.9 / 2**30


def edges_of(dag, kind: str | None = None) -> set[tuple[str, str]]:
    name = {i: f"{p.op}({','.join(e.id for e in p.inputs)})" for i, p in enumerate(dag.primitives)}
    return {(name[a], name[b]) for a, b, k in dag.edges if kind is None or k == kind}


def test_unchanged_stages_do_nothing_and_hold_no_memory() -> None:
    job = job8b(16)
    plan = Plan((sp("actor_gen", 2, 2, [range(4)]), sp("reward_infer", 1, 4, [range(4, 8)])))
    moved = Plan((sp("actor_gen", 2, 2, [range(4)]), sp("reward_infer", 1, 4, [range(8, 12)])))
    dag, _ = transition_dag(job, plan, moved)
    assert dag.changed == ("reward_infer",)
    assert all(p.stage == "reward_infer" for p in dag.primitives)
    assert set(dag.initial_bytes) == set(range(4, 8))  # the actor is offloaded: no bytes
    assert {g for m in dag.memory for g in m} == set(range(4, 12))
    assert dag.final["actor_gen"][0].id == "actor_gen/0"
    s = plan_transition(job, plan, plan)
    assert s.feasible and s.primitives == () and s.estimated_s == 0.0


def test_a_move_copies_before_it_destroys_the_last_copy() -> None:
    job = job8b(16)
    cur = Plan((sp("reward_infer", 2, 2, [range(4)]),))
    tgt = Plan((sp("reward_infer", 2, 2, [range(8, 12)]),))
    dag, _ = transition_dag(job, cur, tgt)
    assert edges_of(dag, STATE) == {("Extend(reward_infer/0)", "Destroy(reward_infer/0)")}


def test_split_destroy_extend_merge_order_and_resident_pieces_are_kept() -> None:
    """(tp=2, pp=2) x 2 -> (tp=4, pp=1) x 2 through T_sub = (2, 1). The first target unit's
    GPU order puts both (2, 1) pieces of current unit 0 on their target ranks: it is a Merge
    of them in place; the second target unit is filled by Extends; current unit 1 has no
    piece anyone keeps, so it is destroyed whole, unsplit."""
    job = job8b(16)
    cur = Plan((sp("actor_gen", 2, 2, [range(4), range(4, 8)]),))
    tgt = Plan((sp("actor_gen", 4, 1, [[0, 2, 1, 3], [8, 10, 9, 11]]),))
    dag, _ = transition_dag(job, cur, tgt)
    assert dag.feasible, dag.problem
    names = [f"{p.op}({','.join(e.id for e in p.inputs)})" for p in dag.primitives]
    assert sorted(n.split("(")[0] for n in names) == \
        ["Destroy", "Extend", "Extend", "Merge", "Merge", "Split"]
    assert "Split(actor_gen/0)" in names and "Destroy(actor_gen/1)" in names
    split = next(p for p in dag.primitives if isinstance(p, Split))
    resident = next(p for p in dag.primitives if isinstance(p, Merge) and p.output.gpus[0] == 0)
    assert resident.emus == split.outputs  # merged where they are, not copied
    for a, b, _ in dag.edges:  # the paper's order: Split -> Destroy -> Extend -> Merge
        assert not isinstance(dag.primitives[b], Split)
        assert not isinstance(dag.primitives[a], (Merge, Destroy))
    assert nx.is_directed_acyclic_graph(nx.DiGraph([(a, b) for a, b, _ in dag.edges]))
    s = plan_transition(job, cur, tgt)
    assert validate(job, cur, tgt, s) == []


def test_with_no_piece_kept_only_the_extends_source_is_split() -> None:
    """The 8B reference from (tp=2) x 4 on GPUs 0-7 to (tp=1) on GPU 8: no (1, 1) piece sits
    on the target, so one piece is copied there. Only the unit it comes from is split; the
    other three are destroyed whole (splitting them gathered 15 GiB each only to destroy the
    pieces: 4 Splits, 7 Destroys, 74.8 GiB moved for a 15 GiB state)."""
    job = job8b(16)
    cur = Plan((sp("reference_infer", 2, 1, [[0, 1], [2, 3], [4, 5], [6, 7]]),))
    tgt = Plan((sp("reference_infer", 1, 1, [[8]]),))
    dag, cost = transition_dag(job, cur, tgt)
    assert dag.feasible, dag.problem
    names = sorted(f"{p.op}({','.join(e.id for e in p.inputs)})" for p in dag.primitives)
    (split,) = [p for p in dag.primitives if isinstance(p, Split)]
    (ext,) = [p for p in dag.primitives if isinstance(p, Extend)]
    assert ext.emu in split.outputs and ext.targets == (8,)
    whole = sorted(f"Destroy({e.id})" for e in dag.initial["reference_infer"]
                   if e.id != split.emu.id)
    assert len(whole) == 3 and set(whole) <= set(names)
    assert sorted(n.split("(")[0] for n in names) == ["Destroy"] * 5 + ["Extend", "Split"]
    # the source piece goes only after its copy ends; the other piece after the Split
    assert edges_of(dag, STATE) == {
        (f"Split({split.emu.id})", f"Destroy({o.id})") for o in split.outputs} | {
        (f"Split({split.emu.id})", f"Extend({ext.emu.id})"),
        (f"Extend({ext.emu.id})", f"Destroy({ext.emu.id})")}
    s = plan_transition(job, cur, tgt)
    assert validate(job, cur, tgt, s) == []
    moved = sum(t.bytes for p in dag.primitives for t in p.transfers(cost.sizes))
    state = sum(cost.sizes.of(dag.final["reference_infer"][0]))
    assert moved == pytest.approx(2 * state, rel=0.01)  # one all-gather and one copy
    assert s.estimated_s == pytest.approx(sum(
        cost.seconds(p) for p in (split, ext)) + cost.seconds(Destroy(ext.emu)), rel=1e-6)


def test_with_a_piece_kept_a_doomed_unit_on_the_targets_node_is_the_source() -> None:
    """actor_gen (2, 1) on GPUs 0-1 and 8-9 moves to 0-1 and 10-11: 0-1 is kept, 8-9 is
    destroyed. The copy onto 10-11 comes from 8-9 over NVLink, and 8-9 goes after it; copying
    the kept unit across nodes took 0.421 s against 0.131 s."""
    job = job8b(16)
    cur = Plan((sp("actor_gen", 2, 1, [[0, 1], [8, 9]]),))
    tgt = Plan((sp("actor_gen", 2, 1, [[0, 1], [10, 11]]),))
    dag, cost = transition_dag(job, cur, tgt)
    assert dag.feasible, dag.problem
    (ext,) = [p for p in dag.primitives if isinstance(p, Extend)]
    assert ext.emu.gpus == (8, 9) and ext.targets == (10, 11)
    assert edges_of(dag, STATE) == {("Extend(actor_gen/1)", "Destroy(actor_gen/1)")}
    s = plan_transition(job, cur, tgt)
    assert validate(job, cur, tgt, s) == []
    assert s.estimated_s == pytest.approx(cost.seconds(ext) + cost.seconds(Destroy(ext.emu)),
                                          rel=1e-6)


@pytest.mark.parametrize(("stage", "tp", "pp", "gpus", "units", "chain"), [
    # two units on node 0 seed nodes 1 and 2 side by side, then each node copies inside
    ("critic_train", 1, 4, 24, 2, ("inter", "intra")),
    # one unit: a copy beside it first, so that two can seed nodes 1 and 2 side by side
    ("actor_train", 2, 2, 32, 1, ("intra", "inter", "intra")),
])
def test_a_dp_fan_out_seeds_every_node_once_then_copies_inside_it(
        stage: str, tp: int, pp: int, gpus: int, units: int, chain: tuple[str, ...]) -> None:
    """DP grows onto nodes 1 and 2 (GPUs 8-23, nodes of 8) from units on node 0. Slot by slot,
    GPUs 8-11 took a free copy from node 0 and 12-15 a second one rather than wait for 8-11's,
    which left node 2 waiting for a busy source: 2.743 s and 2.653 s, against 1.589 s and
    1.632 s with one copy across the network per node."""
    job = job8b(gpus)
    four = [range(a, a + 4) for a in range(0, 24, 4)]
    cur = Plan((sp(stage, tp, pp, four[:units]),))
    tgt = Plan((sp(stage, tp, pp, four),))
    dag, cost = transition_dag(job, cur, tgt)
    assert dag.feasible, dag.problem
    exts = [p for p in dag.primitives if isinstance(p, Extend)]
    assert all(p.op == "Extend" for p in dag.primitives) and len(exts) == 6 - units
    crossing = sorted(p.targets[0] // 8 for p in exts if p.emu.gpus[0] // 8 != p.targets[0] // 8)
    assert crossing == [1, 2]
    s = plan_transition(job, cur, tgt)
    assert validate(job, cur, tgt, s) == []
    u0 = dag.initial[stage][0]
    took = {"intra": cost.seconds(Extend.of(u0, (4, 5, 6, 7), "x")),
            "inter": cost.seconds(Extend.of(u0, (8, 9, 10, 11), "x"))}
    assert s.estimated_s == pytest.approx(sum(took[c] for c in chain), rel=1e-6)


def test_when_the_node_first_fan_outs_deadlock_the_dag_is_built_slot_by_slot() -> None:
    """The two trainers of the benchmark's random-64-2, concurrent after the move: with the
    fan-outs that seed every node first, the critic's Extend onto 32-46 waits for the actor to
    leave 34 and 38, whose Destroy waits for the actor's Extend onto the critic's old GPUs,
    which waits for the critic's Destroy there, after that Extend. Slot by slot the actor
    copies from another piece; the transition falls back to it rather than be infeasible."""
    from nereus.transition.emu import phi
    from nereus.transition.global_dag import _joined, _local_dags
    from nereus.transition.planner import capacity_bytes

    job = job8b(64)
    actor = (32, 25, 52, 41, 54, 34, 35, 33, 46, 36, 44, 39, 42, 45, 53, 31, 29, 48, 37, 40,
             55, 49, 38, 47, 26, 30, 51, 43, 50, 27, 28, 24)
    cur = Plan((sp("actor_train", 4, 8, [actor]), sp("critic_train", 2, 8, [range(16)])))
    tgt = Plan((sp("actor_train", 8, 2, [range(16), range(16, 32)]),
                sp("critic_train", 4, 4, [range(16, 32), range(32, 48)])),
               groups=(("actor_train", "critic_train"),))
    dag, cost = transition_dag(job, cur, tgt)
    initial = phi(job, cur)
    eager = _local_dags(job, cur, tgt, cost, capacity_bytes(job), initial, eager=True)
    turns = _joined(job, cur, tgt, cost, capacity_bytes(job), initial, eager)
    assert not turns.feasible
    assert "GPUs 34,38 stay with actor_train" in (turns.problem or ""), turns.problem
    assert dag.feasible, dag.problem
    s = plan_transition(job, cur, tgt)
    assert validate(job, cur, tgt, s) == []


def test_when_a_doomed_source_deadlocks_the_fallback_copies_from_the_kept_unit() -> None:
    """actor_train and critic_train (2, 1), concurrent, trade GPUs: the actor keeps 0-1 and
    moves 8-9 to 10-11, the critic moves 10-11 to 8-9. The actor's copy from its doomed 8-9
    (NVLink) holds 8-9 until it ends, and it waits for the critic to leave 10-11, whose
    Destroy waits for the critic's Extend onto 8-9. The fallback build takes the rules before
    the eager fan-outs in full (only the kept unit sends while one is kept), so the actor
    copies from 0-1 across nodes: feasible, 2.644 s as before them."""
    job = job8b(16)
    groups = (("actor_train", "critic_train"),)
    cur = Plan((sp("actor_train", 2, 1, [[0, 1], [8, 9]]), sp("critic_train", 2, 1, [[10, 11]])),
               groups=groups)
    tgt = Plan((sp("actor_train", 2, 1, [[0, 1], [10, 11]]), sp("critic_train", 2, 1, [[8, 9]])),
               groups=groups)
    dag, _ = transition_dag(job, cur, tgt)
    assert dag.feasible, dag.problem
    exts = {(p.stage, p.emu.gpus, p.targets) for p in dag.primitives if isinstance(p, Extend)}
    assert exts == {("actor_train", (0, 1), (10, 11)), ("critic_train", (10, 11), (8, 9))}
    s = plan_transition(job, cur, tgt)
    assert s.feasible, s.reason
    assert validate(job, cur, tgt, s) == []
    assert s.estimated_s == pytest.approx(2.644, abs=5e-4)


def test_pure_dp_shrink_is_destroys_alone() -> None:
    job = job8b(16)
    cur = Plan((sp("critic_infer", 1, 2, [range(2), range(2, 4), range(4, 6)]),))
    tgt = Plan((sp("critic_infer", 1, 2, [range(2, 4)]),))
    dag, _ = transition_dag(job, cur, tgt)
    assert sorted(type(p).__name__ for p in dag.primitives) == ["Destroy", "Destroy"]
    assert dag.edges == ()


def test_blocked_extend_waits_for_a_destroy_that_frees_its_gpus() -> None:
    """A GPU holds 3.0 MB here. The actor's training state (tp=2) on GPUs 0-1 moves to GPU 2 as
    one (1, 1) unit, so it is split into two whole copies (2.74 MiB each) on GPUs 0 and 1, one
    of which is copied to GPU 2. Releases and the Split go first, so the actor's generation
    Extend onto GPU 0 finds a whole training copy there: it gets a resource edge from that
    copy's Destroy, which itself waits only for the Split."""
    job = tiny_job(9, memory_gib=3.0e6 / 0.9 / 2**30)
    cur = Plan((sp("actor_gen", 1, 1, [[3]]), sp("actor_train", 2, 1, [[0, 1]])))
    tgt = Plan((sp("actor_gen", 1, 1, [[3], [0]]), sp("actor_train", 1, 1, [[2]])))
    dag, _ = transition_dag(job, cur, tgt)
    assert dag.feasible, dag.problem
    assert edges_of(dag, RESOURCE) == {("Destroy(actor_train/1)", "Extend(actor_gen/0)")}
    s = plan_transition(job, cur, tgt)
    assert validate(job, cur, tgt, s) == []
    ext = next(p for p in s.primitives if p.op == "Extend" and p.stage == "actor_gen")
    assert [s.primitives[d].op for d in ext.resource_deps] == ["Destroy"]
    assert ext.start_s >= s.primitives[ext.resource_deps[0]].end_s


def test_release_before_acquire_then_stage_order() -> None:
    job = job8b(24)
    cur = Plan((sp("actor_gen", 1, 4, [range(4)]), sp("reward_infer", 1, 4, [range(4, 8)]),
                sp("actor_train", 2, 4, [range(8, 16)])))
    tgt = Plan((sp("actor_gen", 1, 4, [range(4), range(16, 20)]),
                sp("reward_infer", 1, 4, [range(20, 24)]),
                sp("actor_train", 2, 4, [range(8, 16), [0, 1, 2, 3, 4, 5, 6, 7]])))
    dag, _ = transition_dag(job, cur, tgt)
    order = [dag.primitives[i] for i in dag.order]
    first_acquire = next(k for k, p in enumerate(order) if not isinstance(p, Destroy))
    ready_destroys = [k for k, p in enumerate(order) if isinstance(p, Destroy)
                      and not any(b == dag.order[k] for _, b, _ in dag.edges)]
    assert all(k < first_acquire for k in ready_destroys)
    extends = [p.stage for p in order if isinstance(p, Extend)]
    assert extends.index("actor_gen") < extends.index("reward_infer") < \
        extends.index("actor_train")


def test_concurrent_stages_never_share_a_gpu_but_may_meet_where_a_plan_shares() -> None:
    """reference and reward inference run side by side on disjoint GPUs in both plans; the
    reward model moves onto GPUs the reference model leaves: its Extend waits for the
    reference's Destroy there even though memory would allow both."""
    job = job8b(16)
    cur = Plan((sp("reference_infer", 1, 4, [range(4), range(4, 8)]),
                sp("reward_infer", 1, 4, [range(8, 12)])))
    tgt = Plan((sp("reference_infer", 1, 4, [range(4)]),
                sp("reward_infer", 1, 4, [range(4, 8)])))
    dag, _ = transition_dag(job, cur, tgt)
    assert ("Destroy(reference_infer/1)", "Extend(reward_infer/0)") in edges_of(dag, RESOURCE)
    s = plan_transition(job, cur, tgt)
    assert validate(job, cur, tgt, s) == []
    # the same move between stages of different phases needs no such edge
    cur2 = Plan((sp("reference_infer", 1, 4, [range(4), range(4, 8)]),
                 sp("critic_train", 1, 4, [range(8, 12)])))
    tgt2 = Plan((sp("reference_infer", 1, 4, [range(4)]),
                 sp("critic_train", 1, 4, [range(4, 8)])))
    dag2, _ = transition_dag(job, cur2, tgt2)
    assert not edges_of(dag2, RESOURCE)


def test_a_swap_of_concurrent_stages_is_infeasible_and_says_where() -> None:
    job = job8b(16)
    cur = Plan((sp("reference_infer", 1, 4, [range(4)]), sp("reward_infer", 1, 4, [range(4, 8)])))
    tgt = Plan((sp("reference_infer", 1, 4, [range(4, 8)]), sp("reward_infer", 1, 4, [range(4)])))
    s = plan_transition(job, cur, tgt)
    assert not s.feasible
    assert "reference_infer" in s.reason and "reward_infer" in s.reason
    assert "GPU" in s.reason and "concurrently" in s.reason


def test_not_enough_memory_is_infeasible_and_names_gpus_and_stages() -> None:
    job = tiny_job(8, memory_gib=CAP_1MB)  # a (1, 2) shard of θ and ω takes 1.4 MB
    cur = Plan((sp("actor_train", 2, 2, [range(4)]),))
    tgt = Plan((sp("actor_train", 1, 2, [[0, 1]]),))
    s = plan_transition(job, cur, tgt)
    assert not s.feasible
    # the Split into (1, 1) alone outgrows the GPUs it runs on, even staged through host
    # memory (it must hold a whole (1, 1) copy, 2.74 MiB, and its all-gather's staging
    # buffers, 0.08 MiB), so no order helps, and sizes this small are in MiB (they printed as
    # "0.0 GiB")
    assert "actor_train" in s.reason and "GPUs 0-3" in s.reason and "MiB" in s.reason
    assert "Split needs up to 2.82 MiB" in s.reason and "by itself" in s.reason
    assert "even with its source staged through host memory" in s.reason


def test_bad_plan_pairs_are_input_errors() -> None:
    job = job8b(16)
    a = Plan((sp("actor_gen", 1, 4, [range(4)]),))
    b = Plan((sp("reward_infer", 1, 4, [range(4)]),))
    with pytest.raises(InputError, match="target.stages"):
        plan_transition(job, a, b)
    c = Plan((sp("actor_gen", 3, 1, [range(3)]),))
    with pytest.raises(InputError, match="current.actor_gen"):
        plan_transition(job, c, c)
    d = Plan((sp("no_such_stage", 1, 1, [[0]]),))
    with pytest.raises(InputError, match="stage"):
        plan_transition(job, d, d)


def test_offloaded_state_is_loaded_by_the_first_primitive_that_reads_it() -> None:
    """Offloaded between phases, the actor (0.41 MB) and the reward model (0.38 MB) share GPU 0
    of 0.5 MB. Each is loaded there only when the Extend that copies it away starts, and its
    Destroy frees the GPU before the other is loaded, so both may move at once (loading both
    at the start, which the DAG tries first, does not fit)."""
    job = tiny_job(3, memory_gib=CAP_05MB)
    cur = Plan((sp("actor_gen", 1, 1, [[0]]), sp("reward_infer", 1, 1, [[0]])))
    both = Plan((sp("actor_gen", 1, 1, [[1]]), sp("reward_infer", 1, 1, [[2]])))
    dag, cost = transition_dag(job, cur, both)
    assert dag.feasible, dag.problem
    assert dag.loads_on_first_read and dag.initial_bytes == {}
    for i, p in enumerate(dag.primitives):
        if p.op == "Extend":  # loads its source on GPU 0: nothing there before it
            b = cost.sizes.of(p.inputs[0])[0]
            assert dag.memory[i][0] == (0, b, b)
    s = plan_transition(job, cur, both)
    assert validate(job, cur, both, s) == []
    assert max(s.peak_bytes().values()) <= s.capacity_bytes
    # GPU 0 holds one of them at a time: the second copy starts once the first is destroyed
    on0 = sorted((p for p in s.primitives if 0 in p.gpus), key=lambda p: p.start_s)
    assert [p.op for p in on0] == ["Extend", "Destroy", "Extend", "Destroy"]


def test_a_split_and_merge_too_big_for_a_gpu_go_through_host_memory() -> None:
    """The 8B actor's training state from (tp=2, pp=2) to (tp=4, pp=1) goes through (2, 1)
    units: the Split would hold a 26.2 GiB source shard and a 52.4 GiB new one on each GPU, and
    the Merge the 52.4 GiB sub-shard and a 26.2 GiB new one, more than the 71.7 GiB an H100
    may hold even with nothing else on it (``nereus transition`` of the 8B PPO example from 16 to
    24 GPUs). Staged through host memory each holds only the larger shard, so the move is
    feasible; it costs the host copies (out and in, at the host link's bandwidth)."""
    job = job8b(24)
    cur = Plan((sp("actor_train", 2, 2, [range(8, 12), range(12, 16)]),))
    tgt = Plan((sp("actor_train", 4, 1, [range(8, 12), range(12, 16), range(16, 20),
                                         range(20, 24)]),))
    s = plan_transition(job, cur, tgt)
    assert s.feasible, s.reason
    assert validate(job, cur, tgt, s) == []
    staged = [p.primitive for p in s.primitives if p.primitive.staged]
    # no piece sits on a target slot: only the unit the Extends copy from is split (the
    # other's Split would gather 26.2 GiB per GPU only to destroy it)
    assert sorted(p.op for p in staged) == ["Merge"] * 4 + ["Split"]
    assert all(not p.primitive.staged for p in s.primitives
               if p.primitive.op in ("Extend", "Destroy"))
    assert max(s.peak_bytes().values()) <= s.capacity_bytes
    dag, cost = transition_dag(job, cur, tgt)
    split = next(p for p in dag.primitives if isinstance(p, Split))
    src = max(cost.sizes.of(split.emu))
    host_s = 2 * src / (job.cluster.device.host_bw * cost.eff[OpClass.HOST])
    plain = replace(split, staged=False)
    assert cost.seconds(split) == pytest.approx(cost.seconds(plain) + host_s)
    assert cost.duration(split).local_s == pytest.approx(host_s)
    assert split.memory(cost.sizes)[split.gpus[0]].during < \
        plain.memory(cost.sizes)[split.gpus[0]].during


def test_a_replay_stuck_in_the_papers_order_tries_the_stuck_primitive_first() -> None:
    """GPU 0 may hold 4.0 MB. In stage order the actor's generation Split (a (1, 1) piece it
    keeps: 0.21 -> 0.41 MB for good) runs before the actor's training Split (+2.9 MB until
    its Merge shrinks it back), and then the training Split no longer fits (4.12 MB) while
    nothing is left to destroy. Training first fits (3.91 MB, then 1.40 MB): the replay that
    got stuck is run again with the stuck Split promoted."""
    job = tiny_job(4, memory_gib=4.0e6 / 0.9 / 2**30)
    cur = Plan((sp("actor_gen", 1, 2, [[0, 1]]), sp("actor_train", 1, 4, [[0, 1, 2, 3]])))
    tgt = Plan((sp("actor_gen", 1, 1, [[0], [1]]), sp("actor_train", 4, 1, [[0, 1, 2, 3]])))
    s = plan_transition(job, cur, tgt)
    assert s.feasible, s.reason
    assert validate(job, cur, tgt, s) == []
    first = {p.stage: p.start_s for p in reversed(s.primitives) if p.op == "Split"}
    assert first["actor_train"] < first["actor_gen"]
    assert max(max(b for _, b in steps) for steps in s.memory.values()) > 3.9e6


def test_units_no_primitive_reads_stay_offloaded() -> None:
    """The reward model drops its replica on GPU 1 and keeps the one on GPU 0 as it is; the
    actor's training state is split onto GPU 0 (4.32 MB there while it runs; a GPU holds
    4.5 MB). Between phases idle state is offloaded, and nothing in this transition reads
    either reward unit, so neither is loaded: counting the kept one (0.38 MB on GPU 0) made
    the move infeasible."""
    job = tiny_job(4, memory_gib=4.5e6 / 0.9 / 2**30)
    cur = Plan((sp("reward_infer", 1, 1, [[0], [1]]), sp("actor_train", 2, 1, [[0, 1]])))
    tgt = Plan((sp("reward_infer", 1, 1, [[0]]), sp("actor_train", 1, 1, [[0]])))
    dag, cost = transition_dag(job, cur, tgt)
    assert dag.feasible, dag.problem
    train = cost.sizes.of(dag.initial["actor_train"][0])
    assert dag.initial_bytes == {0: train[0], 1: train[1]}  # no reward bytes anywhere
    drop = next(i for i, p in enumerate(dag.primitives) if p.stage == "reward_infer")
    assert isinstance(dag.primitives[drop], Destroy)
    assert all(m == (0, 0, 0) for m in dag.memory[drop].values())
    s = plan_transition(job, cur, tgt)
    assert validate(job, cur, tgt, s) == []


def test_a_move_whose_every_t_sub_is_too_big_goes_in_two_hops() -> None:
    """The 8B critic's training state from (tp=2, pp=1) on two GPUs to (tp=1, pp=8): their only
    T_sub is (1, 1), a whole unsharded copy (97.9 GiB) on one GPU, even staged. Through one
    (2, 4) unit on the target's GPUs each hop's T_sub holds half the state or less: the current
    unit is extended onto (2, 1) slots and merged into (2, 4), which splits into (1, 4) units
    on exactly the target's pieces, merged into (1, 8)."""
    job = job8b(8)
    cur = Plan((sp("critic_train", 2, 1, [[4, 5]]),))
    tgt = Plan((sp("critic_train", 1, 8, [range(8)]),))
    s = plan_transition(job, cur, tgt)
    assert s.feasible, s.reason
    assert validate(job, cur, tgt, s) == []
    prims = [p.primitive for p in s.primitives]
    mids = {e.layout for p in prims for e in p.outputs} - {Layout(2, 1), Layout(1, 8)}
    assert mids == {Layout(2, 4), Layout(1, 4)}
    assert [p.op for p in prims if p.op != "Extend"] == ["Merge", "Split", "Merge"]
    assert max(s.peak_bytes().values()) <= s.capacity_bytes
    ids = [e.id for p in prims for e in p.outputs]
    assert len(ids) == len(set(ids)) and "critic_train/0" not in ids
    # the split of the (2, 4) unit waits for the merge that makes it
    split = next(i for i, p in enumerate(prims) if p.op == "Split")
    merge = next(i for i, p in enumerate(prims) if p.op == "Merge")
    assert merge in s.primitives[split].deps


def _gantt_bars(fig) -> list[tuple[float, float, int, str, bool]]:  # type: ignore[no-untyped-def]
    """(start, width, row, colour, hatched) of every bar the chart drew, whatever artists
    carry them (one collection per hatch, not one patch per bar)."""
    from matplotlib.colors import to_hex

    from nereus.transition.gantt import BAR_GID, STAGED_GID

    out = []
    for c in fig.axes[0].collections:
        if c.get_gid() not in (BAR_GID, STAGED_GID):
            continue
        colours = c.get_facecolor()
        for k, path in enumerate(c.get_paths()):
            xs, ys = path.vertices[:, 0], path.vertices[:, 1]
            out.append((round(float(xs.min()), 9), float(xs.max() - xs.min()),
                        round(float(ys.mean())), to_hex(colours[k % len(colours)]),
                        bool(c.get_hatch())))
    return out


def _close(fig) -> None:  # type: ignore[no-untyped-def]
    import matplotlib.pyplot as plt

    plt.close(fig)


def test_the_gantt_chart_hatches_staged_primitives() -> None:
    from nereus.transition.gantt import COLORS, figure

    job = job8b(24)
    cur = Plan((sp("actor_train", 2, 2, [range(8, 12), range(12, 16)]),))
    tgt = Plan((sp("actor_train", 4, 1, [range(8, 12), range(12, 16), range(16, 20),
                                         range(20, 24)]),))
    s = plan_transition(job, cur, tgt)
    fig = figure(s)
    try:
        ax = fig.axes[0]
        bars = _gantt_bars(fig)
        hatched = sum(1 for b in bars if b[4])
        staged_bars = sum(len(p.gpus) for p in s.primitives if p.primitive.staged)
        assert hatched == staged_bars > 0
        assert "staged via host" in [t.get_text() for t in ax.get_legend().get_texts()]
        # one bar per (primitive, GPU): where it starts, on which GPU's row, in its op's colour
        rows = {int(t.get_text()): round(t.get_position()[1]) for t in ax.get_yticklabels()}
        want = sorted((round(p.start_s, 9), rows[g], COLORS[p.op].lower(),
                       bool(p.primitive.staged)) for p in s.primitives for g in p.gpus)
        assert sorted(b[:1] + b[2:] for b in bars) == want
        assert sorted(round(b[1], 6) for b in bars) == sorted(
            round(max(p.seconds, s.estimated_s * 1e-3), 6) for p in s.primitives for _ in p.gpus)
    finally:
        _close(fig)


def test_the_gantt_chart_of_no_move_says_so() -> None:
    """A plan to itself drew an empty chart whose time axis ran to 1e-9 s."""
    from nereus.transition.gantt import SAME, figure

    job = job8b(16)
    plan = Plan((sp("actor_gen", 2, 2, [range(4)]), sp("reward_infer", 1, 4, [range(4, 8)])))
    s = plan_transition(job, plan, plan)
    assert s.feasible and not s.primitives
    fig = figure(s)
    try:
        ax = fig.axes[0]
        assert SAME in [t.get_text() for t in ax.texts]
        assert not _gantt_bars(fig)
        assert ax.get_xlim()[1] >= 1.0  # seconds, not nanoseconds
        assert "L_tran = 0.000 s" in ax.get_title(loc="left")
    finally:
        _close(fig)


@pytest.mark.parametrize("gpus", [256, 1024])
def test_a_large_pools_gpu_labels_do_not_overlap(gpus: int) -> None:
    """The figure's height is capped: at 1024 GPUs every row's label overlapped its
    neighbours'. Every k-th row is labelled there; at 256 still every row."""
    from nereus.transition.gantt import figure

    job = job8b(24)
    cur = Plan((sp("actor_train", 2, 2, [range(8, 12), range(12, 16)]),))
    tgt = Plan((sp("actor_train", 4, 1, [range(8, 12), range(12, 16), range(16, 20),
                                         range(20, 24)]),))
    s = plan_transition(job, cur, tgt)
    s = replace(s, memory={g: s.memory.get(g, ((0.0, 0),)) for g in range(gpus)})
    fig = figure(s)
    try:
        ax = fig.axes[0]
        fig.canvas.draw()
        labels = [t for t in ax.get_yticklabels() if t.get_text()]
        step = gpus // len(labels)
        assert [int(t.get_text()) for t in labels] == list(range(0, gpus, step))
        assert step == 1 if gpus == 256 else step > 1 and "one row in" in ax.get_ylabel()
        r = fig.canvas.get_renderer()
        boxes = sorted((t.get_window_extent(r) for t in labels), key=lambda b: b.y0)
        assert all(a.y1 <= b.y0 for a, b in pairwise(boxes))
        assert len(_gantt_bars(fig)) == sum(len(p.gpus) for p in s.primitives)
    finally:
        _close(fig)


def _ppo_4_to_8() -> tuple[Plan, Plan]:
    """The planner's best 8B PPO plans on 4 and on 8 GPUs (every model-stage changes)."""
    cur = Plan((sp("actor_gen", 4, 1, [range(4)]), sp("reference_infer", 1, 1, [[g] for g in
                                                                               range(4)]),
                sp("reward_infer", 1, 4, [range(4)]), sp("critic_infer", 1, 4, [range(4)]),
                sp("actor_train", 2, 2, [range(4)]), sp("critic_train", 4, 1, [range(4)])))
    tgt = Plan((sp("actor_gen", 4, 1, [range(4), range(4, 8)]),
                sp("reference_infer", 1, 1, [[g] for g in range(8)]),
                sp("reward_infer", 1, 8, [range(8)]), sp("critic_infer", 1, 8, [range(8)]),
                sp("actor_train", 2, 2, [range(4), range(4, 8)]),
                sp("critic_train", 1, 8, [range(8)])))
    return cur, tgt


def test_a_move_no_order_fits_is_found_in_two_moves() -> None:
    """8B PPO from 4 to 8 GPUs: one transition keeps every unit it makes on its GPUs, so the
    six stages' new units leave no order that fits; between two transitions every stage is
    offloaded, and moving critic training first fits. Both moves validate, and the plan
    between them is the current one with the first-moved stages as the target places them."""
    job = job8b(8)
    cur, tgt = _ppo_4_to_8()
    assert not plan_transition(job, cur, tgt).feasible
    two = in_two_moves(job, cur, tgt)
    assert two is not None and two.first_moved == ("critic_train",)
    for sp_ in two.waypoint.stages:
        want = tgt if sp_.stage in two.first_moved else cur
        assert sp_ == want.stage(sp_.stage)
    assert validate(job, cur, two.waypoint, two.first) == []
    assert validate(job, two.waypoint, tgt, two.second) == []
    assert {p.primitive.stage for p in two.first.primitives} == {"critic_train"}
    assert "critic_train" not in {p.primitive.stage for p in two.second.primitives}
    assert two.estimated_s == pytest.approx(two.first.estimated_s + two.second.estimated_s)


def test_two_moves_need_two_changing_stages() -> None:
    job = job8b(8)
    cur, tgt = _ppo_4_to_8()
    one = Plan(tuple(tgt.stage(s.stage) if s.stage != "critic_train" else s
                     for s in cur.stages))
    assert in_two_moves(job, one, tgt) is None  # one stage changes: nothing to split
