"""Scoring a user's layout (``nereus plan --evaluate``): read strictly, (b, a) completed."""

import json

import pytest
from typer.testing import CliRunner

from nereus.cli import app
from nereus.errors import InputError
from nereus.plan.evaluate import StageLayoutSpec, evaluate_plan, layout_spec_from_data
from nereus.spec.job import load_job

CONFIG = "examples/llama-3.1-8b-ppo.yaml"
JOB = load_job(CONFIG)  # 512 sequences, 4 mini-batches: batch 128
LAYOUT = {"actor_gen": {"tp": 2, "pp": 1, "dp": 8}, "reference_infer": {"tp": 1, "pp": 1, "dp": 16},
          "reward_infer": {"tp": 1, "pp": 1, "dp": 16},
          "critic_infer": {"tp": 1, "pp": 1, "dp": 16},
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
    ({"gpus": [[0, -1]]}, "evaluate.actor_train.gpus.0.1"),
])
def test_layout_fields_are_strict(change, field):
    with pytest.raises(InputError) as e:
        _with("actor_train", **change)
    assert e.value.field == field


def test_missing_degrees_default_to_one_and_plan_json_keys_are_accepted():
    specs = layout_spec_from_data({"stages": [{"name": "x", "dp": 4, "latency_s": 1.0,
                                               "peak_mem_bytes": 10}]})
    assert specs == {"x": StageLayoutSpec(1, 1, 4)}
    full = {"name": "x", "tp": 1, "pp": 1, "dp": 2, "gpus": [[0], [1]], "latency_s": 1.0,
            "peak_mem_bytes": 10}
    specs = layout_spec_from_data({"stages": [full], "step_latency_s": 3.0, "fits": True,
                                   "problems": [], "groups": []})
    assert specs == {"x": StageLayoutSpec(1, 1, 2, ((0,), (1,)))}


def test_a_plan_json_is_checked_as_a_plan_file():
    """A file with a plan JSON's fields is one ``nereus plan --json`` wrote: a degree it
    lacks was cut from it, not left to default to 1 (transition, which reads it as a plan
    file, says so)."""
    with pytest.raises(InputError, match=r"^evaluate\.stages\.0\.tp: required field"):
        layout_spec_from_data({"stages": [{"name": "x", "pp": 1, "dp": 4, "gpus": [[0]] * 4}],
                               "step_latency_s": 3.0})


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
    assert e.value.allowed == "tp x pp x dp at most 8, on GPUs 8-15", e.value


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


# The GPU lists of a model-stage (actor_train: tp 4, pp 2, dp 2 on the pool 0-15) said what was
# wrong but not what was allowed for this stage and pool ("a replica lists 3 GPUs for tp x pp =
# 8 (allowed: one list of tp x pp GPU ids per DP replica, no GPU twice)"), and named neither
# the replica nor the pool.
R0, R1 = list(range(8)), list(range(8, 16))
LISTS = "dp = 2 lists of tp x pp = 4 x 2 = 8 GPU ids each"
SIZE = "8 GPU ids in each replica from the pool 0-15, e.g. [0, ..., 7]"
DISTINCT = "16 distinct GPU ids (tp x pp x dp = 4 x 2 x 2) from the pool 0-15"
BOUND = "a GPU id from 0 to 65,535, in the job's pool; "


@pytest.mark.parametrize("gpus,field,says,allowed", [
    ([R0], "gpus", "1 GPU list for dp = 2", f"{LISTS} from the pool 0-15"),
    ([R0, R1, R0], "gpus", "3 GPU lists for dp = 2", f"{LISTS} from the pool 0-15"),
    ([], "gpus", "0 GPU lists for dp = 2",
     f"{LISTS} from the pool 0-15 (one list per DP replica), e.g. [[0, ..., 7], [8, ..., 15]]"),
    ([R0, [8, 9, 10]], "gpus.1", "replica 1 lists 3 GPUs for tp x pp = 4 x 2 = 8", SIZE),
    ([R0, R1 + [16]], "gpus.1", "replica 1 lists 9 GPUs", SIZE),
    ([R0, []], "gpus.1", "replica 1 lists 0 GPUs", SIZE),
    ([R0, R1[:-1] + [0]], "gpus.1", "GPU 0 is listed in replica 0 and again in replica 1",
     DISTINCT),
    ([R0, [8, 8, 9, 10, 11, 12, 13, 14]], "gpus.1", "GPU 8 is listed twice in replica 1",
     DISTINCT),
    ([R0, list(range(100, 108))], "gpus.1", "GPU 100 of replica 1 is not in the pool",
     "GPU ids 0-15"),
    ([R0, R1[:-1] + [-1]], "gpus.1.7", "-1 is not allowed", BOUND + LISTS),
    ([R0, R1[:-1] + [70000]], "gpus.1.7", "70000 is not allowed", BOUND + LISTS),
    ([R0, R1[:-1] + ["x"]], "gpus.1.7", "'x' is not an integer", LISTS),
    ([R0, R1[:-1] + [15.5]], "gpus.1.7", "15.5 is not an integer", LISTS),
    ([R0, R1[:-1] + [True]], "gpus.1.7", "true is not an integer", LISTS),
    (R0 + R1, "gpus.0", "0 is not a list", f"{LISTS}, e.g. [[0, ..., 7], [8, ..., 15]]"),
    ([[R0], [R1]], "gpus.0.0", "is not an integer", LISTS),
    ([None, R1], "gpus.0", "is not a list", LISTS),
    ("0-15", "gpus", "'0-15' is not a list", LISTS),
    (5, "gpus", "5 is not a list", LISTS),
], ids=["dp-1", "dp-3", "none", "short", "long", "empty", "across", "within", "outside",
        "negative", "too-large", "text", "float", "bool", "flat", "too-deep", "null", "string",
        "number"])
