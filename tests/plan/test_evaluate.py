"""Scoring a user's layout (``nereus plan --evaluate``): reading it strictly and completing (b, a)."""

import pytest

from nereus.errors import InputError
from nereus.plan.evaluate import StageLayoutSpec, evaluate_plan, layout_spec_from_data
from nereus.spec.job import load_job

JOB = load_job("examples/llama-3.1-8b-ppo.yaml")  # 512 sequences, 4 mini-batches: batch 128
LAYOUT = {"actor_gen": {"tp": 2, "pp": 1, "dp": 8}, "reference_infer": {"tp": 1, "pp": 1, "dp": 16},
          "reward_infer": {"tp": 1, "pp": 1, "dp": 16}, "critic_infer": {"tp": 1, "pp": 1, "dp": 16},
          "actor_train": {"tp": 4, "pp": 2, "dp": 2}, "critic_train": {"tp": 4, "pp": 2, "dp": 2}}


def _with(stage: str, **change: object) -> dict[str, StageLayoutSpec]:
    data = {k: dict(v) for k, v in LAYOUT.items()}
    data[stage].update(change)
    return layout_spec_from_data(data)


@pytest.mark.parametrize("a,b", [(16, 4), (64, 1), (1, 64), (8, 8)])
def test_grad_accum_alone_derives_the_micro_batch(a, b):
    """dp x b x a = batch: with dp = 2 and a given, b = 128 / (2 a)."""
    plan = evaluate_plan(JOB, _with("actor_train", grad_accum=a))
    c = plan.stage("actor_train").candidate
    assert (c.micro_batch, c.grad_accum) == (b, a)
    assert c.dp * c.micro_batch * c.grad_accum == 128


def test_grad_accum_that_does_not_divide_is_an_error():
    with pytest.raises(InputError) as e:
        evaluate_plan(JOB, _with("actor_train", grad_accum=3))
    assert e.value.field == "evaluate.actor_train.grad_accum" and "64 sequences" in str(e.value)
    with pytest.raises(InputError) as e:  # more steps than sequences per replica
        evaluate_plan(JOB, _with("actor_train", grad_accum=128))
    assert e.value.field == "evaluate.actor_train.grad_accum"


def test_micro_batch_and_grad_accum_together_must_make_the_batch():
    c = evaluate_plan(JOB, _with("actor_train", micro_batch=4, grad_accum=16)).stage(
        "actor_train").candidate
    assert (c.micro_batch, c.grad_accum) == (4, 16)
    c = evaluate_plan(JOB, _with("actor_train", micro_batch=8)).stage("actor_train").candidate
    assert (c.micro_batch, c.grad_accum) == (8, 8)
    with pytest.raises(InputError, match="2x4x4 != batch 128") as e:
        evaluate_plan(JOB, _with("actor_train", micro_batch=4, grad_accum=4))
    assert e.value.field == "evaluate.actor_train.grad_accum"


def test_recompute_and_gpus_are_kept():
    specs = _with("actor_train", recompute=True, gpus=[list(range(8)), list(range(8, 16))])
    sp = evaluate_plan(JOB, specs).stage("actor_train")
    assert sp.candidate.recompute and sp.replicas == (tuple(range(8)), tuple(range(8, 16)))


@pytest.mark.parametrize("stage,change,leaf", [
    ("actor_gen", {"micro_batch": 1000}, "micro_batch"),
    ("actor_gen", {"micro_batch": 8}, "micro_batch"),   # divides the 64 per replica
    ("actor_gen", {"grad_accum": 2}, "grad_accum"),
    ("actor_gen", {"recompute": True}, "recompute"),
    ("critic_infer", {"recompute": True}, "recompute"),
])
def test_fields_the_stage_does_not_price_are_refused(stage, change, leaf):
    """A generation stage's micro_batch, grad_accum and recompute were dropped without a word
    (generation decodes all a replica's sequences together, as many at once as the KV cache
    holds, and runs no backward pass), and an inference stage's recompute likewise: the plan
    was scored as if the field were absent."""
    with pytest.raises(InputError) as e:
        evaluate_plan(JOB, _with(stage, **change))
    assert e.value.field == f"evaluate.{stage}.{leaf}" and e.value.allowed, e.value
    assert e.value.allowed.startswith("leave it out, or "), e.value


