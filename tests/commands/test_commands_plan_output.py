"""What ``nereus plan`` prints: no speed ratio against a plan that does not fit, node-loss
lines grouped by node, '1 node'."""

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from nereus.cli import app

runner = CliRunner()
CONFIG = "examples/llama-3.1-8b-ppo.yaml"
EXAMPLES = Path(__file__).resolve().parents[2] / "src" / "nereus" / "examples"
STAGES = ("actor_gen", "reference_infer", "reward_infer", "critic_infer", "actor_train",
          "critic_train")


def test_no_speed_ratio_against_a_plan_that_does_not_fit(tmp_path: Path) -> None:
    layout = tmp_path / "small.yaml"  # every stage on one GPU per replica: far over 80 GiB
    layout.write_text(yaml.safe_dump({s: {"tp": 1, "pp": 1, "dp": 16} for s in STAGES}))
    r = runner.invoke(app, ["plan", "--config", CONFIG, "--evaluate", str(layout)])
    assert r.exit_code == 0, r.output
    assert "does not fit" in r.stdout
    assert "x the speed of yours" not in r.stdout
    assert "yours does not fit, so its" in r.stdout and "is no comparison" in r.stdout


def test_a_plan_that_fits_still_gets_its_ratio() -> None:
    r = runner.invoke(app, ["plan", "--config", CONFIG, "--evaluate",
                            "examples/layouts/verl-colocated-8b.yaml"])
    assert r.exit_code == 0, r.output
    assert "x the speed of yours per step (estimated)" in r.stdout


def test_node_loss_groups_the_nodes_that_take_the_same_stages() -> None:
    from nereus.commands.plan import _takes

    got = _takes({8: ["critic_train"], 9: ["critic_train"], 10: ["critic_train"],
                  3: ["actor_gen", "actor_train"]})
    assert got == "nodes 8-10 take critic_train; node 3 takes actor_gen, actor_train"


def test_one_node_is_singular() -> None:
    r = runner.invoke(app, ["plan", "--model", "tiny-llama", "--device", "cpu", "--gpus", "2"])
    assert r.exit_code == 0, r.output
    assert "(1 node x 2)" in r.stdout


def test_a_spread_frontier_says_so() -> None:
    r = runner.invoke(app, ["plan", "--config", CONFIG, "--frontier", "actor_train", "--spread"])
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    assert lines[0] == "actor_train: latency-GPU frontier (estimated)"  # one short line
    assert "--spread: two or more replicas, each inside a node" in lines


def test_a_plan_from_a_profile_says_so(tmp_path: Path) -> None:
    prof = tmp_path / "h100.json"
    prof.write_text('{"device": "h100-sxm-80gb", "efficiency": {"gemm": 0.6}}')
    r = runner.invoke(app, ["plan", "--config", CONFIG, "--profile", str(prof)])
    assert r.exit_code == 0, r.output
    assert "cost model calibrated with h100.json" in r.stdout


def _empty_sections(text: str) -> list[str]:
    """Section headers of --explain ('  memory per GPU:') with no line of their own under them."""
    lines = text.splitlines()
    return [f"{i}: {ln}" for i, ln in enumerate(lines) if ln.rstrip().endswith(":")
            and ln.startswith("  ") and not (i + 1 < len(lines)
                                             and lines[i + 1].startswith("      "))]


def test_explain_prints_no_empty_memory_section() -> None:
    """The weight sync's block ended in a bare 'memory per GPU:' under a header with a fake
    candidate 'b=1 a=1' and 'peak 0.00 GiB'; its memory is what the GPU holds during it."""
    for extra in ([], ["--evaluate", "examples/layouts/verl-colocated-8b.yaml"]):
        r = runner.invoke(app, ["plan", "--config", CONFIG, "--explain", *extra])
        assert r.exit_code == 0, r.output
        assert _empty_sections(r.stdout) == [], _empty_sections(r.stdout)
        sync = [ln for ln in r.stdout.splitlines() if ln.startswith("weight sync ")]
        # one per plan broken down: --evaluate breaks down yours and the best
        assert len(sync) == 1 + bool(extra) and "actor_train [tp=" in sync[0], sync
        assert "(estimated)" in sync[0] and "peak" not in sync[0] and "b=1" not in sync[0]
        block = r.stdout.split(sync[0], 1)[1]
        memory = block.split("memory per GPU:", 1)[1]
        assert "training parameters" in memory and "gather buffer" in memory, block


