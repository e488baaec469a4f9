from pathlib import Path

import pytest

from nereus.errors import InputError
from nereus.spec import GpuPool, Workload, load_job, parse_job
from nereus.spec.workflow import Execution, Phase, StageKind, get_workflow

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_minimal_job_fills_defaults():
    job = parse_job({"model": "llama-3.1-8b", "gpus": 16})
    assert job.pool.size == 16 and job.cluster.num_nodes == 2
    assert job.workflow.algo == "ppo" and job.workload.response_len_mean == 2048


@pytest.mark.parametrize("data,field", [
    ({"model": "llama-3.1-8b", "gpus": 16, "workload": {"respons_len": 3}}, "workload.respons_len"),
    ({"model": "llama-3.1-8b", "gpus": 0}, "gpus"),
    ({"model": "llama-3.1-8b", "gpus": 4, "algo": "dpo"}, "algo"),
    ({"model": "llama-3.1-8b", "gpus": 4, "cluster": {"device": "tpu"}}, "cluster.device"),
    ({"gpus": 4}, "model"),
    ({"model": "llama-3.1-8b", "gpus": 4, "workload": {"param_dtype": "int3"}},
     "workload.param_dtype"),
])
def test_bad_fields_are_named(data, field):
    with pytest.raises(InputError) as e:
        parse_job(data)
    assert e.value.field == field
    assert "\n" not in str(e.value)


def test_unknown_field_lists_allowed_fields():
    with pytest.raises(InputError, match="allowed: .*response_len"):
        parse_job({"model": "llama-3.1-8b", "gpus": 4, "workload": {"respons_len": 3}})


def test_examples_all_load():
    files = sorted(EXAMPLES.glob("*.yaml"))
    assert len(files) >= 4
    for f in files:
        job = load_job(f)
        assert job.pool.size >= 1


def test_workflows_as_data():
    ppo = get_workflow("ppo")
    assert [s.name for s in ppo.phase_stages(Phase.TRAINING)] == ["actor_train", "critic_train"]
    assert ppo.weight_sync() == ("actor_train", "actor_gen")
    grpo = get_workflow("grpo", "async")
    assert grpo.execution is Execution.ASYNC and "critic" not in {m.name for m in grpo.models}
    remax = get_workflow("remax")
    assert remax.greedy_baseline and all(s.model != "critic" for s in remax.stages)
    assert sum(s.kind is StageKind.GENERATE for s in remax.stages) == 1


def test_workload_batch_arithmetic_and_errors():
    w = Workload(prompts_per_step=64, responses_per_prompt=8, ppo_mini_batches=4, ppo_epochs=2)
    assert w.sequences_per_step == 512 and w.sequences_per_update == 128
    assert w.updates_per_step == 8
    with pytest.raises(InputError, match="ppo_mini_batches"):
        Workload(prompts_per_step=10, ppo_mini_batches=3)
    with pytest.raises(InputError, match="response_len_max"):
        Workload(response_len_mean=100, response_len_max=50)


def test_a_longest_response_below_the_mean_says_what_is_allowed():
    """The error said only '1000 is below the mean 2048', not what to give instead."""
    with pytest.raises(InputError) as e:
        Workload(response_len_mean=2048, response_len_max=1000)
    assert e.value.field == "workload.response_len_max" and e.value.allowed == "at least 2048"
    assert str(e.value) == ("workload.response_len_max: 1000 is below the mean 2048 "
                            "(allowed: at least 2048)")


def test_pool_rejects_ids_outside_cluster():
    job = parse_job({"model": "tiny-llama", "gpus": 4, "cluster": {"device": "cpu"}})
    with pytest.raises(InputError, match="outside the cluster"):
        GpuPool(job.cluster, (0, 99))
    assert job.pool.without([1]).ids == (0, 2, 3)


@pytest.mark.parametrize("data,field", [
    ({"model": "llama-3.1-8b", "gpus": 16, "cluster": "abc"}, "cluster"),
    ({"model": "llama-3.1-8b", "gpus": 16, "workload": 5}, "workload"),
    ({"model": "llama-3.1-8b", "gpus": True}, "gpus"),
    ({"model": "llama-3.1-8b", "gpus": 16, "cluster": {"device_memory_gib": float("inf")}},
     "cluster.device_memory_gib"),
])
def test_malformed_job_fields_are_input_errors(data, field):
    from nereus.errors import InputError
    from nereus.spec import parse_job

    with pytest.raises(InputError) as e:
        parse_job(data)
    assert e.value.field == field