def test_a_generation_stage_takes_the_values_a_plan_json_writes():
    """A plan JSON writes generation's candidate (b = the sequences per replica, a = 1, no
    recomputation): it still scores as the layout without them."""
    plain = evaluate_plan(JOB, _with("actor_gen"))
    written = evaluate_plan(JOB, _with("actor_gen", micro_batch=64, grad_accum=1,
                                       recompute=False))
    assert written.to_dict() == plain.to_dict()
    json_plan = evaluate_plan(JOB, layout_spec_from_data(plain.to_dict()))
    assert json_plan.step_latency_s == plain.step_latency_s


@pytest.mark.parametrize("change,field", [
    ({"tp": 2.9}, "evaluate.actor_train.tp"),
    ({"pp": "2"}, "evaluate.actor_train.pp"),
    ({"dp": 0}, "evaluate.actor_train.dp"),
    ({"micro_batch": -4}, "evaluate.actor_train.micro_batch"),
    ({"micro_batch": 0}, "evaluate.actor_train.micro_batch"),
    ({"grad_accum": False}, "evaluate.actor_train.grad_accum"),
    ({"recompute": "no"}, "evaluate.actor_train.recompute"),
    ({"recompute": 1}, "evaluate.actor_train.recompute"),
    ({"gpus": 5}, "evaluate.actor_train.gpus"),
    ({"gpus": [[0, "x"]]}, "evaluate.actor_train.gpus.0.1"),
    ({"gpus": [list(range(8))]}, "evaluate.actor_train.gpus"),
])
def test_layout_fields_are_strict(change, field):
    with pytest.raises(InputError) as e:
        _with("actor_train", **change)
    assert e.value.field == field


def test_missing_degrees_default_to_one_and_plan_json_keys_are_accepted():
    specs = layout_spec_from_data({"stages": [{"name": "x", "dp": 4, "latency_s": 1.0,
                                               "peak_mem_bytes": 10}], "step_latency_s": 3.0,
                                   "fits": True, "problems": [], "groups": []})
    assert specs == {"x": StageLayoutSpec(1, 1, 4)}


@pytest.mark.parametrize("shape,prefix", [
    ("top", "evaluate.actor_train"),
    ("mapping", "evaluate.stages.actor_train"),
    ("list", "evaluate.stages.4"),
])
@pytest.mark.parametrize("change,leaf", [
    ({"dp": 3}, "dp"),                              # does not divide the batch of 128
    ({"tp": 3}, "tp"),                              # does not divide the heads
    ({"pp": 3}, "pp"),                              # does not divide the 32 layers
    ({"micro_batch": 3}, "micro_batch"),            # does not divide 64 per replica
    ({"grad_accum": 3}, "grad_accum"),
    ({"micro_batch": 4, "grad_accum": 4}, "grad_accum"),
])
def test_pricing_errors_name_the_field_where_the_file_has_it(shape, prefix, change, leaf):
    """A plan JSON lists stages by index: its errors named ``evaluate.actor_train.dp``, a
    field the file does not have, and a bad tp or pp named only the stage."""
    data = {k: dict(v) for k, v in LAYOUT.items()}
    data["actor_train"].update(change)
    raw = {"top": data, "mapping": {"stages": data},
           "list": {"stages": [{"name": k, **v} for k, v in data.items()]}}[shape]
    with pytest.raises(InputError) as e:
        evaluate_plan(JOB, layout_spec_from_data(raw))
    assert e.value.field == f"{prefix}.{leaf}"
    assert e.value.allowed or leaf in ("tp", "pp")


