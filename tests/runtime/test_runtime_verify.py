"""The check after a transition: each GPU must hold the position its unit gives it, and only
the units the target places there; a shard that is bitwise right for the position it claims is
not enough (a Merge that swapped neighbouring GPUs' positions passed that check).

One Ray session for the module: a pool of four workers, and the pools ``cli_execute`` starts.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from nereus.runtime import demo
from nereus.runtime import executor as ex_mod
from nereus.runtime import movement as mv
from nereus.runtime.executor import Executor, state_specs
from nereus.runtime.placement import place_plan, verify_units
from nereus.runtime.primitives import launch
from nereus.runtime.state import StateMismatch
from nereus.runtime.workers import WorkerContext, WorkerPool
from nereus.transition.emu import Emu
from nereus.transition.planner import plan_transition
from nereus.transition.primitives import Destroy, Merge

from runtime_testlib import (
    check_stages,
    cpu_job,
    plan_of,
    stage_seeds,
    worker_pool,
)

STAGE = "actor_train"
DP2 = (1, 1, [[0], [1]])
TP2PP2 = (2, 2, [[0, 1, 2, 3]])  # from DP2: two Extends, then a Merge of the four copies


@pytest.fixture(scope="module")
def pool() -> Iterator[WorkerPool]:
    with worker_pool(__name__, 4) as p:
        yield p


# after every test, failing ones included: nothing left behind (conftest.py)
pytestmark = pytest.mark.usefixtures("clean")


def swapped_merge(p: Any, pool: WorkerPool, rv: Any, spec: Any, tag: str, timeout_s: float,
                  bucket_bytes: int = mv.BUCKET_BYTES, offloaded: Any = frozenset()) -> Any:
    """The reviewer's mutation: a Merge cuts each GPU its neighbour's position (0<->1, 2<->3);
    every shard is still bitwise right for the position it claims."""
    if not isinstance(p, Merge):
        return launch(p, pool, rv, spec, tag, timeout_s, bucket_bytes, offloaded)
    o = p.output
    src_of = {g: e.id for e in p.emus for g in e.gpus}
    refs = {g: pool.submit(g, mv.merge_member, src_of[g], o.id, (o.layout.tp, o.layout.pp),
                           o.position(i ^ 1), p.staged) for i, g in enumerate(o.gpus)}
    return refs, {}


def _keep(ctx: WorkerContext, unit_id: str) -> mv.MoveResult:
    st = ctx.memory.stats()
    return mv.MoveResult(ctx.device_id, 0.0, 0.0, 0.0, 0, 0, st.held, st.peak)


def leaky_destroy(p: Any, pool: WorkerPool, rv: Any, spec: Any, tag: str, timeout_s: float,
                  bucket_bytes: int = mv.BUCKET_BYTES, offloaded: Any = frozenset()) -> Any:
    """A Destroy that reports success and leaves its source on the workers."""
    if not isinstance(p, Destroy):
        return launch(p, pool, rv, spec, tag, timeout_s, bucket_bytes, offloaded)
    return {g: pool.submit(g, _keep, p.emu.id) for g in p.emu.gpus}, {}


def _run(pool: WorkerPool, cur: tuple, tgt: tuple, seed: int
         ) -> tuple[Any, list[Emu], dict[str, int]]:
    """Place ``cur`` of actor_train, run the transition to ``tgt``; (job, final units, seeds)."""
    job = cpu_job("tiny-llama", 4)
    current, target = plan_of(job, {STAGE: cur}), plan_of(job, {STAGE: tgt})
    schedule = plan_transition(job, current, target)
    specs = state_specs(job)
    seeds = stage_seeds(job, seed)
    place_plan(pool, job, current, specs, seeds)
    report = Executor(pool, specs).run(schedule)
    return job, list(report.units[STAGE]), seeds


def _per_unit(pool: WorkerPool, final: list[Emu], seed: int) -> list[str]:
    """One call per final unit, without ``expected``: each unit's positions, and no other unit
    of its model-stage on its GPUs (``--execute`` also passes ``expected``: every worker's
    whole set of units)."""
    return [d for e in final for d in verify_units(pool, [e], seed)]


def test_a_correct_transition_passes_every_check(pool: WorkerPool) -> None:
    job, final, seeds = _run(pool, DP2, TP2PP2, 1)
    assert [(e.id, e.gpus) for e in final] == [("actor_train/0", (0, 1, 2, 3))]
    assert _per_unit(pool, final, seeds[STAGE]) == []
    assert verify_units(pool, final, seeds, expected=final) == []
    check_stages(pool, job, {STAGE: final}, seeds)


def test_a_merge_that_swaps_positions_fails_the_check(pool: WorkerPool,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ex_mod, "launch", swapped_merge)
    job, final, seeds = _run(pool, DP2, TP2PP2, 2)
    want = [f"actor_train/0 on GPU {g}: expected position {a} of tp=2,pp=2, found position "
            f"{b} of tp=2,pp=2" for g, a, b in [(0, (0, 0), (1, 0)), (1, (1, 0), (0, 0)),
                                                 (2, (0, 1), (1, 1)), (3, (1, 1), (0, 1))]]
    assert _per_unit(pool, final, seeds[STAGE]) == want
    assert verify_units(pool, final, seeds, expected=final) == want
    # the tests' own check (gather) saw every position present and passed it too
    with pytest.raises(StateMismatch, match=r"on GPU 0: expected position \(0, 0\)"):
        check_stages(pool, job, {STAGE: final}, seeds)


def test_a_destroy_that_leaves_its_source_is_reported(pool: WorkerPool,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ex_mod, "launch", leaky_destroy)
    job, final, seeds = _run(pool, DP2, (1, 1, [[0]]), 3)
    assert [(e.id, e.gpus) for e in final] == [("actor_train/0", (0,))]
    check_stages(pool, job, {STAGE: final}, seeds)  # what is there is right
    assert verify_units(pool, final, seeds, expected=final) == [
        ("GPU 1 holds unit(s) ['actor_train/1'] that the target does not place there "
         "(expected [])")]


def test_a_leftover_or_missing_shard_beside_a_unit_is_reported_unit_by_unit(
        pool: WorkerPool) -> None:
    """Checked one unit at a time, a GPU of the unit holding a second unit of its model-stage
    (a Split's or Merge's source left behind) is reported, and so is a shard gone."""
    job, final, seeds = _run(pool, DP2, TP2PP2, 4)
    spec = state_specs(job)[STAGE]
    pool.run({2: (mv.place_seeded, ("actor_train/7", spec, (1, 1), (0, 0), seeds[STAGE])),
              3: (mv.destroy_member, ("actor_train/0",))})
    want = ["actor_train/0 on GPU 3: expected position (1, 1) of tp=2,pp=2, found no such unit",
            ("GPU 2 holds unit(s) ['actor_train/7'] that the target does not place there "
             "(expected ['actor_train/0'])")]
    assert _per_unit(pool, final, seeds[STAGE]) == want
    assert verify_units(pool, final, seeds, expected=final) == want


@pytest.mark.parametrize("mutate", [False, True])
def test_the_cli_reports_a_misplaced_shard_as_a_difference(
        monkeypatch: pytest.MonkeyPatch, mutate: bool) -> None:
    """``nereus transition --execute`` end to end on its own workers: exit 1 and the shard
    named in ``differences`` after a swapped Merge, exit 0 and none after a correct one."""
    if mutate:
        monkeypatch.setattr(ex_mod, "launch", swapped_merge)
    job = cpu_job("tiny-llama", 4)
    current, target = plan_of(job, {STAGE: DP2}), plan_of(job, {STAGE: TP2PP2})
    lines: list[str] = []
    code = demo.cli_execute(job, current, target, as_json=True, echo=lines.append)
    out = json.loads(lines[0])
    assert (code, out["bitwise_equal"]) == ((1, False) if mutate else (0, True))
    if mutate:
        assert out["differences"][0] == ("actor_train/0 on GPU 0: expected position (0, 0) of "
                                         "tp=2,pp=2, found position (1, 0) of tp=2,pp=2")
    else:
        assert out["differences"] == []
