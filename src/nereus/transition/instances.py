"""Random plan pairs for property tests and the transition benchmark (not for planning).

A plan places each phase on the pool afresh: the phase's model-stages are split into groups,
each group gets a disjoint block of GPUs, and each stage lays ``dp`` replicas of a random layout
over a prefix of its block (TP innermost, like the planner's placement). A target plan keeps a
phase as it was, changes DP or the layout of some stages in place, or places the phase again on
a pool that grew or shrank. Everything is drawn from one seeded ``random.Random``.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence

from nereus.cost.candidate import Candidate, Layout
from nereus.plan.types import Plan, StagePlan
from nereus.spec.job import JobSpec, parse_job
from nereus.spec.sharding import layout_problem
from nereus.spec.workflow import Phase
from nereus.transition.emu import holds_for
from nereus.transition.planner import capacity_bytes
from nereus.transition.sizes import StateSizes

POW2 = (1, 2, 4, 8)


def make_job(model: str, gpus: int, device: str = "h100-sxm-80gb", memory_gib: float | None = None,
             algo: str = "ppo", execution: str = "sync") -> JobSpec:
    cluster: dict[str, object] = {"device": device, "devices_per_node": 8}
    if memory_gib is not None:
        cluster["device_memory_gib"] = memory_gib
    return parse_job({"model": model, "gpus": gpus, "algo": algo, "execution": execution,
                      "cluster": cluster})


def fitting_layouts(job: JobSpec, stage: str, max_size: int, share: float = 1.0) -> list[Layout]:
    """Layouts whose fullest position takes at most ``share`` of a GPU's capacity."""
    sizes = StateSizes(job)
    model, holds = holds_for(job, stage)
    cap = capacity_bytes(job) * share
    out = []
    for tp in POW2:
        for pp in POW2:
            lay = Layout(tp, pp)
            if lay.size > max_size or layout_problem(job.model, tp, pp):
                continue
            if max(sizes.of_layout(model, holds.value == "theta+omega", lay)) <= cap:
                out.append(lay)
    return out


