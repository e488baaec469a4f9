"""An error about a value typed as a command-line option names that option (``--gpus``), not
the config field it sets (``gpus``); a value the config file set keeps the field's name."""

from pathlib import Path

import pytest
from typer.testing import CliRunner

from nereus.cli import app

runner = CliRunner()
JOB = ["plan", "--model", "llama-3.1-8b", "--gpus", "16"]


def error(args: list[str]) -> str:
    r = runner.invoke(app, args)
    assert r.exit_code == 2, (args, r.output)
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("error: "), r.stderr
    return r.stderr


def config(tmp_path: Path, text: str) -> str:
    cfg = tmp_path / "job.yaml"
    cfg.write_text(text)
    return str(cfg)


@pytest.mark.parametrize("args,says", [
    (["plan", "--model", "no-such-model", "--gpus", "16"], "--model: unknown model"),
    ([*JOB, "--algo", "dpo"], "--algo: 'dpo' is not allowed"),
    ([*JOB, "--execution", "later"], "--execution: 'later' is not allowed"),
    (["plan", "--model", "llama-3.1-8b", "--gpus", "0"], "--gpus: 0 is not allowed"),
    ([*JOB, "--device", "tpu"], "--device: unknown device 'tpu'"),
    ([*JOB, "--devices-per-node", "0"], "--devices-per-node: 0 is not allowed"),
    ([*JOB, "--response-len", "0"], "--response-len: 0 is not allowed"),
    ([*JOB, "--response-len-max", "10"], "--response-len-max: 10 is below the mean 2048"),
    ([*JOB, "--prompt-len", "0"], "--prompt-len: 0 is not allowed"),
    ([*JOB, "--prompts", "0"], "--prompts: 0 is not allowed"),
    ([*JOB, "--responses-per-prompt", "0"], "--responses-per-prompt: 0 is not allowed"),
    ([*JOB, "--ppo-mini-batches", "3"], "--ppo-mini-batches: 3 does not divide"),
])
def test_an_option_with_a_value_not_allowed_is_named_as_typed(args: list[str], says: str
                                                              ) -> None:
    """`--response-len 0` said `workload.response_len: ...`, a field the user never wrote."""
    err = error(args)
    assert err.startswith(f"error: {says}"), err


@pytest.mark.parametrize("args,says", [
    (["--response-len", "3000", "--response-len-max", "1000"],
     "--response-len-max: 1000 is below the mean 3000"),
    (["--prompts", "3", "--ppo-mini-batches", "2"], "--ppo-mini-batches: 2 does not divide"),
    (["--response-len", "200000"], "--response-len: prompt 512 + longest response 200000"),
    (["--prompt-len", "200000"], "--prompt-len: 200000 tokens leave no room"),
    (["--prompts", "1048576", "--responses-per-prompt", "2"],
     "--responses-per-prompt: 1048576 prompts x 2 responses"),
])
def test_an_error_between_two_options_names_one_of_them(args: list[str], says: str) -> None:
    err = error([*JOB, *args])
    assert err.startswith(f"error: {says}"), err


@pytest.mark.parametrize("text,args,says", [
    ("workload: {response_len: 0}", [], "workload.response_len: 0 is not allowed"),
    ("cluster: {device: tpu}", [], "cluster.device: unknown device 'tpu'"),
    ("algo: dpo", [], "algo: 'dpo' is not allowed"),
    ("workload: {prompts_per_step: 3, ppo_mini_batches: 2}", [],
     "workload.ppo_mini_batches: 2 does not divide"),
    ("workload: {response_len: 3000}", ["--response-len-max", "1000"],
     "--response-len-max: 1000 is below the mean 3000"),
    ("workload: {response_len: 3000, response_len_max: 1000}", [],
     "workload.response_len_max: 1000 is below the mean 3000"),
])
def test_a_value_from_the_config_keeps_its_field_name(tmp_path: Path, text: str,
                                                      args: list[str], says: str) -> None:
    cfg = config(tmp_path, f"model: llama-3.1-8b\ngpus: 16\n{text}\n")
    err = error(["plan", "--config", cfg, *args])
    assert err.startswith(f"error: {says}"), err


@pytest.mark.parametrize("text,args,says", [
    ("workload: {ppo_mini_batches: 2}", ["--prompts", "3"],
     ("--prompts: 3 against the config's workload.ppo_mini_batches: 2 does not divide the 3 "
      "sequences of a step (3 prompts x 1 response) (allowed: --ppo-mini-batches a divisor of "
      "3: 1, 3, or another --prompts)")),
    ("workload: {ppo_mini_batches: 4}", ["--prompts", "3", "--responses-per-prompt", "2"],
     ("--prompts: 3 (with --responses-per-prompt 2) against the config's "
      "workload.ppo_mini_batches: 4 does not divide the 6 sequences")),
    ("workload: {response_len: 2048}", ["--prompt-len", "130000"],
     ("--prompt-len: 130000 against the config's workload.response_len: prompt 130000 + "
      "longest response 2048")),
    ("workload: {response_len: 60000}", ["--model", "qwen3-14b"],
     ("--model: qwen3-14b against the config's workload.response_len: prompt 512 + longest "
      "response 60000 = 60512 tokens exceed qwen3-14b's context window")),
    ("workload: {response_len: 3000}", ["--prompts", "3"],
     "--prompts: 3 against the default workload.ppo_mini_batches: 4 does not divide"),
    ("workload: {response_len: 3000, response_len_max: 1000}", ["--prompts", "4"],
     "workload.response_len_max: 1000 is below the mean 3000"),
])
def test_an_option_that_breaks_a_config_value_is_named(tmp_path: Path, text: str,
                                                       args: list[str], says: str) -> None:
    """The user changed the option, not the config's field (or default) it now clashes with:
    the error names the option and says which field it is checked against."""
    cfg = config(tmp_path, f"model: llama-3.1-8b\ngpus: 16\n{text}\n")
    err = error(["plan", "--config", cfg, *args])
    assert err.startswith(f"error: {says}"), err
    assert err.count("\n") == 1


