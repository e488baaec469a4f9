"""EMUs, the layout nesting of Split and Merge, and the four primitives' rules and figures."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nereus.cost.candidate import Layout
from nereus.cost.state import emu_state_bytes
from nereus.errors import InputError
from nereus.plan.types import Plan
from nereus.spec.cluster import format_gpus
from nereus.spec.model import Head
from nereus.transition.emu import Emu, Holds, phi, realization_problem, realizes
from nereus.transition.nesting import (
    common_layout,
    gather_groups,
    merge_gpus,
    nesting_problem,
    split_gpus,
    sub_index,
)
from nereus.transition.primitives import Destroy, Extend, Merge, PrimitiveError, Split
from nereus.transition.sizes import StateSizes

from transition_testlib import job8b, sp, tiny_job

POW2 = st.sampled_from([1, 2, 4, 8])


def unit(stage: str, n: int, tp: int, pp: int, gpus: range | list[int],
         holds: Holds = Holds.THETA, model: str = "reward") -> Emu:
    return Emu(f"{stage}/{n}", stage, model, Layout(tp, pp), tuple(gpus), holds)


# ---------------------------------------------------------------- EMUs
def test_phi_names_replicas_by_stage_and_index_and_holds_by_stage_kind() -> None:
    job = job8b(16)
    plan = Plan((sp("actor_gen", 2, 2, [range(4), range(4, 8)]),
                 sp("actor_train", 4, 2, [range(8, 16)])))
    e = phi(job, plan)
    assert [u.id for u in e["actor_gen"]] == ["actor_gen/0", "actor_gen/1"]
    assert e["actor_gen"][1].gpus == (4, 5, 6, 7)
    assert e["actor_gen"][0].holds is Holds.THETA          # generation holds a copy of θ
    assert e["actor_train"][0].holds is Holds.THETA_OMEGA  # training holds θ and ω
    assert e["actor_train"][0].position(5) == (1, 1)       # TP innermost
    assert realizes([u for us in e.values() for u in us], plan)
    moved = [unit("actor_gen", 0, 2, 2, range(4), model="actor"),
             unit("actor_gen", 1, 2, 2, range(8, 12), model="actor"), *e["actor_train"]]
    assert "actor_gen" in (realization_problem(moved, plan) or "")


def test_emu_rejects_a_gpu_list_that_does_not_fit_its_layout() -> None:
    with pytest.raises(InputError):
        unit("x", 0, 2, 2, range(3))
    with pytest.raises(InputError):
        unit("x", 0, 2, 1, [1, 1])


def test_format_gpus_writes_runs() -> None:
    assert format_gpus([0, 1, 2, 3, 8, 10, 11]) == "0-3,8,10-11"
    assert format_gpus([4, 0]) == "4,0"


# ---------------------------------------------------------------- nesting
@settings(max_examples=60)
@given(POW2, POW2, POW2, POW2)
def test_split_and_merge_are_inverse_and_follow_the_contract(tp: int, pp: int, a: int,
                                                             b: int) -> None:
    lay = Layout(tp * a, pp * b)
    sub = Layout(tp, pp)
    gpus = tuple(range(100, 100 + lay.size))
    pieces = split_gpus(gpus, lay, sub)
    assert len(pieces) == a * b
    assert sorted(g for p in pieces for g in p) == sorted(gpus)
    assert merge_gpus(pieces, sub, lay) == gpus
    for i, g in enumerate(gpus):  # the contract's formula, position by position
        t, r = i % lay.tp, i // lay.tp
        j, s = sub_index(i, lay, sub)
        assert j == t % a + a * (r % b)
        assert pieces[j][s] == g and s == (r // b) * sub.tp + t // a
    for grp in gather_groups(lay, sub):  # one group per T_sub position, one GPU per piece
        assert len(grp) == a * b
        assert {sub_index(i, lay, sub)[1] for i in grp} == {sub_index(grp[0], lay, sub)[1]}
        assert sorted(sub_index(i, lay, sub)[0] for i in grp) == list(range(a * b))


def test_common_layout_and_nesting_problems() -> None:
    job = job8b()
    assert common_layout(Layout(4, 8), Layout(8, 2)) == Layout(4, 2)
    assert nesting_problem(job.model, Layout(4, 8), Layout(4, 2)) is None
    assert "does not divide" in (nesting_problem(job.model, Layout(4, 2), Layout(8, 1)) or "")
    assert "heads" in (nesting_problem(job.model, Layout(3, 1), Layout(1, 1)) or "")


# ---------------------------------------------------------------- primitives
def test_split_produces_complete_pieces_and_keeps_sources_until_the_gather_ends() -> None:
    job = tiny_job()
    sizes = StateSizes(job)
    src = unit("reward_infer", 0, 2, 4, range(8))
    s = Split.of(src, Layout(2, 2), ["reward_infer/1", "reward_infer/2"])
    assert [o.gpus for o in s.outputs] == [(0, 1, 4, 5), (2, 3, 6, 7)]
    assert s.groups() == ((0, 2), (1, 3), (4, 6), (5, 7))
    src_b, sub_b = sizes.of(src), sizes.of(s.outputs[0])
    for i, g in enumerate(src.gpus):
        m = s.memory(sizes)[g]
        new = sub_b[sub_index(i, src.layout, s.sub)[1]]
        assert (m.before, m.during, m.after) == (src_b[i], src_b[i] + new, new)
    pairs = {(t.src, t.dst): t.bytes for t in s.transfers(sizes)}
    assert pairs[(0, 2)] == src_b[0] and pairs[(2, 0)] == src_b[2] and (0, 1) not in pairs
    # every GPU receives exactly what its new shard lacks: its group's other shards
    model, head = job.model, Head.SCALAR
    for i, g in enumerate(src.gpus):
        got = sum(b for (a, d), b in pairs.items() if d == g)
        _, k = sub_index(i, src.layout, s.sub)
        want = emu_state_bytes(model, head, s.sub, False, job.workload, k % 2, k // 2)
        assert got + src_b[i] == want
    with pytest.raises(PrimitiveError, match="k >= 2"):
        Split.of(src, Layout(2, 4), ["x/1"])
    with pytest.raises(PrimitiveError):
        Split(src, Layout(2, 2), (s.outputs[1], s.outputs[0]))  # not the nesting mapping


def test_merge_moves_nothing_and_needs_complete_units_of_one_layout() -> None:
    sizes = StateSizes(tiny_job())
    a = unit("reward_infer", 1, 1, 2, [0, 2])
    b = unit("reward_infer", 2, 1, 2, [1, 3])
    m = Merge.of([a, b], Layout(2, 2), "reward_infer/3")
    assert m.output.gpus == (0, 1, 2, 3)
    assert m.transfers(sizes) == ()
    for st_ in m.memory(sizes).values():
        assert st_.after <= st_.before <= st_.during <= st_.before + st_.after
    with pytest.raises(PrimitiveError, match="takes 2 units"):
        Merge.of([a, b, unit("reward_infer", 4, 1, 2, [4, 5])], Layout(2, 2), "x/9")
    with pytest.raises(PrimitiveError, match="different layouts"):
        Merge.of([a, unit("reward_infer", 4, 2, 1, [4, 5])], Layout(2, 2), "x/9")
    with pytest.raises(PrimitiveError, match="share GPUs"):
        Merge.of([a, unit("reward_infer", 4, 1, 2, [0, 5])], Layout(2, 2), "x/9")
    with pytest.raises(PrimitiveError, match="model-stages"):
        Merge.of([a, unit("critic_infer", 4, 1, 2, [4, 5])], Layout(2, 2), "x/9")
    with pytest.raises(PrimitiveError, match="not alive"):
        m.check({a.id: a})


def test_extend_sends_each_shard_once_rank_aligned_onto_disjoint_gpus() -> None:
    sizes = StateSizes(tiny_job())
    src = unit("reward_infer", 0, 2, 2, range(4))
    e = Extend.of(src, [8, 9, 10, 11], "reward_infer/1")
    b = sizes.of(src)
    assert [(t.src, t.dst, t.bytes) for t in e.transfers(sizes)] == \
        [(0, 8, b[0]), (1, 9, b[1]), (2, 10, b[2]), (3, 11, b[3])]
    mem = e.memory(sizes)
    assert (mem[8].before, mem[8].during, mem[8].after) == (0, b[0], b[0])  # allocated at start
    assert (mem[0].before, mem[0].during, mem[0].after) == (b[0], b[0], b[0])
    with pytest.raises(PrimitiveError, match="disjoint"):
        Extend.of(src, [3, 9, 10, 11], "x/1")
    with pytest.raises(PrimitiveError, match="target GPUs"):
        Extend.of(src, [8, 9], "x/1")
    with pytest.raises(PrimitiveError, match="already taken"):
        e.check({src.id: src, "reward_infer/1": src})


def test_destroy_frees_at_the_end_and_never_takes_the_last_copy() -> None:
    sizes = StateSizes(tiny_job())
    a = unit("reward_infer", 0, 1, 2, [0, 1])
    b = unit("reward_infer", 1, 1, 2, [2, 3])
    d = Destroy(a)
    assert {g: (m.before, m.during, m.after) for g, m in d.memory(sizes).items()} == \
        {0: (sizes.of(a)[0],) * 2 + (0,), 1: (sizes.of(a)[1],) * 2 + (0,)}
    d.check({a.id: a, b.id: b})
    with pytest.raises(PrimitiveError, match="last copy"):
        d.check({a.id: a})
    other = unit("critic_infer", 0, 1, 2, [2, 3])
    with pytest.raises(PrimitiveError, match="last copy"):  # the rule is per model-stage
        d.check({a.id: a, other.id: other})
