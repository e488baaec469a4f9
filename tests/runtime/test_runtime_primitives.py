"""What a primitive allocates on the workers against what the transition planner charged for it.

The planner's memory check is the only thing that keeps a schedule it calls feasible from
stalling on the workers, so for every Merge and Extend the bytes a worker allocates when it
starts must be what the planner's ``MemStep`` adds, and for a Split at least its new shards
(its all-gather buffers come on top and shrink to fit, see ``fit_bucket``). The same holds for
the staged Split and Merge, which free their source on the device before they allocate.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import replace

import pytest

from nereus.runtime import movement as mv
from nereus.runtime.executor import state_specs
from nereus.runtime.primitives import need_bytes, split_member_groups
from nereus.runtime.splitting import staging_bytes
from nereus.runtime.state import StateSpec
from nereus.transition.instances import random_pair, stage_names
from nereus.transition.planner import plan_transition
from nereus.transition.primitives import Merge, Primitive, Split
from nereus.transition.sizes import StateSizes

from runtime_testlib import cpu_job


def _check(p: Primitive, specs: Mapping[str, StateSpec], sizes: StateSizes) -> int:
    """Checks ``need_bytes`` of ``p`` against its ``MemStep``; returns the workers checked."""
    planned = p.memory(sizes)
    need = need_bytes(p, specs[p.stage])
    assert set(need) <= set(planned)
    for g, n in need.items():
        extra = planned[g].during - planned[g].before
        if isinstance(p, Split):
            # at least the planner's charge; beyond it only the all-gather staging window
            # (zero for a pipeline-only split), and a staged one never its source
            assert n >= extra, (p.op, p.staged, g, n, extra)
            members = next(pos for _, gs, pos in split_member_groups(p) if g in gs)
            window = staging_bytes(specs[p.stage], p.emu.layout.tp, p.emu.layout.pp, members,
                                   (p.sub.tp, p.sub.pp), mv.BUCKET_BYTES)
            assert n <= extra + window, (p.op, p.staged, g, n, extra, window)
        else:
            assert n == extra, (p.op, p.staged, p.stage, g, n, extra)
    return len(need)


@pytest.mark.parametrize("model,seed", [("tiny-llama", s) for s in range(6)]
                         + [("tiny-qwen3", s) for s in range(6)])
def test_workers_allocate_what_the_planner_charged(model: str, seed: int) -> None:
    """For every primitive of a planned schedule, and for the staged copy of each of its
    Splits and Merges."""
    job = cpu_job(model, 8)
    rng = random.Random(seed)
    pair = None
    while pair is None:
        pair = random_pair(rng, job, stage_names(job, 4), rng.choice([4, 6, 8]),
                           rng.choice([4, 6, 8]))
    schedule = plan_transition(job, *pair)
    assert schedule.feasible, schedule.reason
    specs = state_specs(job)
    sizes = StateSizes(job)
    checked = staged = 0
    for sp in schedule.primitives:
        p = sp.primitive
        checked += _check(p, specs, sizes)
        if isinstance(p, (Split, Merge)):
            other = replace(p, staged=not p.staged)
            staged += _check(other, specs, sizes)
            # staged, a worker never needs more than unstaged
            a, b = need_bytes(p, specs[p.stage]), need_bytes(other, specs[p.stage])
            lo, hi = (a, b) if p.staged else (b, a)
            assert all(lo[g] <= hi[g] for g in a)
    assert checked or not schedule.primitives


def test_staged_need_is_what_the_new_shard_takes_beyond_the_source() -> None:
    """The two shapes of the rule: a Merge of two tp=1 replicas into tp=2 needs nothing staged
    (its new shard is smaller than its source), a Split of tp=2 into tp=1 the difference."""
    from nereus.cost.candidate import Layout
    from nereus.runtime.state import position_bytes
    from nereus.transition.emu import Emu, Holds

    job = cpu_job("tiny-llama", 2)
    spec = state_specs(job)["actor_train"]
    a = Emu("a", "actor_train", "actor", Layout(1, 1), (0,), Holds.THETA_OMEGA)
    b = Emu("b", "actor_train", "actor", Layout(1, 1), (1,), Holds.THETA_OMEGA)
    full = position_bytes(spec, 1, 1, 0, 0)
    half = [position_bytes(spec, 2, 1, t, 0) for t in range(2)]
    m = Merge.of([a, b], Layout(2, 1), "m")
    assert need_bytes(m, spec) == {0: half[0], 1: half[1]}
    assert need_bytes(replace(m, staged=True), spec) == {0: 0, 1: 0}
    s = Split.of(m.output, Layout(1, 1), ["x", "y"], staged=True)
    window = staging_bytes(spec, 2, 1, ((0, 0), (1, 0)), (1, 1), mv.BUCKET_BYTES)
    assert need_bytes(s, spec) == {0: full + window - half[0], 1: full + window - half[1]}
    assert need_bytes(replace(s, staged=False), spec) == {0: full + window, 1: full + window}
