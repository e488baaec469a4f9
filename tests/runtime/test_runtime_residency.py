"""The runtime holds a transition's state as the planner's model says (``runtime.residency``):
units the schedule takes as offloaded live in host memory, uncounted, until their first reader
loads them; a schedule the planner certified runs where the runtime used to refuse it."""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator

import pytest
import ray
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from nereus.errors import InfeasibleError
from nereus.runtime import movement as mv
from nereus.runtime.executor import Executor, replay, state_specs
from nereus.runtime.loading import seeded_meta
from nereus.runtime.placement import place_current, place_units
from nereus.runtime.primitives import loads, workers_of
from nereus.runtime.residency import residency
from nereus.runtime.state import StateSpec, arena_layout, position_bytes
from nereus.runtime.workers import WorkerContext, WorkerPool
from nereus.spec.job import JobSpec, parse_job
from nereus.spec.model import MODEL_PRESETS
from nereus.transition.instances import random_pair, stage_names
from nereus.transition.planner import plan_transition, transition_dag
from nereus.transition.schedule import Schedule, list_schedule

from runtime_testlib import (
    check_stages,
    cpu_job,
    plan_of,
    stage_seeds,
    worker_pool,
)

SPEC = StateSpec(MODEL_PRESETS["tiny-llama"])
ONE = arena_layout(SPEC, 1, 1, 0, 0).nbytes


def test_an_offloaded_unit_is_counted_only_once_loaded() -> None:
    ctx = WorkerContext(0, torch.device("cpu"), ONE)
    mv.place_seeded(ctx, "a", SPEC, (1, 1), (0, 0), 3, offloaded=True)
    mv.place_seeded(ctx, "b", SPEC, (1, 1), (0, 0), 4, offloaded=True)  # 2 x ONE held
    assert ctx.memory.stats().held == 0 and ctx.offloaded == {"a", "b"}
    assert ctx.load("a") == ONE and ctx.memory.stats().held == ONE
    with pytest.raises(Exception, match="load b"):  # no room: b stays offloaded
        ctx.load("b")
    assert ctx.offloaded == {"b"}
    assert ctx.drop("b") == 0 and ctx.memory.stats().held == ONE  # host memory only
    assert ctx.rename({"a": "c"}, "t") and ctx.offload("c") == ONE
    assert ctx.offloaded == {"c"} and ctx.memory.stats().held == 0
    assert mv.verify_seeded(ctx, "c", 3) is None
    st = ctx.allocate(SPEC, 1, 1, 0, 0, seeded_meta(1))  # the room is free for live state
    ctx.free(st)


def test_a_unit_an_engine_computes_on_is_not_offloaded() -> None:
    ctx = WorkerContext(0, torch.device("cpu"), ONE)
    mv.place_seeded(ctx, "a", SPEC, (1, 1), (0, 0), 3)
    ctx.in_use["engine/a"] = "a"  # what engine.remote.attach records
    with pytest.raises(RuntimeError, match="unit a is in use by engine/a; detach"):
        ctx.offload("a")
    assert not ctx.offloaded and ctx.memory.stats().held == ONE
    assert mv.unit_residency(ctx)[2] == {"a"}
    del ctx.in_use["engine/a"]  # detached
    assert ctx.offload("a") == ONE


JOB_A = {"model": "tiny-llama", "gpus": 3, "cluster": {
    "device": "cpu", "devices_per_node": 4, "device_memory_gib": 0.001034802860683865},
    "workload": {"param_dtype": "fp32"}}
JOB_B = {"model": "tiny-llama", "gpus": 8, "algo": "grpo", "cluster": {
    "device": "cpu", "devices_per_node": 8, "device_memory_gib": 0.00341796875},
    "workload": {"param_dtype": "fp32", "prompts_per_step": 8, "ppo_mini_batches": 2,
                 "responses_per_prompt": 8}}