@pytest.mark.parametrize("workload,field", [
    ({"response_len": 50_000}, "workload.response_len"),                    # max = mean
    ({"response_len": 4096, "response_len_max": 40_449}, "workload.response_len_max"),
    ({"prompt_len": 40_960, "response_len": 1}, "workload.prompt_len"),
])
def test_a_sequence_past_the_context_window_is_an_input_error(workload, field):
    """qwen3-14b's window is 40,960 tokens: a prompt plus the longest response must fit it."""
    with pytest.raises(InputError) as e:
        parse_job({"model": "qwen3-14b", "gpus": 16, "workload": workload})
    assert e.value.field == field and "40960" in str(e.value)


def test_a_sequence_that_fills_the_context_window_exactly_plans():
    job = parse_job({"model": "qwen3-14b", "gpus": 16,
                     "workload": {"prompt_len": 512, "response_len": 4096,
                                  "response_len_max": 40_960 - 512}})
    assert job.workload.seq_len_max == job.model.max_position_embeddings
    # Llama 3.1's window is 131,072 tokens
    parse_job({"model": "llama-3.1-8b", "gpus": 16, "workload": {"response_len": 100_000}})
    with pytest.raises(InputError, match="131072"):
        parse_job({"model": "llama-3.1-8b", "gpus": 16, "workload": {"response_len": 131_000}})


def test_models_without_a_published_window_are_not_limited():
    """The tiny CPU models are not published models: planning tests price them at any length."""
    job = parse_job({"model": "tiny-llama", "gpus": 4, "cluster": {"device": "cpu"},
                     "workload": {"response_len": 8192}})
    assert job.model.max_position_embeddings is None


def test_examples_and_builtin_scenarios_fit_their_context_windows():
    from nereus.sim.scenarios import SCENARIOS

    for f in sorted(EXAMPLES.glob("*.yaml")):
        job = load_job(f)
        assert job.workload.seq_len_max <= job.model.max_position_embeddings, f
    for name, make in SCENARIOS.items():
        s = make(seed=0)
        longest = max(s.lengths.at(i)[1] for i in range(len(s.lengths)))
        assert s.job.workload.prompt_len + longest <= s.job.model.max_position_embeddings, name


@pytest.mark.parametrize("data,field", [
    ({"model": "llama-3.1-8b", "gpus": 8.0}, "gpus"),
    ({"model": "llama-3.1-8b", "gpus": "8"}, "gpus"),
    ({"model": "llama-3.1-8b", "gpus": [0, True]}, "gpus.1"),  # the list item, not an int
    ({"model": "llama-3.1-8b", "gpus": 8, "cluster": {"nodes": True}}, "cluster.nodes"),
    ({"model": "llama-3.1-8b", "gpus": 8, "cluster": {"devices_per_node": 8.5}},
     "cluster.devices_per_node"),
    ({"model": "llama-3.1-8b", "gpus": 8, "cluster": {"device_memory_gib": float("nan")}},
     "cluster.device_memory_gib"),
    ({"model": "llama-3.1-8b", "gpus": 8, "workload": {"response_len": 2048.5}},
     "workload.response_len"),
    ({"model": "llama-3.1-8b", "gpus": 8, "workload": {"prompt_len": "512"}},
     "workload.prompt_len"),
    ({"model": "llama-3.1-8b", "gpus": 8, "workload": {"master_weights": "no"}},
     "workload.master_weights"),
    ({"model": 5, "gpus": 8}, "model"),
])
def test_job_fields_are_strict(data, field):
    with pytest.raises(InputError) as e:
        parse_job(data)
    assert e.value.field == field


def test_a_float_memory_override_may_be_written_as_an_integer():
    job = parse_job({"model": "llama-3.1-8b", "gpus": 8, "cluster": {"device_memory_gib": 40}})
    assert job.cluster.device.memory_bytes == 40 * 1024**3


def _job(gpus: object = 16, cluster: dict | None = None, workload: dict | None = None) -> dict:
    return {"model": "llama-3.1-8b", "gpus": gpus, "cluster": cluster or {},
            "workload": workload or {}}