def test_evaluate_explain_says_whose_breakdown_each_is() -> None:
    """After 'best plan: 1.12x the speed of yours' it printed the user's breakdown with no
    heading, so it read as the best plan's, and the best plan got none."""
    r = runner.invoke(app, ["plan", "--config", CONFIG, "--evaluate",
                            "examples/layouts/verl-colocated-8b.yaml", "--explain"])
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    heads = [i for i, ln in enumerate(lines) if ln.endswith(": where its time and memory go "
                                                            "(estimated)")]
    assert [lines[i] for i in heads] == [
        "your plan (verl-colocated-8b.yaml): where its time and memory go (estimated)",
        "best plan: where its time and memory go (estimated)"], heads
    assert lines[heads[0] - 1].startswith("best plan: 1.1")  # the comparison comes first
    # each breakdown is its own plan's: the actor's generation layout of each table
    yours, best = "\n".join(lines[heads[0]:heads[1]]), "\n".join(lines[heads[1]:])
    assert "actor_gen [tp=2 pp=1 dp=8" in yours and "actor_gen [tp=2 pp=1 dp=8" not in best
    plan = json.loads(runner.invoke(app, ["plan", "--config", CONFIG, "--json"]).stdout)
    gen = next(s for s in plan["stages"] if s["name"] == "actor_gen")
    assert f"actor_gen [tp={gen['tp']} pp={gen['pp']} dp={gen['dp']}" in best
    r = runner.invoke(app, ["plan", "--config", CONFIG, "--explain"])  # one plan, one heading
    assert r.stdout.count("where its time and memory go") == 1
    assert "best plan: where its time and memory go (estimated)" in r.stdout


def test_the_table_shows_the_memory_limit_and_says_what_shares_means() -> None:
    """'peak/cap GiB' read '19.9/80' while plans are held to 90 % (71.7 GiB), and the
    'shares' letters had no legend."""
    r = runner.invoke(app, ["plan", "--config", CONFIG])
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    assert any("peak/limit GiB" in ln for ln in lines) and "peak/cap" not in r.stdout
    rows = [ln for ln in lines if ln.startswith("│ ")]
    assert len(rows) == len(STAGES) and all(ln.rstrip(" │").endswith("/71.7") for ln in rows)
    assert ("shares: model-stages of a phase with the same letter run one after another on the "
            "same GPUs (-: on GPUs of its own in its phase); limit: 90 % of 79.6 GiB per GPU"
            ) in r.stdout


def test_explain_prices_the_weight_sync_as_the_plan_does() -> None:
    """--explain priced the sync from bare layouts (every generation GPU colocated: 0.000 s)
    while the plan's own term counts the generation GPUs that hold no training shard."""
    plan = json.loads(runner.invoke(app, ["plan", "--config", CONFIG, "--json"]).stdout)
    term = plan["terms"]["weight_sync"]
    assert term > 0.001  # generation on 16 GPUs, training on 8: a real sync
    r = runner.invoke(app, ["plan", "--config", CONFIG, "--explain"])
    assert r.exit_code == 0, r.output
    (sync,) = [ln for ln in r.stdout.splitlines() if ln.startswith("weight sync ")]
    assert f": {term:.3f} s per step (estimated)" in sync, (sync, term)
    assert "hold no training shard" in r.stdout


def test_the_header_does_not_multiply_out_to_more_gpus_than_the_pool() -> None:
    """16 GPUs on nodes of 3 printed '(6 nodes x 3)', which reads as 18."""
    r = runner.invoke(app, ["plan", "--model", "llama-3.1-8b", "--gpus", "16",
                            "--devices-per-node", "3"])
    assert r.exit_code == 0, r.output
    head = r.stdout.splitlines()[0]
    assert "x 3)" not in head and "(6 nodes of up to 3)" in head, head
    r = runner.invoke(app, ["plan", "--config", CONFIG])
    assert "(2 nodes x 8)" in r.stdout.splitlines()[0]