def test_the_gpus_transition_works_out_keep_the_field_name(tmp_path: Path) -> None:
    """transition has no --gpus: it sizes the job to the plans' GPUs, so a config whose
    cluster is too small for them is the config's gpus, not an option the user typed."""
    r = runner.invoke(app, ["plan", "--model", "tiny-llama", "--device", "cpu", "--gpus", "16",
                            "--json"])
    assert r.exit_code == 0, r.output
    plan = tmp_path / "plan.json"
    plan.write_text(r.stdout)
    cfg = config(tmp_path, "model: tiny-llama\ngpus: 8\n"
                           "cluster: {device: cpu, nodes: 1, devices_per_node: 8}\n")
    err = error(["transition", str(plan), str(plan), "--config", cfg])
    # the plans' ids up to 15 reach the job as a pool of 16
    assert err.startswith("error: gpus: 16 GPUs exceed the cluster's 1 node x 8"), err


@pytest.mark.parametrize("args,says", [
    (["plan", "--config", "A.yaml", "--config", "B.yaml"],
     "--config: given twice ('A.yaml', then 'B.yaml') (allowed: once)"),
    (["plan", "-c", "A.yaml", "--config=B.yaml"], "--config: given twice"),
    (["plan", "--config=A.yaml", "-cB.yaml"], "--config: given twice"),
    ([*JOB, "--model", "qwen3-14b"],
     "--model: given twice ('llama-3.1-8b', then 'qwen3-14b') (allowed: once)"),
    ([*JOB, "--gpus=8"], "--gpus: given twice ('16', then '8')"),
    ([*JOB, "--frontier", "actor_train", "--frontier", "critic_train"], "--frontier: given twice"),
    (["simulate", "--steps", "3", "--steps", "4"], "--steps: given twice"),
    (["simulate", "-s", "a.yaml", "--scenario", "b.yaml"], "--scenario: given twice"),
    (["transition", "a.json", "b.json", "--gantt", "x.png", "--gantt", "y.png"],
     "--gantt: given twice"),
])
def test_a_single_valued_option_given_twice_is_refused(args: list[str], says: str) -> None:
    """`plan --config A.yaml --config B.yaml` planned B alone and `--model A --model B`
    planned B: click keeps the last value without a word."""
    err = error(args)
    assert err.startswith(f"error: {says}"), err


def test_a_value_that_looks_like_the_option_is_its_value_as_click_reads_it() -> None:
    """`--model --model` is one --model whose value is '--model' (as click parses it), not the
    option given twice."""
    err = error(["plan", "--model", "--model", "--gpus", "8"])
    assert err.startswith("error: --model: unknown model '--model'"), err


def test_a_flag_given_twice_is_harmless() -> None:
    once = runner.invoke(app, [*JOB, "--json"])
    twice = runner.invoke(app, [*JOB, "--json", "--json"])
    assert once.exit_code == twice.exit_code == 0, twice.output
    assert once.stdout == twice.stdout


@pytest.mark.parametrize("args,says", [
    (["plan", "--gpus", "2.5"],
     "--gpus: '2.5' is not an integer (allowed: a pool size 1..65,536)\n"),
    ([*JOB, "--prompts", "1.5"],
     "--prompts: '1.5' is not an integer (allowed: an integer 1..1,048,576)\n"),
    (["plan", "--gpus=abc"], "--gpus: 'abc' is not an integer (allowed: a pool size"),
    ([*JOB, "--devices-per-node", "1e3"],
     "--devices-per-node: '1e3' is not an integer (allowed: an integer 1..64)\n"),
    (["simulate", "--steps", "2.5"], "--steps: '2.5' is not an integer (allowed: an integer)"),
    (["simulate", "--gamma", "x"], "--gamma: 'x' is not a number (allowed: a number)"),
])
def test_a_count_option_given_a_fraction_names_the_option_and_the_range(args: list[str],
                                                                      says: str) -> None:
    """`--gpus 2.5` said click's "Invalid value for '--gpus': Input should be a valid
    integer", with no allowed range; `gpus: 16.5` in a YAML says what a pool size may be."""
    err = error(args)
    assert err.startswith(f"error: {says}"), err


@pytest.mark.parametrize("args,says", [
    (["plan", "--model", "llama-3.1-8b", "--gpus", "16.0"],
     "--gpus: '16.0' is not an integer (allowed: a pool size 1..65,536)\n"),
    ([*JOB, "--prompts", "512.0"],
     "--prompts: '512.0' is not an integer (allowed: an integer 1..1,048,576)\n"),
    (["simulate", "--steps", "2.0"], "--steps: '2.0' is not an integer (allowed: an integer)"),
])
def test_a_count_option_given_a_whole_float_is_refused_as_in_a_config(args: list[str],
                                                                     says: str) -> None:
    """`--gpus 16.0` planned 16 GPUs while `gpus: 16.0` in a config is refused: typer reads
    an int option's text with pydantic, which takes a float's text without a fraction."""
    err = error(args)
    assert err.startswith(f"error: {says}"), err