def test_replica_errors_say_what_is_allowed(tmp_path, gpus, field, says, allowed):
    """Every error about a layout's GPU lists is one line, exit 2, naming the stage and the
    replica (the list, or the id in it) and saying what the lists must be for this stage's
    tp, pp and dp and this job's pool."""
    layout = json.loads(json.dumps(LAYOUT))
    layout["actor_train"]["gpus"] = gpus
    line = _cli_error(tmp_path, layout, f"evaluate.actor_train.{field}")
    assert says in line and f"(allowed: {allowed}" in line, line


def _cli_error(tmp_path, layout: object, field: str, config: str = CONFIG) -> str:
    """``nereus plan --evaluate`` of ``layout`` written as YAML: its one-line error."""
    import yaml

    p = tmp_path / "layout.yaml"
    p.write_text(yaml.safe_dump(layout))
    r = CliRunner().invoke(app, ["plan", "--config", config, "--evaluate", str(p)])
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output and r.stdout == "", r.output
    assert r.stderr.count("\n") == 1 and r.stderr.startswith(f"error: {field}: "), r.stderr
    return r.stderr


def test_replica_errors_name_the_field_where_the_file_has_it(tmp_path):
    """A plan JSON lists its stages by index: the replica is named under that index."""
    layout = json.loads(json.dumps(LAYOUT))
    layout["actor_train"]["gpus"] = [R0, [8, 9, 10]]
    stages = {"stages": [{"name": k, **v} for k, v in layout.items()]}
    line = _cli_error(tmp_path, stages, "evaluate.stages.4.gpus.1")
    assert f"(allowed: {SIZE})" in line, line


def test_replica_errors_count_ids_as_the_stage_and_pool_have_them(tmp_path):
    """A stage of one GPU per replica, and a pool that does not start at GPU 0 (GPUs 8-15 of
    two nodes): the allowed part uses that stage's degrees and that pool's ids."""
    job = {"model": "llama-3.1-8b", "algo": "grpo", "gpus": list(range(8, 16)),
           "cluster": {"device": "h100-sxm-80gb", "devices_per_node": 8, "nodes": 2},
           "workload": {"responses_per_prompt": 8}}
    config = tmp_path / "job.yaml"
    config.write_text(json.dumps(job))
    layout = {"actor_gen": {"tp": 2, "pp": 1, "dp": 4}, "reference_infer": {"tp": 1, "pp": 1,
              "dp": 8, "gpus": [[g] for g in range(8, 15)]},
              "reward_infer": {"tp": 1, "pp": 1, "dp": 8}, "actor_train": {"tp": 4, "pp": 1,
                                                                           "dp": 2}}
    line = _cli_error(tmp_path, layout, "evaluate.reference_infer.gpus", str(config))
    assert ("7 GPU lists for dp = 8 (allowed: dp = 8 lists of tp x pp = 1 x 1 = 1 GPU id each "
            "from the pool 8-15 (one list per DP replica), e.g. [[8], [9], ...])") in line, line
    layout["reference_infer"]["gpus"] = [[g] for g in range(8)]
    line = _cli_error(tmp_path, layout, "evaluate.reference_infer.gpus.0", str(config))
    assert "GPU 0 of replica 0 is not in the pool (allowed: GPU ids 8-15)" in line, line
    layout["reference_infer"]["gpus"] = [[g] for g in range(8, 16)]
    layout["actor_train"]["gpus"] = [[8, 9, 10, 11], [12, 13, 14]]
    line = _cli_error(tmp_path, layout, "evaluate.actor_train.gpus.1", str(config))
    assert ("replica 1 lists 3 GPUs for tp x pp = 4 x 1 = 4 (allowed: 4 GPU ids in each "
            "replica from the pool 8-15, e.g. [8, ..., 11])") in line, line


@pytest.mark.parametrize("data,field,allowed", [
    ({"stages": 5}, "evaluate.stages", "a list of {name, tp, pp, dp, ...}"),
    ({"stages": [{"tp": 1}]}, "evaluate.stages.0.name", "the model-stage's name: actor_gen"),
    ({"stages": [{"name": "x"}, {"name": "x"}]}, "evaluate.stages.1.name",
     "each model-stage once (evaluate.stages.0 is x)"),
    ({"actor_gen": None}, "evaluate.actor_gen", "{tp: 1, pp: 1, dp: 1} with the stage's"),
])
def test_layout_shape_errors_say_what_is_allowed(data, field, allowed):
    """These said what was wrong and stopped there."""
    with pytest.raises(InputError) as e:
        layout_spec_from_data(data)
    assert e.value.field == field and e.value.allowed and allowed in e.value.allowed, e.value


def test_a_replica_past_the_largest_cluster_says_so_beside_a_bad_id(tmp_path):
    """tp and pp of 2**32 beside a negative id: the example of right lists ran out of memory
    counting 2**64 ids, and the error was an OverflowError's traceback."""
    layout = json.loads(json.dumps(LAYOUT))
    layout["actor_train"] = {"tp": 2**32, "pp": 2**32, "dp": 2, "gpus": [[0, -1]]}
    line = _cli_error(tmp_path, layout, "evaluate.actor_train.gpus.0.1")
    assert line.endswith(f"(allowed: {BOUND}tp x pp = 4294967296 x 4294967296 = "
                         f"{2**64} GPUs a replica, more than the largest cluster holds "
                         "(65,536))\n"), line