# repro A: two units on GPU 0 that only fit one at a time, each moved away by an Extend
A = ({"actor_gen": (1, 1, [[0]]), "reward_infer": (1, 1, [[0]])},
     {"actor_gen": (1, 1, [[1]]), "reward_infer": (1, 1, [[2]])})
# repro B: four model-stages reshuffled on 8 GPUs, each unit loaded by its first reader
B = ({"actor_gen": (2, 1, [[0, 1]]), "reference_infer": (1, 1, [[0]]),
      "reward_infer": (1, 2, [[3, 4], [5, 6]]), "actor_train": (4, 1, [[0, 1, 2, 3],
                                                                     [4, 5, 6, 7]])},
     {"actor_gen": (2, 1, [[0, 1], [6, 7]]), "reference_infer": (2, 1, [[1, 6]]),
      "reward_infer": (1, 1, [[0]]), "actor_train": (1, 4, [[0, 1, 6, 7]])})


def _schedule(raw: dict, pair: tuple[dict, dict]) -> tuple[JobSpec, Schedule]:
    job = parse_job(raw)
    schedule = plan_transition(job, plan_of(job, pair[0]), plan_of(job, pair[1]))
    assert schedule.feasible and schedule.loads_on_first_read, schedule.reason
    return job, schedule


@pytest.fixture(scope="module")
def pool() -> Iterator[WorkerPool]:
    with worker_pool(__name__, 8) as p:
        yield p



@pytest.mark.parametrize("raw,pair", [(JOB_A, A), (JOB_B, B)], ids=["offload", "jit"])
def test_a_schedule_that_loads_on_first_read_runs_bitwise_within_capacity(
        clean: WorkerPool, raw: dict, pair: tuple[dict, dict]) -> None:
    """Placed as the schedule assumes (every unit offloaded, as it loads each on first read),
    the transition runs to its end, every unit bitwise equal, no worker past its capacity,
    and no worker's counted peak above the planner's."""
    pool = clean
    job, schedule = _schedule(raw, pair)
    pool.set_capacity(schedule.capacity_bytes)
    specs, seeds = state_specs(job), stage_seeds(job, 7)
    place_current(pool, schedule, specs, seeds)
    report = Executor(pool, specs).run(schedule)
    check_stages(pool, job, {s: report.units[s] for s in schedule.changed}, seeds)
    assert report.within_capacity(), (report.peak_bytes, report.capacity_bytes)
    planned = schedule.peak_bytes()
    assert all(b <= planned.get(g, 0) for g, b in report.peak_bytes.items()), \
        (report.peak_bytes, planned)


def test_units_placed_resident_are_offloaded_as_the_schedule_assumes(clean: WorkerPool
                                                                      ) -> None:
    """The executor offloads what the schedule takes as offloaded before the first
    primitive, so a caller that placed everything on the devices runs it too (repro A's
    units fit side by side only on a larger worker; the run counts one at a time)."""
    pool = clean
    job, schedule = _schedule(JOB_A, A)
    specs, seeds = state_specs(job), stage_seeds(job, 8)
    units = [e for s in schedule.changed for e in schedule.initial[s]]
    place_units(pool, units, specs, seeds)  # resident, all of them
    report = Executor(pool, specs).run(schedule)
    check_stages(pool, job, {s: report.units[s] for s in schedule.changed}, seeds)
    assert report.peak_bytes[0] <= schedule.peak_bytes()[0]


def _hog(ctx: WorkerContext, nbytes: int) -> None:
    ctx.memory.reserve(nbytes, "another model-stage's state")


def _unhog(ctx: WorkerContext, nbytes: int) -> None:
    ctx.memory.release(nbytes)


