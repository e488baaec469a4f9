"""The paper's two worked examples (§5.1 and §6.1, Fig. 6) come out as the paper describes."""

from __future__ import annotations

from collections import Counter

from nereus.cost.candidate import Layout
from nereus.cost.ops import OpClass
from nereus.cost.state import emu_state_bytes
from nereus.spec.model import Head
from nereus.transition.cost import SETUP_S
from nereus.transition.planner import plan_transition
from nereus.transition.primitives import Extend, Merge, Split
from nereus.transition.validate import validate

from transition_testlib import example_a, example_b, job8b


def ops(schedule, stage: str) -> Counter[str]:
    return Counter(p.op for p in schedule.primitives if p.stage == stage)


def test_example_a_actor_merges_to_tp2_and_critic_extends_twice() -> None:
    job = job8b(32)
    cur, tgt = example_a()
    s = plan_transition(job, cur, tgt)
    assert s.feasible, s.reason
    assert validate(job, cur, tgt, s) == []
    # the actor reaches TP=2 by Merge; its second replica first needs the state on new GPUs
    assert ops(s, "actor_gen") == Counter({"Extend": 2, "Merge": 2})
    # the critic goes from DP=2 to DP=4 by two Extends and nothing else
    assert ops(s, "critic_train") == Counter({"Extend": 2})
    merges = [p.primitive for p in s.primitives if isinstance(p.primitive, Merge)]
    resident = next(m for m in merges if m.output.gpus == (0, 4, 1, 5, 2, 6, 3, 7))
    assert [e.id for e in resident.emus] == ["actor_gen/0", "actor_gen/1"]  # nothing copied
    assert all(m.output.layout == Layout(2, 4) for m in merges)
    critic = [p.primitive for p in s.primitives if p.stage == "critic_train"]
    assert sorted((e.emu.gpus, e.targets) for e in critic if isinstance(e, Extend)) == [
        ((8, 9, 10, 11), (24, 25, 26, 27)), ((12, 13, 14, 15), (28, 29, 30, 31))]
    assert [e.id for e in s.final["critic_train"][:2]] == ["critic_train/0", "critic_train/1"]


def test_example_a_ltran_is_the_critic_copy_across_nodes() -> None:
    """Both critic Extends cross nodes (GPU 8 -> 24): the slowest pair sends the fullest
    (1, 4) position of θ and ω over one GPU's network link; that is the critical path."""
    job = job8b(32)
    cur, tgt = example_a()
    s = plan_transition(job, cur, tgt)
    dev = job.cluster.device
    eff = s.efficiencies
    full = max(emu_state_bytes(job.model, Head.SCALAR, Layout(1, 4), True, job.workload, 0, r)
               for r in range(4))
    copy_s = (full / dev.inter_node_bw + dev.inter_latency_s) / eff[OpClass.BROADCAST_INTER]
    want = SETUP_S[dev.name] / eff[OpClass.SETUP] + copy_s
    assert abs(s.estimated_s - want) < 1e-9
    assert s.source == "estimated"


def test_example_b_split_into_four_destroy_two_merge_two() -> None:
    job = job8b(32)
    cur, tgt = example_b()
    s = plan_transition(job, cur, tgt)
    assert s.feasible, s.reason
    assert validate(job, cur, tgt, s) == []
    assert ops(s, "reward_infer") == Counter({"Split": 1, "Destroy": 2, "Merge": 1})
    (split,) = [p.primitive for p in s.primitives if isinstance(p.primitive, Split)]
    assert split.sub == Layout(4, 2) and len(split.outputs) == 4
    (merge,) = [p.primitive for p in s.primitives if isinstance(p.primitive, Merge)]
    assert len(merge.emus) == 2 and merge.output.layout == Layout(8, 2)
    destroyed = sorted(g for p in s.primitives if p.op == "Destroy" for g in p.gpus)
    assert destroyed == [*range(8, 16), *range(24, 32)]  # the released GPUs
    peaks = s.peak_bytes()
    ends = {g: steps[-1][1] for g, steps in s.memory.items()}
    assert all(ends[g] == 0 for g in destroyed)
    assert all(peaks[g] > 0 for g in range(32))
    # Destroys wait for the Split only; the Merge needs nothing but its two kept pieces
    by_index = {p.index: p for p in s.primitives}
    for p in s.primitives:
        if p.op in ("Destroy", "Merge"):
            assert [by_index[d].op for d in p.deps] == ["Split"]
