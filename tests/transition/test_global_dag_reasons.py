"""Infeasibility reasons group GPUs: one clause per rival model-stage or for the memory the
GPUs lack, GPU ids as ranges, not one clause per GPU."""

from __future__ import annotations

import re

from nereus.plan.types import Plan
from nereus.spec.job import parse_job
from nereus.transition.instances import make_job
from nereus.transition.planner import plan_transition

from transition_testlib import job8b, sp

PER_GPU = re.compile(r"GPU \d+ (stays|lacks)")


def test_a_swap_of_concurrent_70b_trainers_names_gpu_ranges_once() -> None:
    """actor_train (4, 8) x 2 on GPUs 0-63 and critic_train (4, 16) on GPUs 64-127 trade
    places; they run concurrently, so the critic's Extend onto 0-63 waits on all 64 GPUs of
    the actor. The reason was 'GPU 0 stays with actor_train, ...' 64 times (~5 KB)."""
    job = parse_job({"model": "llama-3.3-70b", "gpus": 128,
                     "cluster": {"device": "h100-sxm-80gb"}})
    lo, hi = range(64), range(64, 128)
    cur = Plan((sp("actor_train", 4, 8, [lo[:32], lo[32:]]), sp("critic_train", 4, 16, [hi])))
    tgt = Plan((sp("actor_train", 4, 8, [hi[:32], hi[32:]]), sp("critic_train", 4, 16, [lo])))
    s = plan_transition(job, cur, tgt)
    assert not s.feasible
    assert ("GPUs 0-63 stay with actor_train, which runs concurrently with critic_train"
            in s.reason), s.reason
    assert not PER_GPU.search(s.reason), s.reason
    assert "\n" not in s.reason and len(s.reason) < 400, s.reason


def test_memory_the_gpus_lack_is_one_clause_with_the_largest_amount() -> None:
    """A Split of actor_train grows on GPUs 0-3, which critic_train also holds; no Destroy
    frees enough there, and the amounts differ by GPU: 'up to' the largest, per GPU. (At
    3.5 MiB, since Splits count their staging buffers, the critic's Splits are blocked too and
    the actor's GPUs lack equal amounts: 3.6 MiB keeps the case this test is about.)"""
    job = make_job("tiny-llama", 8, device="cpu", memory_gib=0.0036)
    both = (("actor_train", "critic_train"),)
    cur = Plan((sp("actor_train", 2, 2, [range(4)]),
                sp("critic_train", 2, 1, [range(2), range(2, 4), range(4, 6)])),
               groups=both)
    tgt = Plan((sp("actor_train", 1, 2, [range(2), range(2, 4)]),
                sp("critic_train", 1, 4, [range(4), range(4, 8)])), groups=both)
    s = plan_transition(job, cur, tgt)
    assert not s.feasible
    assert re.search(r"GPUs 0-3 each lack up to \d+\.\d\d MiB", s.reason), s.reason
    assert "actor_train" in s.reason and "critic_train" in s.reason
    assert not PER_GPU.search(s.reason), s.reason
    assert "\n" not in s.reason and len(s.reason) < 400, s.reason


def test_clause_wording_for_one_gpu_equal_and_differing_amounts() -> None:
    from nereus.transition.global_dag import _lack_clauses, _stay_clauses

    gib = 2**30
    assert _lack_clauses({3: 2 * gib}) == ["GPU 3 lacks 2.0 GiB"]
    assert _lack_clauses({g: 2 * gib for g in (9, 8, 10)}) == ["GPUs 8-10 each lack 2.0 GiB"]
    assert _lack_clauses({8: gib, 9: 3 * gib, 12: 2 * gib}) == [
        "GPUs 8-9,12 each lack up to 3.0 GiB"]
    assert _stay_clauses({"b": [5, 4], "a": [7]}, "c") == [
        "GPUs 4-5 stay with b, which runs concurrently with c",
        "GPU 7 stays with a, which runs concurrently with c"]


def test_a_blocked_extend_names_only_the_stages_on_its_target_gpus() -> None:
    """actor_train (GPUs 0-3) and critic_train (4-7) trade places and run concurrently; the
    critic's Extend onto 0-3 is blocked. Its source GPUs 4-7 are not the blocked ones, so the
    critic, which holds only 4-7, is not among what holds them (it was, from the source's
    memory step)."""
    job = job8b(8, device_memory_gib=40)
    cur = Plan((sp("actor_train", 1, 4, [range(4)]), sp("critic_train", 1, 4, [range(4, 8)])))
    tgt = Plan((sp("actor_train", 1, 4, [range(4, 8)]), sp("critic_train", 1, 4, [range(4)])))
    s = plan_transition(job, cur, tgt)
    assert not s.feasible
    assert "critic_train: Extend of critic_train/0 onto GPUs 0-3 is blocked" in s.reason, \
        s.reason
    assert "held by actor_train)" in s.reason, s.reason
