"""The plan space a framework's users can configure, and the fastest plan in it.

verl (its hybrid engine with the Megatron backend, as its PPO examples run it) puts every
model-stage on the same GPUs, which take turns: one resource pool of ``nnodes x
n_gpus_per_node`` GPUs for every worker group. What a user sweeps there, and what
``verl_keep`` admits:

- rollout: the inference engine's TP degree (``rollout.tensor_model_parallel_size``), no
  pipeline (PP = 1), DP = GPUs / TP;
- every other model-stage: Megatron's TP and PP of its worker group, DP = GPUs / (TP x PP),
  micro-batch sizes and recomputation;
- a trained model's forward stage (the critic's values) runs on its worker group's training
  layout, so it has the training stage's TP and PP (``best_verl_plan`` tries each);
- a batch is dispatched in equal shares, so DP divides the stage's batch, for the rollout and
  the forward passes too, which the planner's own space lets take uneven shares
  (``verl_keep`` says where verl's code requires it).

verl's resource pool has as many GPUs on every node it spans. Where no such plan fits the whole
pool, a verl user runs on fewer GPUs: ``best_verl_plan`` takes the most that hold one, on as few
nodes as can, the fullest first. The planner's cost model prices these plans as it
prices any other; verl's own runtime differs from it in ways it does not model (CPU offload of
idle models, its resharding of the rollout weights).
"""

from __future__ import annotations

from collections.abc import Mapping

from nereus.cost.candidate import Candidate, Layout
from nereus.cost.efficiency import Efficiencies
from nereus.cost.model import CostModel
from nereus.errors import InfeasibleError, count
from nereus.plan.search import Keep, Planner
from nereus.plan.types import Plan
from nereus.spec.cluster import GpuPool
from nereus.spec.job import JobSpec
from nereus.spec.workflow import Execution, ModelStage, StageKind


def verl_keep(job: JobSpec, coupled: dict[str, Layout] | None = None) -> Keep:
    """verl's space on ``job``'s whole pool: every candidate spans all of it, generation has no
    pipeline, DP divides every stage's batch. ``coupled``: model-stage -> the layout it must
    have (a forward stage on its model's training layout)."""
    gpus = job.pool.size
    fixed = coupled or {}
    # Every stage's DP divides its batch, the rollout's and the forward passes' too, although
    # the planner lets those take uneven shares (``candidates.dp_degrees``). verl's driver
    # hands a step's batch to every worker group unpadded (``RayPPOTrainer.fit`` calls
    # ``generate_sequences``, ``compute_log_prob``, ``compute_ref_log_prob`` and
    # ``compute_values`` on it; only ``_validate`` pads the validation batch with
    # ``pad_dataproto_to_divisor``), its dispatch splits it with ``DataProto.chunk``, which
    # asserts "only support equal chunk", and ``_validate_config`` requires train_batch_size x
    # rollout.n to be a multiple of the GPU count (FSDP) or of Megatron's DP x micro-batch
    # (volcengine/verl: verl/trainer/ppo/ray_trainer.py, verl/protocol.py,
    # verl/single_controller/base/decorator.py; auto-padding exists only for the
    # DP_COMPUTE_PROTO dispatch, opt-in through VERL_AUTO_PADDING, and pads a batch with
    # copies of its first rows, which the rollout would then generate too).
    cost = CostModel(job)
    batch = {st.name: cost.stage_batch(st) for st in job.workflow.stages}

    def keep(st: ModelStage, c: Candidate) -> bool:
        if c.gpus != gpus or (st.kind is StageKind.GENERATE and c.pp != 1):
            return False
        if batch[st.name] % c.dp:
            return False
        return st.name not in fixed or c.layout == fixed[st.name]
    return keep


def _coupled(job: JobSpec) -> list[tuple[str, str]]:
    """(forward stage, training stage) of each trained model that has both."""
    wf = job.workflow
    out = []
    for st in wf.stages:
        trainer = wf.trained_by(st.model) if st.kind is StageKind.FORWARD else None
        if trainer is not None:
            out.append((st.name, trainer))
    return out


def _layouts(planner: Planner, stage: str) -> set[Layout]:
    """The layouts of every candidate ``planner`` priced for ``stage`` (before pruning: a
    layout whose candidates another layout beats alone may still be the coupled optimum)."""
    ev = planner.evaluated.get(stage)
    return set() if ev is None else {c.layout for c in ev.candidates}


