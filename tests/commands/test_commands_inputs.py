"""Bad input a user plausibly types: one line naming the field or option and what is allowed,
exit 2; a job no plan fits: one line, exit 3. Conflicting options are refused, not ignored."""

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from nereus.cli import app

runner = CliRunner()
CONFIG = "examples/llama-3.1-8b-ppo.yaml"


def one_line(args: list[str], code: int = 2) -> str:
    r = runner.invoke(app, args)
    assert r.exit_code == code, (args, r.output)
    assert "Traceback" not in r.output
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("error: "), r.stderr
    return r.stderr


def test_a_misspelt_top_level_field_is_named_not_reported_as_missing_gpus(tmp_path: Path
                                                                         ) -> None:
    data = yaml.safe_load(Path(CONFIG).read_text())
    data["gpu"] = data.pop("gpus")
    cfg = tmp_path / "typo.yaml"
    cfg.write_text(yaml.safe_dump(data))
    err = one_line(["plan", "--config", str(cfg)])
    assert err.startswith("error: gpu: unknown field (allowed: ") and "gpus" in err, err


def test_a_plan_json_given_as_config_names_its_first_field(tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text(runner.invoke(app, ["plan", "--config", CONFIG, "--json"]).stdout)
    err = one_line(["plan", "--config", str(plan)])
    assert err.startswith("error: step_latency_s: unknown field"), err


@pytest.mark.parametrize("args", [
    ["plan", "--model", "llama-3.1-8b", "--gpus", "3"],
    ["plan", "--model", "llama-3.3-70b", "--gpus", "2"],
])
def test_a_job_no_plan_fits_is_one_line_exit_2(args: list[str]) -> None:
    err = one_line(args, 2)
    assert "fit" in err


@pytest.mark.parametrize("args,field,least", [
    (["plan", "--model", "llama-3.1-8b", "--gpus", "2"], "--gpus", 4),
    (["plan", "--model", "llama-3.1-8b", "--gpus", "1"], "--gpus", 4),  # a stage fits nowhere
    (["plan", "--model", "tiny-llama", "--device", "cpu", "--execution", "async", "--gpus",
      "1"], "--gpus", 2),  # generation and training need GPUs of their own
])
def test_a_pool_no_plan_fits_says_how_many_gpus_would(args: list[str], field: str,
                                                      least: int) -> None:
    """'no plan fits 2 GPUs' named neither the option nor what it allows."""
    err = one_line(args, 2)
    assert err.startswith(f"error: {field}: "), err
    assert err.endswith(f"(allowed: at least {least} GPUs, where the planner finds a plan "
                        "(estimated))\n"), err
    fewer = [*args[:-1], str(least - 1)]
    if least - 1 > int(args[-1]):  # one fewer than the answer does not fit either
        assert "no plan fits" in one_line(fewer, 2)
    assert runner.invoke(app, [*args[:-1], str(least), "--json"]).exit_code == 0


def test_a_config_whose_pool_no_plan_fits_names_its_gpus_field(tmp_path: Path) -> None:
    data = yaml.safe_load(Path(CONFIG).read_text())
    data["gpus"] = 2
    cfg = tmp_path / "two.yaml"
    cfg.write_text(yaml.safe_dump(data))
    err = one_line(["plan", "--config", str(cfg), "--json"])
    assert err.startswith("error: gpus: no plan fits 2 GPUs") and "at least 4 GPUs" in err, err
    data["gpus"] = [1, 2]  # ids: which GPUs to add is the user's to say
    cfg.write_text(yaml.safe_dump(data))
    err = one_line(["plan", "--config", str(cfg)])
    assert err.startswith("error: no plan fits 2 GPUs") and "allowed" not in err, err


@pytest.mark.parametrize("args,config,field,allowed", [
    # 2 GiB a GPU: no pool of up to 1,024 fits, so more GPUs is not the answer
    (["--model", "llama-3.1-8b", "--device", "cpu", "--gpus", "16"], None, "--device",
     "a device with more than 2.0 GiB per GPU: h100-sxm-80gb, h200-141gb"),
    ([], "model: llama-3.1-8b\ngpus: 16\ncluster: {device: cpu}\n", "cluster.device",
     "a device with more than 2.0 GiB per GPU: h100-sxm-80gb"),
    ([], "model: llama-3.1-8b\ngpus: 16\ncluster: {device_memory_gib: 0.5}\n",
     "cluster.device_memory_gib", "a device with more than 0.5 GiB per GPU"),
    # the config's one node holds no more GPUs
    ([], "model: llama-3.3-70b\ngpus: 8\ncluster: {nodes: 1}\n", "cluster.nodes",
     "more nodes, or a device with more memory per GPU"),
    # --frontier plans the job's stages too: the same error as the plan
    (["--model", "llama-3.3-70b", "--gpus", "8", "--frontier", "actor_train"], None, "--gpus",
     "at least 64 GPUs, where the planner finds a plan (estimated)"),
])
def test_a_job_no_pool_fits_names_what_would_fix_it(tmp_path: Path, args: list[str],
                                                     config: str | None, field: str,
                                                     allowed: str) -> None:
    """'error: model-stage actor_train fits nowhere: ...' named no option or field, and gave
    nothing allowed, where no pool of up to 1,024 GPUs fits or the config's nodes are full;
    --frontier gave it even where more GPUs fit."""
    if config is not None:
        cfg = tmp_path / "job.yaml"
        cfg.write_text(config)
        args = [*args, "--config", str(cfg)]
    err = one_line(["plan", *args])
    assert err.startswith(f"error: {field}: ") and f"(allowed: {allowed}" in err, err


def test_a_device_of_a_few_mib_is_not_called_0_gib(tmp_path: Path) -> None:
    """'a device with more than 0.0 GiB per GPU' (and '0.0 GiB allowed (90 % of 0.0 GiB')
    where cluster.device_memory_gib was 0.01: the figures were rounded to one decimal."""
    cfg = tmp_path / "job.yaml"
    cfg.write_text("model: llama-3.1-8b\ngpus: 16\ncluster: {device_memory_gib: 0.01}\n")
    err = one_line(["plan", "--config", str(cfg)])
    assert err.startswith("error: cluster.device_memory_gib: "), err
    assert "(allowed: a device with more than 0.01 GiB per GPU)" in err, err
    assert " 0.0 GiB" not in err and "(90 % of 0.01 GiB" in err, err


@pytest.mark.parametrize("args,says", [
    # one replica of the 70B actor_train needs more than a node's 8 GPUs: more do not help
    (["--model", "llama-3.3-70b", "--gpus", "128"],
     ("a replica of model-stage actor_train needs more than a node's 8 GPUs to fit memory (the "
      "smallest that fits here spans 32)")),
    (["--model", "llama-3.3-70b", "--gpus", "16"],  # fits nowhere on 16, spreads on none
     "a replica of model-stage actor_train needs more than a node's 8 GPUs to fit memory"),
    # one node: no other node to keep a copy on
    (["--model", "llama-3.1-8b", "--gpus", "8"], "the pool of 8 GPUs is one node"),
    (["--config", CONFIG, "--gpus", "8", "--frontier", "actor_train"],
     "the pool of 8 GPUs is one node"),
    (["--config", CONFIG, "--gpus", "4", "--evaluate", "examples/layouts/verl-colocated-8b.yaml"],
     "the pool of 4 GPUs is one node"),
])
def test_spread_that_no_pool_can_honour_names_it(args: list[str], says: str) -> None:
    """--spread on 128 GPUs said 'no layout with two replicas inside nodes that fits on 128
    GPUs', as if more would help; on one node it planned as if it were not given."""
    err = one_line(["plan", *args, "--spread"])
    assert err.startswith(f"error: --spread: {says}"), err
    assert "on 128 GPUs" not in err and "(allowed: " in err, err


def test_smallest_pool_doubles_then_halves_the_gap() -> None:
    from nereus.commands.plan import smallest_pool

    asked: list[int] = []

    def fits(k: int) -> bool:
        asked.append(k)
        return k >= 37

    assert smallest_pool(3, fits) == 37
    assert asked[:5] == [6, 12, 24, 48, 36] and 36 in asked and asked[-1] in (37, 38)
    assert smallest_pool(3, lambda k: False, limit=64) is None       # nothing up to the limit
    assert smallest_pool(3, lambda k: None if k > 8 else False) is None  # the cluster is full
    assert smallest_pool(3, lambda k: None if k > 12 else k >= 10) == 10
    # past the cluster's size the search halves back: 8 fits on a cluster of 10 (a reviewer's
    # 70B on 72 GPUs, given 48, had no answer though 64 fit)
    assert smallest_pool(3, lambda k: None if k > 10 else k >= 8) == 8
    assert smallest_pool(48, lambda k: None if k > 72 else k >= 64) == 64
    assert smallest_pool(1024, lambda k: True) is None  # at the limit: nothing above to try
    assert smallest_pool(1500, lambda k: k >= 1000) is None  # never fewer than given


@pytest.mark.parametrize("args,option", [
    (["plan", "--config", CONFIG, "--frontier", "actor_train", "--evaluate",
      "examples/layouts/verl-colocated-8b.yaml"], "--evaluate"),
    (["plan", "--config", CONFIG, "--frontier", "actor_train", "--explain"], "--explain"),
    (["plan", "--config", CONFIG, "--json", "--explain"], "--explain"),
    (["simulate", "--steps", "2", "--json", "--log"], "--log"),
    (["simulate", "--steps", "2", "--json", "--notes"], "--notes"),
])
def test_options_that_would_be_ignored_are_refused(args: list[str], option: str) -> None:
    err = one_line(args)
    assert err.startswith(f"error: {option}: cannot be combined with "), err
    assert "(allowed: " in err


def test_a_job_yaml_given_to_simulate_says_it_is_not_a_scenario() -> None:
    err = one_line(["simulate", "--config", CONFIG])
    assert err.startswith("error: --config: llama-3.1-8b-ppo.yaml is a job file"), err
    assert "(allowed: a scenario YAML (nereus examples writes two" in err, err


@pytest.mark.parametrize("option", ["--csv", "--plot"])
def test_simulate_refuses_an_unwritable_output_before_the_run(option: str) -> None:
    out = "/proc/nereus-out" + (".csv" if option == "--csv" else ".png")
    r = runner.invoke(app, ["simulate", "--steps", "2", option, out])
    assert r.exit_code == 2, r.output
    assert r.stdout == ""  # nothing simulated, nothing printed
    assert r.stderr.startswith(f"error: {option}: cannot write {out}"), r.stderr


@pytest.mark.parametrize("text,field,says", [
    ("gpus: 16.5", "gpus", "16.5 is not an integer (allowed: a pool size 1..65,536, or a list"),
    ("gpus: '16'", "gpus", "'16' is not an integer (allowed: a pool size 1..65,536, or a list"),
    ("gpus: [0, a]", "gpus.1", "'a' is not an integer (allowed: a pool size"),
    ("model:", "model", "an empty value is not a string (allowed: a model preset (llama-3.1-8b,"),
    ("cluster: {device: 5}", "cluster.device",
     "5 is not a string (allowed: a device preset: h100-sxm-80gb"),
    ("workload: {prompt_len: 1.5}", "workload.prompt_len",
     "1.5 is not an integer (allowed: an integer 1..16,777,216 tokens)"),
    ("workload: {master_weights: 3}", "workload.master_weights",
     "3 is not a switch (allowed: true, false)"),
])
def test_a_value_of_the_wrong_type_reads_one_way_with_what_is_allowed(
        tmp_path: Path, text: str, field: str, says: str) -> None:
    """`gpus: 16.5` said 'Input should be a valid integer' and `model:` 'Input should be a
    valid string' (pydantic's words, nothing allowed), while `gpus: '16'` said 'is not an
    integer'."""
    data = {"model": "llama-3.1-8b", "gpus": 16, **yaml.safe_load(text)}
    cfg = tmp_path / "job.yaml"
    cfg.write_text(yaml.safe_dump(data))
    err = one_line(["plan", "--config", str(cfg)])
    assert err.startswith(f"error: {field}: {says}"), err
    assert "Input should be" not in err


@pytest.mark.parametrize("args,option", [
    (["plan", "--config", "{dir}"], "--config"),
    (["simulate", "--csv", "{dir}"], "--csv"),
    (["simulate", "--plot", "{dir}"], "--plot"),
    (["transition", "{dir}", "{dir}", "--model", "tiny-llama"], "current"),
])
def test_a_directory_given_for_a_file_is_called_a_directory(tmp_path: Path, args: list[str],
                                                            option: str) -> None:
    """`--config /tmp` said 'no file at /tmp'; `--csv /tmp` 'unsupported file type (none)'."""
    err = one_line([a.format(dir=tmp_path) for a in args])
    assert err.startswith(f"error: {option}: {tmp_path} is a directory"), err


def test_grpo_with_one_response_per_prompt_is_refused() -> None:
    """GRPO's advantage is relative to the other responses to the same prompt: one response
    has none, and was accepted silently."""
    err = one_line(["plan", "--model", "llama-3.1-8b", "--gpus", "16", "--algo", "grpo"])
    assert err.startswith("error: --responses-per-prompt: grpo needs several responses per "
                          "prompt to compare, and the default is 1"), err
    assert "(allowed: >= 2 for grpo, e.g. --responses-per-prompt 8)" in err
    err = one_line(["plan", "--model", "llama-3.1-8b", "--gpus", "16", "--algo", "grpo",
                    "--responses-per-prompt", "1"])
    assert err.startswith("error: --responses-per-prompt: 1 response per prompt "), err
    r = runner.invoke(app, ["plan", "--model", "llama-3.1-8b", "--gpus", "16", "--algo", "grpo",
                            "--responses-per-prompt", "2", "--json"])
    assert r.exit_code == 0, r.output


def test_grpo_from_a_config_without_responses_per_prompt_names_the_field(tmp_path: Path
                                                                        ) -> None:
    """A GRPO job from --config that leaves responses_per_prompt out blamed the option
    --responses-per-prompt, which the user never typed."""
    cfg = tmp_path / "grpo.yaml"
    cfg.write_text("model: llama-3.1-8b\nalgo: grpo\ngpus: 8\n")
    err = one_line(["plan", "--config", str(cfg)])
    assert err.startswith("error: workload.responses_per_prompt: grpo needs several responses "
                          "per prompt to compare, and the config leaves it at the default 1"), err
    assert "(allowed: >= 2 for grpo, e.g. responses_per_prompt: 8 under workload, or " \
        "--responses-per-prompt 8)" in err
    # the option typed with the config: the option is named
    err = one_line(["plan", "--config", str(cfg), "--responses-per-prompt", "1"])
    assert err.startswith("error: --responses-per-prompt: 1 response per prompt "), err
    # the config's own value: its field
    cfg.write_text("model: llama-3.1-8b\nalgo: grpo\ngpus: 8\n"
                   "workload: {responses_per_prompt: 1}\n")
    err = one_line(["plan", "--config", str(cfg)])
    assert err.startswith("error: workload.responses_per_prompt: 1 response per prompt "), err


def test_a_longest_response_below_the_mean_says_what_is_allowed(tmp_path: Path) -> None:
    cfg = tmp_path / "job.yaml"
    cfg.write_text("model: llama-3.1-8b\ngpus: 8\n"
                   "workload: {response_len: 2048, response_len_max: 1000}\n")
    err = one_line(["plan", "--config", str(cfg)])
    assert err == ("error: workload.response_len_max: 1000 is below the mean 2048 "
                   "(allowed: at least 2048)\n"), err


def test_the_example_configs_still_plan() -> None:
    for cfg in sorted(Path("examples").glob("*.yaml")):
        r = runner.invoke(app, ["plan", "--config", str(cfg), "--json"])
        assert r.exit_code == 0, (cfg, r.output)


def test_job_specs_given_to_transition_are_checked_for_grpo_groups(tmp_path: Path) -> None:
    a = tmp_path / "a.yaml"
    a.write_text(yaml.safe_dump({"model": "tiny-llama", "gpus": 2, "algo": "grpo",
                                 "cluster": {"device": "cpu"}}))
    err = one_line(["transition", str(a), str(a)])
    assert err.startswith("error: current.workload.responses_per_prompt: "), err


@pytest.mark.parametrize("line,field,hint", [
    ("gpus: 1.6e1", "gpus", "16"),
    ("workload: {response_len: 2e3}", "workload.response_len", "2000"),
    ("cluster: {device_memory_gib: 7.5e1}", "cluster.device_memory_gib", "75"),
])
def test_the_yaml_exponent_hint_for_a_whole_number_is_an_integer(tmp_path: Path, line: str,
                                                                 field: str, hint: str) -> None:
    """`gpus: 1e2` advised `write 1.0e+02`, which YAML reads as 100.0: not an integer either."""
    rest = "" if field == "gpus" else "gpus: 16\n"
    cfg = tmp_path / "job.yaml"
    cfg.write_text(f"model: llama-3.1-8b\n{rest}{line}\n")
    err = one_line(["plan", "--config", str(cfg)])
    assert err.startswith(f"error: {field}: ") and f"(YAML reads it as text: write {hint})" in err
    written = line.split(": ")[-1].rstrip("}")
    cfg.write_text(f"model: llama-3.1-8b\n{rest}{line.replace(written, hint)}\n")
    r = runner.invoke(app, ["plan", "--config", str(cfg), "--json"])
    assert r.exit_code == 0, r.output


@pytest.mark.parametrize("written,hint", [("75e-2", "0.75"), ("1e-7", "1.0e-07"),
                                          ("1e300", "1.0e+300")])
def test_the_yaml_exponent_hint_for_a_fraction_is_a_float_yaml_reads(tmp_path: Path,
                                                                      written: str,
                                                                      hint: str) -> None:
    cfg = tmp_path / "job.yaml"
    cfg.write_text(f"model: llama-3.1-8b\ngpus: 16\ncluster: {{device_memory_gib: {written}}}\n")
    err = one_line(["plan", "--config", str(cfg)])
    assert f"(YAML reads it as text: write {hint})" in err, err
    assert yaml.safe_load(hint) == float(written)


@pytest.mark.parametrize("text,key,line", [
    ("model: llama-3.1-8b\ngpus: 16\nmodel: qwen3-14b\n", "model", 3),
    ("model: llama-3.1-8b\ngpus: 16\nworkload:\n  prompt_len: 256\n  prompt_len: 1024\n",
     "prompt_len", 5),
    ("model: llama-3.1-8b\ngpus: 16\ncluster: {device: cpu, device: h200-141gb}\n", "device", 3),
])
def test_a_key_given_twice_in_a_config_is_refused(tmp_path: Path, text: str, key: str,
                                                  line: int) -> None:
    """YAML keeps the last of two equal keys: `model:` written twice planned the second model,
    exit 0, and whoever wrote the first never knew."""
    cfg = tmp_path / "job.yaml"
    cfg.write_text(text)
    err = one_line(["plan", "--config", str(cfg)])
    assert err.startswith("error: --config: ") and f"{key!r}" in err and f"line {line}" in err, err
    assert "(allowed: " in err


def test_yaml_merge_keys_are_not_duplicates(tmp_path: Path) -> None:
    """A key that overrides one a merge (`<<: *base`) brought in is YAML's own way of
    overriding, not a key given twice."""
    from nereus.files import read_yaml

    f = tmp_path / "merge.yaml"
    f.write_text("base: &b {a: 1, b: 2}\nmore:\n  <<: *b\n  b: 3\n")
    assert read_yaml(f, "config") == {"base": {"a": 1, "b": 2}, "more": {"a": 1, "b": 3}}


@pytest.mark.parametrize("text,where", [
    ("model: llama-3.1-8b\ngpus: 16\n  algo: ppo\n", "line 3, column 7"),
    ("model: llama-3.1-8b\ncluster: {device: cpu\n", "line 3, column 1"),
])
def test_a_yaml_syntax_error_says_where(tmp_path: Path, text: str, where: str) -> None:
    """PyYAML's first line says what is wrong but not where: in a long config that was a hunt."""
    cfg = tmp_path / "job.yaml"
    cfg.write_text(text)
    err = one_line(["plan", "--config", str(cfg)])
    assert err.startswith("error: --config: ") and "is not valid YAML" in err, err
    assert f"at {where})" in err, err


@pytest.mark.parametrize("name", ["plan.json", "layout.yaml"])
def test_a_broken_plan_for_evaluate_is_not_called_only_yaml(tmp_path: Path, name: str) -> None:
    """A cut-off plan JSON given to --evaluate said 'is not valid YAML' and allowed 'a YAML
    mapping of fields': the option takes a plan JSON or a layout YAML."""
    plan = runner.invoke(app, ["plan", "--config", CONFIG, "--json"]).stdout
    broken = tmp_path / name
    broken.write_text(plan[:300])
    err = one_line(["plan", "--config", CONFIG, "--evaluate", str(broken)])
    assert err.startswith(f"error: --evaluate: {broken} is not valid JSON or YAML ("), err
    assert err.endswith("(allowed: a plan JSON (nereus plan --json) or a layout YAML of tp, "
                        "pp, dp and gpus per model-stage (nereus examples writes two, under "
                        "layouts/))\n"), err


@pytest.mark.parametrize("name,text,args", [
    ("deep.json", "[" * 100_000, ["transition", "{f}", "{f}", "--model", "tiny-llama"]),
    ("deep.yaml", "a:\n" + "".join(" " * k + "- \n" for k in range(1, 3000)),
     ["plan", "--config", "{f}"]),
])
def test_nesting_too_deep_to_read_is_one_line(tmp_path: Path, name: str, text: str,
                                              args: list[str]) -> None:
    """Python's parsers recurse: a file nested thousands deep raised RecursionError, exit 1."""
    f = tmp_path / name
    f.write_text(text)
    err = one_line([a.format(f=f) for a in args])
    assert "nests lists or mappings too deeply to read" in err, err