@pytest.mark.parametrize("data,field", [
    (_job(10**12), "gpus"),               # was a MemoryError building the id list
    (_job(10**20), "gpus"),               # was an OverflowError
    (_job(1_000_000), "gpus"),            # was a planner that never returned
    (_job(65_537), "gpus"),
    (_job([0, 65_536]), "gpus"),
    (_job(16, {"nodes": 10**9}), "cluster.nodes"),
    (_job(16, {"nodes": 8193, "devices_per_node": 8}), "cluster.nodes"),  # 65,544 devices
    (_job(16, {"devices_per_node": 10**9}), "cluster.devices_per_node"),
    (_job(16, {"devices_per_node": 65}), "cluster.devices_per_node"),
    (_job(16, {"devices_per_node": 0}), "cluster.devices_per_node"),
    (_job(16, {"nodes": 0}), "cluster.nodes"),
])
def test_device_and_node_counts_have_a_stated_maximum(data, field):
    with pytest.raises(InputError) as e:
        parse_job(data)
    assert e.value.field == field and "\n" not in str(e.value)
    assert any(bound in str(e.value) for bound in ("65,536", "1..64", "65535"))


def test_the_largest_allowed_cluster_still_builds():
    job = parse_job(_job(16, {"nodes": 1024, "devices_per_node": 64}))
    assert job.cluster.num_devices == 65_536
    assert parse_job(_job([65_535])).pool.ids == (65_535,)


@pytest.mark.parametrize("workload,field,allowed", [
    ({"prompts_per_step": 10**12}, "workload.prompts_per_step", "1..1,048,576"),
    ({"responses_per_prompt": 10**9}, "workload.responses_per_prompt", "1..1,024"),
    ({"responses_per_prompt": 10**20}, "workload.responses_per_prompt", "1..1,024"),
    ({"prompts_per_step": 4096, "responses_per_prompt": 512}, "workload.responses_per_prompt",
     "1,048,576"),
])
def test_batch_sizes_have_a_stated_maximum(workload, field, allowed):
    with pytest.raises(InputError) as e:
        parse_job(_job(16, workload=workload))
    assert e.value.field == field and allowed in (e.value.allowed or "")
    with pytest.raises(InputError, match=field):
        Workload(**workload)


def test_real_rl_batches_are_within_the_bounds():
    # GRPO-style groups: 1,024 prompts x 64 samples; the largest allowed batch builds
    assert parse_job(_job(16, workload={"prompts_per_step": 1024, "responses_per_prompt": 64,
                                        "ppo_mini_batches": 16})).workload.sequences_per_step \
        == 65_536
    assert Workload(prompts_per_step=1 << 20).sequences_per_step == 1 << 20
    assert Workload(prompts_per_step=1024, responses_per_prompt=1024).sequences_per_step == 1 << 20


def test_an_unknown_stage_names_the_field_it_came_from():
    wf = get_workflow("grpo")
    with pytest.raises(InputError) as e:
        wf.stage("critic_infer", "--frontier")
    assert e.value.field == "--frontier" and "grpo" in str(e.value)
    with pytest.raises(InputError) as e:
        wf.stage("critic_infer")
    assert e.value.field == "stage"


@pytest.mark.parametrize("gpus,says", [
    ([0, 1, 1, 2], "device id 1 listed more than once"),
    ([3, 0, 3, 0], "device ids 0, 3 listed more than once"),
])
def test_a_device_id_listed_twice_is_an_error_not_dropped(gpus, says):
    """``gpus: [0, 1, 1, 2]`` was planned as a pool of three: a typo for another device."""
    with pytest.raises(InputError) as e:
        parse_job(_job(gpus))
    assert e.value.field == "gpus" and says in str(e.value)
    assert "distinct device ids" in str(e.value) and "\n" not in str(e.value)
    assert parse_job(_job([3, 0, 2])).pool.ids == (0, 2, 3)  # order alone is no error