def test_preflight_refuses_before_anything_moves(clean: WorkerPool) -> None:
    """A worker that holds more at the start than the schedule assumes (another model-stage's
    state) is named, with the primitive that would not fit there and its bytes, before any
    primitive starts; every unit stays where it was."""
    pool = clean
    job, schedule = _schedule(JOB_A, A)
    pool.set_capacity(schedule.capacity_bytes)
    specs, seeds = state_specs(job), stage_seeds(job, 9)
    place_current(pool, schedule, specs, seeds)
    extra = schedule.capacity_bytes - schedule.peak_bytes()[1] + 1
    ray.get(pool.submit(1, _hog, extra))
    try:
        with pytest.raises(InfeasibleError) as e:
            Executor(pool, specs).run(schedule)
        msg = str(e.value)
        assert "\n" not in msg and "needs more memory than workers [1] have free" in msg, msg
        assert "nothing has moved" in msg
    finally:
        ray.get(pool.submit(1, _unhog, extra))
    held = pool.run({0: (mv.held_units, ())})[0]
    assert set(held) == set(residency(schedule).units)  # nothing moved
    check_stages(pool, job, {s: schedule.initial[s] for s in schedule.changed}, seeds)


@settings(max_examples=60, deadline=None)
@given(model=st.sampled_from(["tiny-llama", "tiny-qwen3"]),
       memory_mib=st.floats(1.0, 8.0), seed=st.integers(0, 10_000))
def test_the_runtimes_residency_is_the_planners(model: str, memory_mib: float, seed: int
                                                ) -> None:
    """For random plan pairs (tiny models, tight to roomy GPUs): the bytes the runtime holds
    on each GPU at the start (the units ``residency`` loads then, at the runtime's arena
    sizes) are the planner's ``TransitionDag.initial_bytes``; what each primitive loads is
    what the planner charges it for its loads; and the runtime's replay of each worker's
    primitives in the schedule's order (the executor's preflight) refuses nothing and never
    holds more than the planner's peak of that GPU."""
    job = cpu_job(model, 8, memory_mib=memory_mib)
    rng = random.Random(seed)
    cur, tgt = rng.choice([(4, 8), (8, 4), (8, 8), (6, 8), (8, 6), (2, 8)])
    pair = random_pair(rng, job, stage_names(job, 6), cur, tgt)
    assume(pair is not None)
    assert pair is not None
    dag, cost = transition_dag(job, *pair)
    assume(dag.feasible)
    schedule = list_schedule(dag, cost)
    res, specs = residency(schedule), state_specs(job)
    assert res.loads_on_first_read == dag.loads_on_first_read

    def bytes_of(ids: Iterable[str]) -> dict[int, int]:
        out: dict[int, int] = {}
        for u in ids:
            e = res.units[u]
            for i, g in enumerate(e.gpus):
                out[g] = out.get(g, 0) + position_bytes(specs[e.stage], e.layout.tp,
                                                        e.layout.pp, *e.position(i))
        return out

    start = bytes_of(res.loaded_at_start)
    assert start == {g: b for g, b in dag.initial_bytes.items() if b}
    offloaded = set(res.offloaded_at_start)  # as the executor tracks it
    for sp in schedule.primitives:
        loaded = {u for us in loads(sp.primitive, offloaded).values() for u in us}
        offloaded -= {e.id for e in sp.primitive.inputs}
        if sp.op == "Destroy":  # loads nothing (the planner charges an offloaded one zero)
            continue
        own = sp.primitive.memory(cost.sizes)
        charged = {g: own[g].before - m.before for g, m in sp.memory.items()}
        assert bytes_of(loaded) == {g: b for g, b in charged.items() if b}, (sp.index, sp.op)
    prims = [sp.primitive for sp in schedule.primitives]
    gpus = {g for p in prims for g in workers_of(p)}
    peaks = replay(prims, specs, {g: start.get(g, 0) for g in gpus},
                   dict.fromkeys(gpus, schedule.capacity_bytes), res.offloaded_at_start)
    planned = schedule.peak_bytes()
    assert all(b <= planned.get(g, 0) for g, b in peaks.items()), (peaks, planned)
