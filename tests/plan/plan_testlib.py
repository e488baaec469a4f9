"""What the plan tests share."""

from nereus.cost.model import CostModel
from nereus.plan.types import Plan
from nereus.spec import JobSpec
from nereus.spec.workflow import Execution


def searched_latency(job: JobSpec, plan: Plan, cost: CostModel | None = None) -> float:
    """The plan's step latency with the weight sync priced from GPU counts, as the search and
    the brute force price it (the plan prices its sync as placed: the two differ where the
    pool kept generation off the training GPUs). A synchronous sync lies on the step's
    critical path (training, then sync, then generation), so it adds."""
    sync = job.workflow.weight_sync()
    if sync is None or job.workflow.execution is not Execution.SYNC:
        return plan.step_latency_s
    cost = cost or CostModel(job)
    t, g = plan.stage(sync[0]).candidate, plan.stage(sync[1]).candidate
    return plan.step_latency_s - plan.terms["weight_sync"] + cost.weight_sync(t, g).latency_s


def divisors_only(job: JobSpec):
    """A ``Planner`` keep filter of the space before uneven DP shares: every stage's DP
    divides its batch (what a plan cost when only training's rule held everywhere)."""
    cost = CostModel(job)
    batch = {s.name: cost.stage_batch(s) for s in job.workflow.stages}
    return lambda st, c: batch[st.name] % c.dp == 0