@pytest.mark.parametrize("workload,field,allowed", [
    ({"ppo_epochs": 10**12}, "workload.ppo_epochs", "1..1,024"),        # a step years long
    ({"ppo_epochs": 10**400}, "workload.ppo_epochs", "1..1,024"),       # was an OverflowError
    ({"ppo_epochs": 0}, "workload.ppo_epochs", "1..1,024"),
    ({"prompt_len": 10**400}, "workload.prompt_len", "1..16,777,216"),
    ({"response_len": 10**400}, "workload.response_len", "1..16,777,216"),
    ({"response_len": 4096, "response_len_max": 10**400}, "workload.response_len_max",
     "1..16,777,216"),
    ({"response_len_max": 0}, "workload.response_len_max", "1..16,777,216"),  # was ignored
    ({"ppo_mini_batches": 10**400}, "workload.ppo_mini_batches", "1..1,048,576"),
])
def test_workload_counts_have_a_stated_maximum(workload, field, allowed):
    """A huge count overflowed the cost model's float sums (a traceback) or priced a step of
    10^13 s; a context window limits the token counts of published models only."""
    for model in ("llama-3.1-8b", "tiny-llama"):  # tiny-llama has no context window
        data = {**_job(16, {"device": "cpu"} if model == "tiny-llama" else {},
                       workload), "model": model}
        with pytest.raises(InputError) as e:
            parse_job(data)
        assert e.value.field == field and allowed in (e.value.allowed or ""), str(e.value)
        assert len(str(e.value)) < 200  # a 400-digit number is not echoed
    if field != "workload.response_len":
        with pytest.raises(InputError, match=field):
            Workload(**{k: v for k, v in workload.items() if k != "response_len"})


def test_the_largest_allowed_workload_counts_build():
    w = Workload(prompt_len=1 << 24, response_len_mean=1 << 24, response_len_max=1 << 24,
                 ppo_epochs=1024)
    assert w.updates_per_step == 4 * 1024


def test_grpo_needs_a_group_of_responses():
    from nereus.spec.job import check_groups

    one = parse_job({"model": "tiny-llama", "gpus": 2, "algo": "grpo"})
    with pytest.raises(InputError) as e:
        check_groups(one)
    assert e.value.field == "workload.responses_per_prompt"
    assert e.value.allowed == ">= 2 for grpo"
    check_groups(parse_job({"model": "tiny-llama", "gpus": 2, "algo": "grpo",
                            "workload": {"responses_per_prompt": 2}}))
    check_groups(parse_job({"model": "tiny-llama", "gpus": 2, "algo": "remax"}))  # no group


def test_mini_batches_that_do_not_divide_say_which_do():
    from nereus.spec.workload import divisors, divisors_text

    assert divisors(12) == [1, 2, 3, 4, 6, 12] and divisors(1) == [1] and divisors(49) == [1, 7, 49]
    with pytest.raises(InputError) as e:
        parse_job({"model": "tiny-llama", "gpus": 2, "workload": {"prompts_per_step": 6}})
    assert e.value.field == "workload.ppo_mini_batches"
    assert e.value.allowed == "a divisor of 6: 1, 2, 3, 6"
    long = divisors_text(720720)
    assert long.startswith("a divisor of 720720: 1, 2, 3,") and long.endswith("(240 in all)")


def test_a_rule_reward_drops_the_reward_model_and_its_stage():
    """verl's function reward (RLVR: a verifier scores responses on the CPU) runs no reward
    model: the job has no reward role and no reward_infer model-stage, and is faster for it."""
    from nereus.cost.model import CostModel
    from nereus.plan.search import Planner

    base = {"model": "llama-3.1-8b", "gpus": 16, "algo": "grpo",
            "workload": {"responses_per_prompt": 4}}
    with_model, with_rule = parse_job(base), parse_job({**base, "reward": "rule"})
    assert with_model.workflow.reward == "model" and with_rule.workflow.reward == "rule"
    assert "reward_infer" in [s.name for s in with_model.workflow.stages]
    assert [s.name for s in with_rule.workflow.stages] == ["actor_gen", "reference_infer",
                                                          "actor_train"]
    assert [m.name for m in with_rule.workflow.models] == ["actor", "reference"]
    slow = Planner(with_model, cost=CostModel(with_model)).best().step_latency_s
    fast = Planner(with_rule, cost=CostModel(with_rule)).best().step_latency_s
    assert fast < slow
    for algo in ("ppo", "remax"):
        wf = get_workflow(algo, reward="rule")
        assert all(s.model != "reward" for s in wf.stages)
    with pytest.raises(InputError) as e:
        parse_job({**base, "reward": "verifier"})
    assert e.value.field == "reward" and "'model' or 'rule'" in str(e.value)
    with pytest.raises(InputError) as e:
        get_workflow("grpo", reward="verifier")
    assert e.value.field == "reward"