def test_plan_json_records_the_job_it_was_planned_for() -> None:
    r = runner.invoke(app, ["plan", "--model", "tiny-llama", "--device", "cpu", "--gpus", "2",
                            "--json"])
    assert r.exit_code == 0, r.output
    rec = json.loads(r.stdout)["planned_for"]
    assert {k: rec[k] for k in ("model", "device", "algo")} == {
        "model": "tiny-llama", "device": "cpu", "algo": "ppo"}
    assert rec["architecture"].startswith("4 layers x 64,"), rec
    r = runner.invoke(app, ["plan", "--config", CONFIG, "--evaluate",
                            "examples/layouts/verl-colocated-8b.yaml", "--json"])
    assert json.loads(r.stdout)["planned_for"]["model"] == "llama-3.1-8b"


def _read_back(out: str, where: str = "current") -> object:
    """The job a command's JSON records, read as nereus transition reads it."""
    from nereus.commands.planfile import recorded_job, split_record

    _, rec = split_record(json.loads(out), where)
    return recorded_job(rec, where, Path("p.json"))


def test_every_plan_json_records_the_whole_job() -> None:
    """--json, --evaluate --json and --frontier --json: the record holds the job itself
    (pool, cluster, workload), which reads back as the job planned."""
    from nereus.spec.job import load_job

    job = load_job(CONFIG)
    for extra in ([], ["--evaluate", "examples/layouts/verl-colocated-8b.yaml"],
                  ["--frontier", "actor_train"]):
        r = runner.invoke(app, ["plan", "--config", CONFIG, *extra, "--json"])
        assert r.exit_code == 0, r.output
        assert _read_back(r.stdout) == job, extra
    r = runner.invoke(app, ["plan", "--config", CONFIG, "--gpus", "24", "--response-len",
                            "4096", "--json"])
    rec = json.loads(r.stdout)["planned_for"]["job"]
    assert (rec["gpus"], rec["workload"]["response_len"]) == (24, 4096)
    assert rec["workload"]["response_len_max"] == 4096  # --response-len alone sets both


@pytest.mark.parametrize("example", sorted(p.name for p in EXAMPLES.glob("*.yaml")))
def test_the_recorded_job_of_every_example_reads_back_as_it(example: str) -> None:
    from nereus.commands.planfile import with_record
    from nereus.spec.job import load_job

    path = EXAMPLES / example
    job = load_job(path)
    given = yaml.safe_load(path.read_text())["model"]
    assert _read_back(json.dumps(with_record({}, job, given))) == job
    assert _read_back(json.dumps(with_record({}, job))) == job  # a preset names itself


