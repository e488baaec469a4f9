"""Property tests: on random plan pairs (pools that grow and shrink, TP/PP/DP changes, moves,
memory pressure), every feasible schedule passes the independent validator, and every
infeasible one says which model-stages and GPUs stand in the way."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from nereus.transition.instances import make_job, random_pair, stage_names
from nereus.transition.planner import plan_transition, transition_dag
from nereus.transition.primitives import Destroy, Split
from nereus.transition.validate import validate

GPUS = st.sampled_from([4, 8, 12, 16, 24, 32])
MODELS = st.sampled_from(["tiny-llama", "tiny-qwen3"])


def pair(seed: int, model: str, gpus: int, memory_gib: float | None, algo: str = "ppo",
         execution: str = "sync", share: float | None = None):
    rng = random.Random(seed)
    job = make_job(model, gpus, device="cpu", memory_gib=memory_gib, algo=algo,
                   execution=execution)
    names = stage_names(job, 6)
    stages = rng.sample(names, rng.randint(1, len(names)))
    sizes = [max(1, gpus // 2), max(1, gpus * 3 // 4), gpus]
    got = random_pair(rng, job, stages, rng.choice(sizes), rng.choice(sizes),
                      shuffle=0.1, share=share)
    return job, got


def check(job, got) -> str:
    if got is None:
        return "none"
    cur, tgt = got
    s = plan_transition(job, cur, tgt)
    if not s.feasible:
        assert s.reason
        assert any(name in s.reason for name in cur.names), s.reason
        assert "GPU" in s.reason, s.reason
        return "infeasible"
    errs = validate(job, cur, tgt, s)
    assert errs == [], "\n".join(errs[:10])
    return "ok"


@settings(max_examples=1200)
@given(st.integers(0, 10**9), MODELS, GPUS,
       st.sampled_from([None, 0.0035, 0.005, 0.008]))
def test_every_feasible_schedule_is_valid_under_memory_pressure(seed: int, model: str,
                                                                  gpus: int,
                                                                  memory_gib: float | None
                                                                  ) -> None:
    job, got = pair(seed, model, gpus, memory_gib)
    check(job, got)


@settings(max_examples=400)
@given(st.integers(0, 10**9), GPUS, st.sampled_from(["grpo", "remax"]),
       st.sampled_from(["sync", "async"]))
def test_other_workflows_and_async_ownership(seed: int, gpus: int, algo: str,
                                             execution: str) -> None:
    job, got = pair(seed, "tiny-llama", gpus, 0.005, algo, execution)
    check(job, got)


@settings(max_examples=300)
@given(st.integers(0, 10**9), st.sampled_from([4, 8, 16]))
def test_onto_fresh_gpus_with_room_always_works(seed: int, gpus: int) -> None:
    """With memory to spare and a target on GPUs nobody uses yet, nothing can block: no
    GPU is contended and every copy has a source."""
    rng = random.Random(seed)
    job = make_job("tiny-llama", 2 * gpus, device="cpu", memory_gib=1.0)
    stages = rng.sample(stage_names(job, 6), rng.randint(1, 6))
    from nereus.transition.instances import random_plan

    cur = random_plan(rng, job, list(range(gpus)), stages)
    tgt = random_plan(rng, job, list(range(gpus, 2 * gpus)), stages)
    if cur is None or tgt is None:
        return
    s = plan_transition(job, cur, tgt)
    assert s.feasible, s.reason
    assert validate(job, cur, tgt, s) == []


@settings(max_examples=200)
@given(st.integers(0, 10**9), MODELS, GPUS, st.sampled_from([None, 0.005]))
def test_no_split_only_feeds_destroys(seed: int, model: str, gpus: int,
                                      memory_gib: float | None) -> None:
    """Every Split's pieces serve: one is kept as or merged into a target unit, or copied by
    an Extend. A Split whose pieces are all destroyed gathers a whole unit for nothing."""
    job, got = pair(seed, model, gpus, memory_gib)
    if got is None:
        return
    dag, _ = transition_dag(job, *got)
    if not dag.feasible:
        return
    used = {e.id for p in dag.primitives if not isinstance(p, Destroy) for e in p.inputs}
    used |= {e.id for units in dag.final.values() for e in units}
    for p in dag.primitives:
        if isinstance(p, Split):
            assert any(o.id in used for o in p.outputs), f"Split({p.emu.id}) only feeds Destroys"
