"""The urgent path's re-batched survivors (``targets.rebatched``): a stage without a gradient
keeps every surviving replica with a larger, uneven share; training cuts its DP to a divisor of
its batch, which its gradient accumulation covers exactly."""

from dataclasses import replace

from nereus.control.targets import price, rebatched, survive
from nereus.cost.candidate import Candidate, Layout
from nereus.cost.model import CostModel
from nereus.plan.search import best_plan
from nereus.plan.types import StagePlan
from nereus.spec import GpuPool, parse_job

JOB = parse_job({"model": "llama-3.1-8b", "gpus": 16})  # 512 sequences a step, 128 an update


def _after_losing_gpu_0():
    plan = best_plan(JOB)
    gen = plan.stage("actor_gen")
    assert (gen.tp, gen.dp) == (4, 4) and (0, 1, 2, 3) in gen.replicas
    survivors, lost, rebuilt = survive(plan, range(1, 16), JOB.workflow)
    assert survivors is not None and not lost and not rebuilt
    return plan, survivors


def test_a_loss_keeps_3_of_4_generation_replicas_and_cuts_training_to_a_divisor():
    _, survivors = _after_losing_gpu_0()
    assert survivors.stage("actor_gen").dp == 3
    specs = rebatched(CostModel(JOB), survivors)
    gen = specs["actor_gen"]
    assert gen.dp == 3 and gen.gpus == survivors.stage("actor_gen").replicas
    # every surviving forward replica stays too, however many survive
    ref = survivors.stage("reference_infer")
    assert specs["reference_infer"].dp == ref.dp == len(ref.replicas)
    # training: the largest divisor of 128 among the surviving replicas
    for name in ("actor_train", "critic_train"):
        left = len(survivors.stage(name).replicas)
        assert specs[name].dp == max(d for d in range(1, left + 1) if 128 % d == 0), name
    # priced on the surviving GPUs, the generation replicas take 171/171/170 sequences
    pool = JOB.with_pool(GpuPool(JOB.cluster, tuple(range(1, 16))))
    priced = price(pool, CostModel(pool), specs)
    assert priced.plan is not None
    c = priced.plan.stage("actor_gen").candidate
    assert (c.dp, c.micro_batch, c.grad_accum) == (3, 171, 1)


def test_a_forward_stage_whose_replicas_cover_their_batch_keeps_its_exact_shape():
    """With ``every_stage`` False: a forward stage whose b x a is the least share of its dp
    (ceil(512 / 3) = 171) covers the batch (3 x 171 >= 512) and keeps (b, a); one whose
    replicas fall short (the generation stage's 3 x 128 of 512) is re-batched."""
    plan, survivors = _after_losing_gpu_0()
    ref = survivors.stage("reference_infer")
    three = StagePlan("reference_infer", Candidate(Layout(1, 1), 3, 1, 171), ref.replicas[:3])
    survivors = replace(survivors, stages=tuple(three if s.stage == "reference_infer" else s
                                                for s in survivors.stages))
    specs = rebatched(CostModel(JOB), survivors, every_stage=False)
    kept = specs["reference_infer"]
    assert (kept.dp, kept.micro_batch, kept.grad_accum) == (3, 1, 171)
    gen = specs["actor_gen"]
    assert gen.dp == 3 and gen.micro_batch is None  # re-chosen by the pricer
    # a training stage still needs dp x b x a = batch exactly
    intact_train = survivors.stage("critic_train")
    assert intact_train.candidate == plan.stage("critic_train").candidate
    assert specs["critic_train"].micro_batch == intact_train.candidate.micro_batch
