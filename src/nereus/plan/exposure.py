"""Which model-stages a plan loses outright when one node of its pool goes away.

Spot reclaims and scheduler preemptions take whole machines. A model-stage whose replicas all
touch one node has no surviving copy when that node goes: the controller cannot move its state
and the job restarts from the last checkpoint (``nereus.control.targets.survive`` is the same
rule applied after the fact), unless the stage is made again without one
(``Workflow.after_loss``): a frozen model's, whose weights are read again, or a copy of a
trained model's θ whose training stage keeps a replica. A stage with replicas on different
nodes keeps a copy, and the controller moves on from the survivors with a transition.
"""

from __future__ import annotations

from collections.abc import Mapping

from nereus.plan.types import Plan
from nereus.spec.cluster import Cluster, GpuPool
from nereus.spec.workflow import Workflow


def spans_nodes(pool: GpuPool) -> bool:
    """Whether ``pool`` has GPUs on more than one node: only then can a plan keep a copy of a
    model-stage on another node (on one node, losing it loses everything)."""
    return len(pool.by_node()) > 1


def exposed_by_node(plan: Plan, cluster: Cluster,
                    workflow: Workflow | None = None) -> Mapping[int, tuple[str, ...]]:
    """Node -> the model-stages whose every replica has a GPU on it, for each node the plan
    uses (an empty tuple where losing the node leaves a copy of everything). With the job's
    ``workflow``, the stages made again without a restart are left out (a frozen model's, read
    again; a copy of θ whose training stage keeps a replica, given θ again:
    ``Workflow.after_loss``, as ``nereus.control.targets.survive`` applies it)."""
    nodes = sorted({cluster.node_of(g) for g in plan.gpus()})
    out: dict[int, tuple[str, ...]] = {}
    for n in nodes:
        empty = tuple(sp.stage for sp in plan.stages if sp.replicas and all(
            any(cluster.node_of(g) == n for g in r) for r in sp.replicas))
        out[n] = empty if workflow is None else workflow.after_loss(empty)[0]
    return out


def exposed_fraction(plan: Plan, cluster: Cluster, workflow: Workflow | None = None) -> float:
    """The share of the plan's nodes whose loss alone loses the last copy of some model-stage
    (0: any one node can go; 1: every node is a single point of failure); ``workflow`` as in
    ``exposed_by_node``."""
    by_node = exposed_by_node(plan, cluster, workflow)
    if not by_node:
        return 0.0
    return sum(1 for v in by_node.values() if v) / len(by_node)