def _stage_plan(rng: random.Random, job: JobSpec, name: str, ids: Sequence[int], share: float,
                shuffle: float) -> StagePlan | None:
    lays = fitting_layouts(job, name, len(ids), share)
    if not lays:
        return None
    lay = rng.choice(lays)
    dp = rng.randint(1, len(ids) // lay.size)
    start = rng.randrange(0, len(ids) - dp * lay.size + 1, lay.size) if rng.random() < 0.3 else 0
    reps = []
    for r in range(dp):
        rep = list(ids[start + r * lay.size:start + (r + 1) * lay.size])
        if rng.random() < shuffle:
            rng.shuffle(rep)
        reps.append(tuple(rep))
    return StagePlan(name, Candidate(lay, dp, 1, 1), tuple(reps))


def random_plan(rng: random.Random, job: JobSpec, ids: Sequence[int], stages: Sequence[str],
                shuffle: float = 0.05, share: float | None = None) -> Plan | None:
    """One plan over the pool ``ids`` for ``stages``; None when a stage fits nowhere.

    Each stage's fullest position takes at most ``share`` of a GPU (default: an equal part for
    every stage, so that all of them fit on one GPU at once, as during a transition)."""
    share = share if share is not None else 1.0 / max(1, len(stages))
    wf = job.workflow
    plans: dict[str, StagePlan] = {}
    groups: list[tuple[str, ...]] = []
    for phase in Phase:
        names = [s.name for s in wf.phase_stages(phase) if s.name in stages]
        if not names:
            continue
        rng.shuffle(names)
        cuts = sorted(rng.sample(range(1, len(names)), rng.randint(0, len(names) - 1))) \
            if len(names) > 1 else []
        parts = [names[a:b] for a, b in zip([0, *cuts], [*cuts, len(names)])]
        # a block per group, in chunks of 8 where the pool allows
        pool = list(ids)
        unit = 8 if len(pool) >= 8 * len(parts) else 1
        chunks = len(pool) // unit
        if chunks < len(parts):
            return None
        weights = sorted(rng.sample(range(1, chunks), len(parts) - 1)) if len(parts) > 1 else []
        bounds = [0, *weights, chunks]
        for part, a, b in zip(parts, bounds, bounds[1:]):
            block = pool[a * unit:b * unit]
            for name in part:
                sp = _stage_plan(rng, job, name, block, share, shuffle)
                if sp is None:
                    return None
                plans[name] = sp
            if len(part) > 1:
                groups.append(tuple(part))
    return Plan(tuple(plans[s.name] for s in wf.stages if s.name in plans), groups=tuple(groups))


def mutate_plan(rng: random.Random, job: JobSpec, plan: Plan, ids: Sequence[int],
                shuffle: float = 0.05, share: float | None = None) -> Plan | None:
    """A target near ``plan``: per phase keep it, resize or re-layout stages in place, or
    place the phase again on ``ids`` (the new pool)."""
    wf = job.workflow
    share = share if share is not None else 1.0 / max(1, len(plan.names))
    fresh = random_plan(rng, job, ids, plan.names, shuffle, share)
    if fresh is None:
        return None
    pool = set(ids)
    out: dict[str, StagePlan] = {}
    groups = list(fresh.groups)
    for phase in Phase:
        names = [s.name for s in wf.phase_stages(phase) if s.name in plan.names]
        if not names:
            continue
        fits = all(set(plan.stage(n).gpus) <= pool for n in names)
        mode = rng.random()
        if fits and mode < 0.3:
            for n in names:
                out[n] = plan.stage(n)
            groups = [g for g in groups if not set(g) & set(names)]
            groups += [g for g in plan.groups if set(g) & set(names)]
        elif fits and mode < 0.6:
            for n in names:
                out[n] = _in_place(rng, job, plan.stage(n), share) or plan.stage(n)
            groups = [g for g in groups if not set(g) & set(names)]
            groups += [g for g in plan.groups if set(g) & set(names)]
        else:
            for n in names:
                out[n] = fresh.stage(n)
    return Plan(tuple(out[s.name] for s in wf.stages if s.name in out), groups=tuple(groups))


def _in_place(rng: random.Random, job: JobSpec, sp: StagePlan, share: float) -> StagePlan | None:
    """Same GPUs as ``sp`` (a prefix of them), another DP degree or layout."""
    gpus = list(sp.gpus)
    lays = fitting_layouts(job, sp.stage, len(gpus), share)
    if not lays:
        return None
    lay = rng.choice(lays) if rng.random() < 0.5 else sp.layout
    if lay.size > len(gpus) or lay not in lays:
        return None
    dp = rng.randint(1, len(gpus) // lay.size)
    reps = tuple(tuple(gpus[r * lay.size:(r + 1) * lay.size]) for r in range(dp))
    return StagePlan(sp.stage, Candidate(lay, dp, 1, 1), reps)


def random_pair(rng: random.Random, job: JobSpec, stages: Sequence[str], cur_gpus: int,
                tgt_gpus: int, shuffle: float = 0.05,
                share: float | None = None) -> tuple[Plan, Plan] | None:
    """(current, target) over pools of ``cur_gpus`` and ``tgt_gpus`` of ``job``'s cluster."""
    n = job.cluster.num_devices
    base = rng.sample(range(n), max(cur_gpus, tgt_gpus)) if rng.random() < 0.2 else \
        list(range(max(cur_gpus, tgt_gpus)))
    cur_ids = sorted(base[:cur_gpus]) if cur_gpus <= tgt_gpus else sorted(base)
    tgt_ids = sorted(base) if cur_gpus <= tgt_gpus else sorted(base[:tgt_gpus])
    cur = random_plan(rng, job, cur_ids, stages, shuffle, share)
    if cur is None:
        return None
    tgt = mutate_plan(rng, job, cur, tgt_ids, shuffle, share)
    if tgt is None:
        return None
    return cur, tgt


def _sp(name: str, tp: int, pp: int, replicas: Sequence[Sequence[int]]) -> StagePlan:
    reps = tuple(tuple(r) for r in replicas)
    return StagePlan(name, Candidate(Layout(tp, pp), len(reps), 1, 1), reps)


def paper_example_a() -> tuple[Plan, Plan]:
    """§5.1: actor generation and critic training, each (TP=1, PP=4, DP=2) on 16 GPUs; the pool
    grows to 32 and responses to 4K. The actor goes to (TP=2, PP=4, DP=2), the critic to
    (TP=1, PP=4, DP=4). Each actor target unit is the Merge of two (1, 4) units laid
    TP-innermost: the first from the current replicas, the second from their Extends."""
    cur = Plan((_sp("actor_gen", 1, 4, [range(4), range(4, 8)]),
                _sp("critic_train", 1, 4, [range(8, 12), range(12, 16)])))
    tgt = Plan((_sp("actor_gen", 2, 4, [[0, 4, 1, 5, 2, 6, 3, 7],
                                        [16, 20, 17, 21, 18, 22, 19, 23]]),
                _sp("critic_train", 1, 4, [range(8, 12), range(12, 16), range(24, 28),
                                           range(28, 32)])))
    return cur, tgt


def paper_example_b() -> tuple[Plan, Plan]:
    """§6.1, Fig. 6: reward inference (TP=4, PP=8) on 32 GPUs becomes (TP=8, PP=2) on 16 of
    them. The (4, 2) pieces of the Split on GPUs 0-7 and 16-23 are exactly the two pieces the
    target unit merges, so two are kept and two destroyed."""
    cur = Plan((_sp("reward_infer", 4, 8, [range(32)]),))
    tgt = Plan((_sp("reward_infer", 8, 2, [[0, 4, 1, 5, 2, 6, 3, 7,
                                            16, 20, 17, 21, 18, 22, 19, 23]]),))
    return cur, tgt


def stage_names(job: JobSpec, count: int) -> list[str]:
    return [s.name for s in job.workflow.stages][:count]


def describe(plan: Plan) -> Mapping[str, str]:
    return {sp.stage: f"tp={sp.tp} pp={sp.pp} dp={sp.dp} gpus={list(sp.gpus)}"
            for sp in plan.stages}
