"""``plan_transition``: from the plan a job runs to the plan it should run, the schedule and L_tran.

The controller prices a move with ``estimated_s`` (Eq. 2) and the runtime executes the
primitives in the schedule, so both read the same object.
"""

from __future__ import annotations

from nereus.cost.efficiency import Efficiencies
from nereus.cost.estimate import HEADROOM
from nereus.errors import InputError
from nereus.plan.types import Plan
from nereus.spec.job import JobSpec
from nereus.spec.sharding import layout_problem, layout_sizes
from nereus.transition.cost import TransitionCost
from nereus.transition.global_dag import TransitionDag, build_dag
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
            bad = [g for g in sp.gpus if g < 0]
            if bad:
                raise InputError(f"{which}.{sp.stage}.gpus", f"negative GPU ids {bad}",
                                 "ids >= 0")


def transition_dag(job: JobSpec, current: Plan, target: Plan,
                   efficiencies: Efficiencies | None = None) -> tuple[TransitionDag, TransitionCost]:
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