def test_async_layouts_without_gpu_ids_put_generation_on_gpus_of_its_own():
    """Missing GPU ids were laid from GPU 0 for every stage, so any asynchronous layout given
    without ids failed validation (generation shared GPUs with training)."""
    from nereus.plan.validate import validate_plan
    from nereus.spec import parse_job

    job = parse_job({"model": "llama-3.1-8b", "algo": "grpo", "execution": "async", "gpus": 16,
                     "workload": {"response_len": 2048, "prompts_per_step": 256}})
    layout = {"actor_gen": {"tp": 2, "pp": 1, "dp": 4},
              "reference_infer": {"tp": 1, "pp": 1, "dp": 8},
              "reward_infer": {"tp": 1, "pp": 1, "dp": 8},
              "actor_train": {"tp": 4, "pp": 1, "dp": 2}}
    plan = evaluate_plan(job, layout_spec_from_data(layout))
    assert validate_plan(job, plan) == []
    gen = set(plan.stage("actor_gen").gpus)
    assert gen == set(range(8))
    assert not gen & set(plan.stage("actor_train").gpus)
    layout["actor_train"]["dp"] = 4  # 16 GPUs: more than generation leaves
    with pytest.raises(InputError, match="generation leaves 8") as e:
        evaluate_plan(job, layout_spec_from_data(layout))
    assert e.value.field == "evaluate.actor_train"


def test_micro_batch_and_recompute_are_chosen_beside_the_stages_sharing_the_gpus():
    """Actor and critic training share 8 GPUs; without recomputation each fits alone but not
    beside the other's resident state. The choice must count that state, as the plan's peak
    does: the plan fits with recomputation (before, it chose none and overflowed at 72.1 GiB,
    which left the controller no in-place move and forced a restart)."""
    from nereus.cost.estimate import HEADROOM
    from nereus.spec import parse_job

    job = parse_job({"model": "llama-3.1-8b", "algo": "ppo", "gpus": 8,
                     "cluster": {"device": "h100-sxm-80gb", "devices_per_node": 8},
                     "workload": {"prompts_per_step": 512, "prompt_len": 512,
                                  "ppo_mini_batches": 4, "response_len": 4328,
                                  "response_len_max": 6789}})
    specs = {"actor_gen": StageLayoutSpec(4, 1, 2), "reference_infer": StageLayoutSpec(1, 1, 8),
             "reward_infer": StageLayoutSpec(1, 8, 1), "critic_infer": StageLayoutSpec(1, 8, 1),
             "actor_train": StageLayoutSpec(2, 2, 2), "critic_train": StageLayoutSpec(2, 4, 1)}
    plan = evaluate_plan(job, specs)
    assert ("actor_train", "critic_train") in plan.groups
    cap = HEADROOM * job.cluster.device.memory_bytes
    assert all(sp.peak_mem_bytes <= cap for sp in plan.stages)
    assert plan.stage("actor_train").candidate.recompute


def test_a_dp_that_does_not_divide_the_batch_is_taken_for_a_stage_without_a_gradient():
    """Generation and forward passes split their batch of 512 unevenly over dp = 3: the
    largest replica's 171 sequences are its (b, a). Training's gradient accumulation covers its
    batch exactly, so dp = 3 stays an error there, naming the field."""
    plan = evaluate_plan(JOB, _with("actor_gen", dp=3))
    c = plan.stage("actor_gen").candidate
    assert (c.dp, c.micro_batch, c.grad_accum) == (3, 171, 1)
    c = evaluate_plan(JOB, _with("critic_infer", dp=3)).stage("critic_infer").candidate
    assert (c.dp, c.micro_batch * c.grad_accum) == (3, 171)
    with pytest.raises(InputError) as e:
        evaluate_plan(JOB, _with("critic_infer", dp=3, micro_batch=2))
    assert e.value.field == "evaluate.critic_infer.micro_batch"
    assert "171 sequences per replica" in str(e.value), e.value
    with pytest.raises(InputError) as e:
        evaluate_plan(JOB, _with("actor_train", dp=3))
    assert e.value.field == "evaluate.actor_train.dp"
    assert "does not divide" in str(e.value) and e.value.allowed, e.value


def test_more_replicas_than_sequences_is_an_error():
    job = load_job("examples/llama-3.1-8b-ppo.yaml")
    data = {k: dict(v) for k, v in LAYOUT.items()}
    data["reward_infer"] = {"tp": 1, "pp": 1, "dp": 513}
    with pytest.raises(InputError) as e:
        evaluate_plan(job, layout_spec_from_data(data))
    assert e.value.field == "evaluate.reward_infer.dp" and e.value.allowed == "1 to 512"