def test_a_recorded_job_reads_back_with_its_config_json_pool_and_memory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A model from a config.json (by a relative path, by its folder, by a Hugging Face id
    in the local cache), a pool of listed GPU ids, another device memory: each reads back."""
    import huggingface_hub.constants

    from nereus.spec.job import load_job
    from nereus.spec.model import MODEL_PRESETS

    hf = json.dumps(MODEL_PRESETS["tiny-qwen3"].to_hf_dict())
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(hf)
    snap = tmp_path / "hub" / "models--Org--Tiny" / "snapshots" / "0123abcd"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text(hf)
    (tmp_path / "hub" / "models--Org--Tiny" / "refs").mkdir()
    (tmp_path / "hub" / "models--Org--Tiny" / "refs" / "main").write_text("0123abcd")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.chdir(tmp_path)
    for model in ("m/config.json", "m", "Org/Tiny"):
        cfg = tmp_path / "job.yaml"
        cfg.write_text(yaml.safe_dump({
            "model": model, "gpus": [1, 2, 5], "algo": "grpo", "reward": "rule",
            "cluster": {"device": "cpu", "devices_per_node": 4, "device_memory_gib": 1.5},
            "workload": {"responses_per_prompt": 4, "optimizer": "sgd", "grad_dtype": "bf16",
                         "master_weights": False, "response_len_max": 4096}}))
        r = runner.invoke(app, ["plan", "--config", str(cfg), "--json"])
        assert r.exit_code == 0, r.output
        job = load_job(cfg)
        recorded = json.loads(r.stdout)["planned_for"]["job"]["model"]
        assert recorded == (model if model == "Org/Tiny" else str(tmp_path / model))
        monkeypatch.chdir(tmp_path / "m")  # read back elsewhere: the path is absolute
        assert _read_back(r.stdout) == job, model
        monkeypatch.chdir(tmp_path)


def test_mini_batches_that_do_not_divide_the_batch_say_which_do() -> None:
    r = runner.invoke(app, ["plan", "--model", "llama-3.1-8b", "--gpus", "16", "--prompts", "7"])
    assert r.exit_code == 2, r.output
    assert r.stderr.count("\n") == 1
    assert r.stderr.startswith("error: --prompts: 7 against the default "
                               "workload.ppo_mini_batches: 4 does not divide the 7 ")
    assert "(allowed: --ppo-mini-batches a divisor of 7: 1, 7, or another --prompts)" \
        in r.stderr
    # the option beside the other workload options sets it, and its errors name the option
    r = runner.invoke(app, ["plan", "--model", "llama-3.1-8b", "--gpus", "16", "--prompts", "7",
                            "--ppo-mini-batches", "7", "--json"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["plan", "--model", "llama-3.1-8b", "--gpus", "16",
                            "--ppo-mini-batches", "3"])
    assert r.exit_code == 2 and r.stderr.startswith("error: --ppo-mini-batches: 3 does not "
                                                    "divide the 512 "), r.stderr
    assert "1, 2, 4, 8, 16, 32, 64, 128, 256, 512" in r.stderr


def _written(tmp_path: Path, name: str, *args: str) -> Path:
    r = runner.invoke(app, ["plan", *args, "--json"])
    assert r.exit_code == 0, r.output
    p = tmp_path / name
    p.write_text(r.stdout)
    return p


def test_evaluate_refuses_a_plan_made_for_another_job(tmp_path: Path) -> None:
    """A tiny-llama CPU plan was priced as the 8B model on H100s (exit 0, 'does not fit')."""
    tiny = _written(tmp_path, "tiny.json", "--model", "tiny-llama", "--device", "cpu",
                    "--gpus", "2")
    r = runner.invoke(app, ["plan", "--config", CONFIG, "--evaluate", str(tiny)])
    assert r.exit_code == 2, r.output
    assert r.stderr.startswith("error: --evaluate: tiny.json was planned for tiny-llama on cpu"), \
        r.stderr


def test_evaluate_given_the_job_file_says_so() -> None:
    """It read the job as a layout: 'evaluate.model: must be a mapping of fields'."""
    r = runner.invoke(app, ["plan", "--config", CONFIG, "--evaluate", CONFIG])
    assert r.exit_code == 2, r.output
    assert r.stderr.startswith("error: --evaluate: llama-3.1-8b-ppo.yaml is a job file (as "
                               "--config reads), not a plan (allowed: a plan JSON"), r.stderr


@pytest.mark.parametrize("edit,field,says", [
    # read as a layout: its step_latency_s was taken for a model-stage
    (lambda plan: plan.pop("stages"), "stages", "required field is missing"),
    # silently tp = 1
    (lambda plan: plan["stages"][0].pop("tp"), "stages.0.tp", "required field is missing"),
    # dp = 5 beside 4 GPU lists: the error was about micro_batch
    (lambda plan: plan["stages"][0].update(dp=5), "stages.0", "actor_gen: 4 GPU lists for dp = 5"),
])
def test_evaluate_names_a_plan_files_fields_as_transition_does(
        tmp_path: Path, edit: object, field: str, says: str) -> None:
    """A plan file that lost a field was read by plan --evaluate as a layout, and its errors
    named other fields (or none) than transition's, which checks it as a plan file: both now
    check a plan file alike."""
    plan = json.loads(_written(tmp_path, "p.json", "--config", CONFIG).read_text())
    edit(plan)  # type: ignore[operator]
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(plan))
    r = runner.invoke(app, ["plan", "--config", CONFIG, "--evaluate", str(p)])
    assert r.exit_code == 2, r.output
    assert r.stderr.startswith(f"error: evaluate.{field}: {says}"), r.stderr
    r = runner.invoke(app, ["transition", str(p), str(tmp_path / "p.json")])
    assert r.exit_code == 2, r.output
    assert r.stderr.startswith(f"error: current.{field}: {says}"), r.stderr


def test_evaluate_names_a_plan_files_unknown_stage_by_its_name_field(tmp_path: Path) -> None:
    """It said ``evaluate.foo``: the plan file has no field foo, its stage 0 names foo."""
    plan = json.loads(_written(tmp_path, "p.json", "--config", CONFIG).read_text())
    plan["stages"][0]["name"] = "foo"
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(plan))
    r = runner.invoke(app, ["plan", "--config", CONFIG, "--evaluate", str(p)])
    assert r.exit_code == 2, r.output
    assert r.stderr.startswith("error: evaluate.stages.0.name: not a model-stage of this job"), \
        r.stderr


@pytest.mark.parametrize("args,what", [
    (["plan", "--config", CONFIG, "--frontier", "actor_train", "--json"],
     "a model-stage's latency-GPU frontier (as nereus plan --frontier --json writes)"),
    (["simulate", "--scenario", "stationary", "--steps", "2", "--json"],
     "a simulation's result (as nereus simulate --json writes)"),
    (["transition", "examples/layouts/verl-colocated-8b.yaml",
      "examples/layouts/verl-colocated-8b.yaml", "--config", CONFIG, "--json"],
     "a transition's schedule (as nereus transition --json writes)"),
])
def test_another_commands_json_is_said_to_be_no_plan(tmp_path: Path, args: list[str],
                                                     what: str) -> None:
    """transition read these as plans that lack their stages; plan --evaluate said so of a
    frontier only, and read the others as layouts whose fields are no model-stage."""
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    out = tmp_path / "out.json"
    out.write_text(r.stdout)
    plan = _written(tmp_path, "p.json", "--config", CONFIG)
    r = runner.invoke(app, ["transition", str(out), str(plan)])
    assert r.exit_code == 2, r.output
    assert r.stderr.startswith(f"error: current: out.json is {what}, not a plan"), r.stderr
    r = runner.invoke(app, ["plan", "--config", CONFIG, "--evaluate", str(out)])
    assert r.exit_code == 2, r.output
    assert r.stderr.startswith(f"error: --evaluate: out.json is {what}, not a plan"), r.stderr


def test_evaluate_refuses_gpu_ids_outside_the_pool(tmp_path: Path) -> None:
    """GPUs 100-107 on a 16-GPU pool were placed, priced and said to fit."""
    plan = json.loads(_written(tmp_path, "p.json", "--config", CONFIG).read_text())
    plan["stages"][0]["gpus"][0] = list(range(100, 100 + len(plan["stages"][0]["gpus"][0])))
    p = tmp_path / "outside.json"
    p.write_text(json.dumps(plan))
    r = runner.invoke(app, ["plan", "--config", CONFIG, "--evaluate", str(p)])
    assert r.exit_code == 2, r.output
    assert r.stderr == ("error: evaluate.stages.0.gpus.0: GPU 100 of replica 0 is not in the "
                        "pool (allowed: GPU ids 0-15)\n"), r.stderr


def test_a_plan_close_to_the_best_says_by_how_much(tmp_path: Path) -> None:
    """The spread plan of the 8B job evaluated against the best plan, the packed one on these
    16 GPUs: the comparison says by how much, and the notes say where the spread plan's
    gradient all-reduces cross nodes."""
    from nereus.commands.planfile import with_record
    from nereus.files import read_yaml
    from nereus.plan.search import Planner
    from nereus.spec.job import parse_job

    job = parse_job(read_yaml(Path(CONFIG), "config"))
    spread = tmp_path / "spread.json"
    spread.write_text(json.dumps(with_record(Planner(job, spread=True).best_placed().to_dict(),
                                             job)))
    r = runner.invoke(app, ["plan", "--config", CONFIG, "--evaluate", str(spread)])
    assert r.exit_code == 0, r.output
    last = " ".join(r.stdout.split())
    assert "best plan: 1.02x the speed of yours per step (estimated)" in last, last
    assert ("note: actor_train: priced on the links its GPU ids use (DP group [0, 8] across "
            "nodes): 23.441 s, +1.166 s against node-aligned groups of its sizes") in last, last


def test_a_plan_faster_than_the_best_found_is_said_to_be_and_why() -> None:
    """A user's placement can still beat the search's (it prices the sync by a count model):
    the comparison says so and, when the sync is what differs, why."""
    from nereus.commands.plan import _comparison
    from nereus.plan.types import Plan

    yours = Plan((), 46.9, terms={"weight_sync": 0.01})
    best = Plan((), 47.0, terms={"weight_sync": 0.1})
    text = _comparison(yours, best, [])
    assert text.startswith("your plan is 0.21 % faster per step than the best plan found "
                           "(46.900 s against 47.000 s, estimated)")
    assert "its weight sync takes 0.010 s against 0.100 s" in text
    assert _comparison(best, yours, []).startswith("the best plan is 0.21 % faster")
    assert _comparison(best, best, []) == \
        "your plan is as fast as the best plan found (47.000 s per step, estimated)"
    assert _comparison(Plan((), 94.0), best, []) == \
        "best plan: 2.00x the speed of yours per step (estimated)"


def test_the_best_plan_is_the_faster_of_packed_and_spread() -> None:
    """On the 8B job's 16 GPUs the plan with replicas spread over nodes syncs its weights
    inside nodes (0.015 s against 0.161 s), but its training replicas then all-reduce their
    gradients across nodes: 47.053 s a step against the packed plan's 46.033 s. Priced by
    sizes, that all-reduce looked as if it stayed inside a node and the spread plan won by
    0.31 %. The packed plan is the best, and the hint offers the spread one."""
    r = runner.invoke(app, ["plan", "--config", CONFIG])
    assert r.exit_code == 0, r.output
    text = " ".join(r.stdout.split())
    assert "step latency 46.033 s (estimated)" in text and "weight_sync 0.161 s" in text
    assert "node loss: the last copy of a model-stage goes with a node" in text
    assert "--spread looks for a plan that keeps a copy on another node" in text


@pytest.mark.parametrize("width", [72, 80, 100, 200])
def test_a_narrow_terminal_cuts_no_number_of_the_plan_table(width: int) -> None:
    """Every column was no-wrap: below about 110 columns Rich cut them to an ellipsis, and at
    80 the tp, pp and dp cells printed empty. Where the boxed table is too wide it loses its
    box, headers wrap and only names fold; every number stays whole."""
    from io import StringIO

    from rich.console import Console

    from nereus.commands.plan import plan_table
    from nereus.plan.search import Planner
    from nereus.spec.job import load_job

    job = load_job(CONFIG)
    plan = Planner(job).best()
    out = StringIO()
    Console(file=out, width=width).print(plan_table(job, plan, "best plan"))
    text = out.getvalue()
    lines = text.splitlines()
    assert "…" not in text
    assert max(map(len, lines)) <= width
    boxed = "┃" in text
    assert boxed == (width == 200)  # the box stays where it fits
    for sp in plan.stages:
        c = sp.candidate
        row = (f"{c.tp} {c.pp} {c.dp} {c.micro_batch}x{c.grad_accum}" if not boxed else
               f"{c.tp} │ {c.pp} │ {c.dp} │ {c.micro_batch}x{c.grad_accum}")
        (line,) = [" ".join(ln.strip("│┃ ").split()) for ln in lines
                   if ln.strip("│┃ ") and sp.stage.startswith(ln.strip("│┃ ").split()[0])]
        assert row in line and f"{sp.latency_s:.3f}" in line, (sp.stage, text)
