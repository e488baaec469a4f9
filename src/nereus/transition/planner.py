"""``plan_transition``: from the plan a job runs to the plan it should run, the schedule and L_tran.

The controller prices a move with ``estimated_s`` (Eq. 2) and the runtime executes the
primitives in the schedule, so both read the same object.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from nereus.cost.efficiency import Efficiencies
from nereus.cost.estimate import HEADROOM
from nereus.errors import InputError
from nereus.plan.types import Plan
from nereus.spec.job import JobSpec
from nereus.spec.sharding import layout_problem, layout_sizes
from nereus.transition.cost import TransitionCost
from nereus.transition.global_dag import TransitionDag, build_dag
from nereus.transition.ownership import Ownership
from nereus.transition.schedule import Schedule, infeasible_schedule, list_schedule
from nereus.transition.sizes import StateSizes


def capacity_bytes(job: JobSpec) -> int:
    """Bytes a GPU may hold during a transition: the planner's headroom rule."""
    return int(HEADROOM * job.cluster.device.memory_bytes)


def check_plans(job: JobSpec, current: Plan, target: Plan) -> None:
    """Raise :class:`InputError` for plans that cannot describe one job's transition."""
    if set(current.names) != set(target.names):
        only_c = sorted(set(current.names) - set(target.names))
        only_t = sorted(set(target.names) - set(current.names))
        # named after the plan that lacks a stage the other lists
        which, lacks, other = (("target", only_c, "current") if only_c
                               else ("current", only_t, "target"))
        raise InputError(f"{which}.stages", f"lacks {', '.join(lacks)}, which the {other} "
                         f"plan lists (only current: {only_c}, only target: {only_t})",
                         "the same model-stages in both plans")
    for which, plan in (("current", current), ("target", target)):
        for sp in plan.stages:
            job.workflow.stage(sp.stage)  # raises InputError for an unknown stage
            p = layout_problem(job.model, sp.tp, sp.pp)
            if p:
                raise InputError(f"{which}.{sp.stage}", p, layout_sizes(job.model))
            n = job.cluster.num_devices
            bad = sorted({g for g in sp.gpus if not 0 <= g < n})
            if bad:
                raise InputError(f"{which}.{sp.stage}.gpus", f"GPU ids {bad} outside the "
                                 f"cluster's {n} devices", f"ids 0..{n - 1}")


def transition_dag(job: JobSpec, current: Plan, target: Plan,
                   efficiencies: Efficiencies | None = None
                   ) -> tuple[TransitionDag, TransitionCost]:
    """The global DAG (with resource edges) and the cost model that prices its primitives."""
    check_plans(job, current, target)
    eff = efficiencies if efficiencies is not None else Efficiencies(device=job.cluster.device.name)
    cost = TransitionCost(job.cluster, StateSizes(job), eff)
    return build_dag(job, current, target, cost, capacity_bytes(job)), cost


def plan_transition(job: JobSpec, current: Plan, target: Plan,
                    efficiencies: Efficiencies | None = None) -> Schedule:
    """The schedule that moves ``job`` from ``current`` to ``target`` (estimated times)."""
    dag, cost = transition_dag(job, current, target, efficiencies)
    if not dag.feasible:
        return infeasible_schedule(dag, cost.eff)
    return list_schedule(dag, cost)


@dataclass(frozen=True)
class TwoMoves:
    """A way to ``target`` in two transitions where one has no memory-safe schedule: first
    the model-stages ``first_moved`` (to ``waypoint``, the current plan with those stages as
    the target places them), then the rest. Times estimated; the waypoint is not priced (the job
    runs no step there), so its step latency reads 0."""

    first_moved: tuple[str, ...]
    waypoint: Plan
    first: Schedule
    second: Schedule

    @property
    def estimated_s(self) -> float:
        return self.first.estimated_s + self.second.estimated_s


def in_two_moves(job: JobSpec, current: Plan, target: Plan,
                 efficiencies: Efficiencies | None = None) -> TwoMoves | None:
    """The cheapest :class:`TwoMoves` from ``current`` to ``target`` that moves one changing
    model-stage first, or all but one (as the controller's hybrid targets split a move), or
    None where no such pair is memory-safe. The plan between them keeps apart every pair of
    model-stages the one move may not let meet (``Ownership``): two moves get round memory,
    never that rule.

    Two moves can fit where one does not: a transition keeps every unit it makes on its GPUs
    until it ends, while between transitions, as at any phase boundary, idle model-stages are
    offloaded to host memory, the first move's new units included (8B PPO from the planner's
    best plan on 4 GPUs to its best on 8: no order of all six stages' moves fits, while critic
    training first and then the rest do)."""
    changed = [sp.stage for sp in current.stages
               if (sp.layout, sp.replicas) != (target.stage(sp.stage).layout,
                                                target.stage(sp.stage).replicas)]
    # the stages that may not meet in the one move (they run side by side in either plan) may
    # not meet at the waypoint either: moving there would serialize them behind the rule
    rivals = Ownership.between(job.workflow, current, target)
    best: TwoMoves | None = None
    for moved in first_moves(changed):
        waypoint = Plan(tuple(target.stage(sp.stage) if sp.stage in moved else sp
                              for sp in current.stages))
        if not _keeps_apart(rivals, waypoint):
            continue
        first = plan_transition(job, current, waypoint, efficiencies)
        if not first.feasible:
            continue
        second = plan_transition(job, waypoint, target, efficiencies)
        if second.feasible and (best is None or first.estimated_s + second.estimated_s
                                < best.estimated_s):
            best = TwoMoves(moved, waypoint, first, second)
    return best


def first_moves(changed: Sequence[str]) -> list[tuple[str, ...]]:
    """The ways to split a move of the model-stages ``changed`` in two by what goes first: each
    one alone, and all but each one (none where fewer than two change). The controller's
    ``hybrid`` targets mix plans the same way, by phase too, as targets to run, not waypoints."""
    out: list[tuple[str, ...]] = []
    for n in changed if len(changed) > 1 else ():
        for moved in ((n,), tuple(m for m in changed if m != n)):
            if moved not in out:
                out.append(moved)
    return out


def _keeps_apart(rivals: Ownership, plan: Plan) -> bool:
    """Whether ``plan`` puts no pair of ``rivals`` on a GPU beyond those the pair may share."""
    for a, of in rivals.rivals.items():
        gpus = set(plan.stage(a).gpus)
        if any((gpus & set(plan.stage(b).gpus)) - exempt for b, exempt in of.items()):
            return False
    return True