def uniform_part(pool: GpuPool, gpus: int) -> tuple[int, ...] | None:
    """``gpus`` of the pool's GPU ids as verl's resource pool takes them, as many on every
    node (``trainer.nnodes`` x ``trainer.n_gpus_per_node``): on as few nodes as can hold them,
    the fullest first (ties: the lower node), each node's lowest ids; None where no such
    choice exists."""
    nodes = sorted(pool.by_node().items(), key=lambda kv: (-len(kv[1]), kv[0]))
    for k in range(1, len(nodes) + 1):
        per = gpus // k
        if per * k != gpus:
            continue
        held = [ids for _, ids in nodes if len(ids) >= per][:k]
        if len(held) == k:
            return tuple(sorted(i for ids in held for i in ids[:per]))
    return None


def best_verl_plan(job: JobSpec, efficiencies: Efficiencies | None = None,
                   memory_scale: Mapping[StageKind, float] | None = None) -> Plan:
    """The fastest plan in verl's space (module docstring) on the most GPUs of ``job``'s pool
    that hold one, priced with ``efficiencies`` and ``memory_scale`` (a calibrated profile's,
    as ``CostModel`` takes them). Raises :class:`InfeasibleError` where none fits any number
    of them."""
    if job.workflow.execution is not Execution.SYNC:
        raise InfeasibleError("verl's hybrid engine runs every model-stage on the same GPUs, "
                              "so it has no asynchronous plan")
    pairs = _coupled(job)
    for gpus in range(job.pool.size, 0, -1):
        part = uniform_part(job.pool, gpus)
        if part is None:
            continue
        sub = job.with_pool(GpuPool(job.cluster, part))
        try:
            base = Planner(sub, cost=CostModel(sub, efficiencies, memory_scale),
                           keep=verl_keep(sub))
        except InfeasibleError:
            continue
        # every combination of the coupled stages' training layouts (one per trained model
        # with a forward stage: the critic in PPO)
        combos: list[dict[str, Layout]] = [{}]
        for fwd, train in pairs:
            layouts = _layouts(base, fwd) & _layouts(base, train)
            combos = [{**c, fwd: lt, train: lt} for c in combos for lt in sorted(layouts)]
        best: Plan | None = None
        for fixed in combos:
            try:
                plan = Planner(sub, cost=base.cost, evaluated=base.evaluated,
                               keep=verl_keep(sub, fixed)).best()
            except InfeasibleError:
                continue
            if best is None or plan.step_latency_s < best.step_latency_s:
                best = plan
        if best is not None:
            return best
    raise InfeasibleError(f"no plan in verl's space (every model-stage on the same GPUs) fits "
                          f"any number of the {count(job.pool.size, 'GPU')} of "
                          f"{job.cluster.device.name}")


# verl's Megatron config keys of each model-stage's TP and PP (verl/trainer/config/
# ppo_megatron_trainer.yaml); the rollout's TP alone, and the critic's values run on its
# training layout (its own keys)
_VERL_KEYS: dict[str, tuple[str, ...]] = {
    "actor_gen": ("actor_rollout_ref.rollout.tensor_model_parallel_size",),
    "actor_train": ("actor_rollout_ref.actor.megatron.tensor_model_parallel_size",
                    "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size"),
    "reference_infer": ("actor_rollout_ref.ref.megatron.tensor_model_parallel_size",
                        "actor_rollout_ref.ref.megatron.pipeline_model_parallel_size"),
    "critic_train": ("critic.megatron.tensor_model_parallel_size",
                     "critic.megatron.pipeline_model_parallel_size"),
    "reward_infer": ("reward_model.megatron.tensor_model_parallel_size",
                     "reward_model.megatron.pipeline_model_parallel_size"),
}


def verl_overrides(job: JobSpec, plan: Plan) -> list[str]:
    """``key=value`` overrides of verl's Megatron PPO config that set ``plan``'s GPUs, TP and
    PP (a plan of ``best_verl_plan``). verl's resource pool has as many GPUs on every node;
    where ``plan``'s do not, no ``trainer.nnodes`` x ``trainer.n_gpus_per_node`` writes them
    and ValueError says so."""
    per_node = sorted({len(ids) for ids in GpuPool(job.cluster, plan.gpus()).by_node().values()})
    if len(per_node) != 1:
        raise ValueError(f"the plan's GPUs sit {' and '.join(map(str, per_node))} to a node: "
                         "verl's resource pool has as many on every node")
    nodes = len(GpuPool(job.cluster, plan.gpus()).by_node())
    out = [f"trainer.nnodes={nodes}", f"trainer.n_gpus_per_node={per_node[0]}"]
    for sp in plan.stages:
        keys = _VERL_KEYS.get(sp.stage, ())
        out += [f"{k}={v}" for k, v in zip(keys, (sp.candidate.tp, sp.candidate.pp))]
    return out
