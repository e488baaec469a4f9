import itertools
import json

from typer.testing import CliRunner

from nereus.cli import app

runner = CliRunner()
BASE = ["plan", "--model", "llama-3.1-8b", "--algo", "ppo", "--gpus", "16",
        "--device", "h100-sxm-80gb", "--response-len", "2048"]


def test_json_output_shape():
    r = runner.invoke(app, [*BASE, "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["source"] == "estimated" and out["step_latency_s"] > 0
    names = {s["name"] for s in out["stages"]}
    assert names == {"actor_gen", "reference_infer", "reward_infer", "critic_infer",
                     "actor_train", "critic_train"}
    for s in out["stages"]:
        assert len(s["gpus"]) == s["dp"] and all(len(r) == s["tp"] * s["pp"] for r in s["gpus"])
        assert isinstance(s["peak_mem_bytes"], int) and s["latency_s"] > 0


def test_table_explain_and_frontier():
    r = runner.invoke(app, [*BASE, "--explain"])
    assert r.exit_code == 0 and "step latency" in r.stdout and "dp_sync" in r.stdout
    r = runner.invoke(app, [*BASE, "--frontier", "actor_train", "--json"])
    rows = json.loads(r.stdout)["frontier"]
    assert [x["gpus"] for x in rows] == sorted(x["gpus"] for x in rows)
    assert all(a["latency_s"] > b["latency_s"] for a, b in itertools.pairwise(rows))


def test_config_and_evaluate(tmp_path):
    r = runner.invoke(app, ["plan", "--config", "examples/llama-3.1-8b-ppo.yaml", "--evaluate",
                            "examples/layouts/verl-colocated-8b.yaml", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["fits"] is True and out["best_step_latency_s"] <= out["step_latency_s"]
    # the plan JSON that --json writes can be evaluated too
    best = runner.invoke(app, ["plan", "--config", "examples/llama-3.1-8b-ppo.yaml", "--json"])
    p = tmp_path / "best.json"
    p.write_text(best.stdout)
    again = json.loads(runner.invoke(app, ["plan", "--config", "examples/llama-3.1-8b-ppo.yaml",
                                           "--evaluate", str(p), "--json"]).stdout)
    assert again["step_latency_s"] == json.loads(best.stdout)["step_latency_s"]


def test_bad_input_is_one_line_exit_2(tmp_path):
    cases = [
        ["plan", "--model", "llama-9b", "--gpus", "4"],
        ["plan", "--model", "llama-3.1-8b", "--gpus", "0"],
        ["plan", "--model", "llama-3.1-8b", "--gpus", "4", "--device", "tpu-v5"],
        ["plan", "--model", "llama-3.3-70b", "--gpus", "2"],
        ["plan", "--model", "llama-3.1-8b", "--gpus", "4", "--frontier", "nope"],
        ["plan", "--config", str(tmp_path / "missing.yaml")],
    ]
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: llama-3.1-8b\ngpus: 8\nworkload: {respons_len: 10}\n")
    cases.append(["plan", "--config", str(bad)])
    for args in cases:
        r = runner.invoke(app, args)
        assert r.exit_code == 2, (args, r.output)
        assert r.stderr.count("\n") == 1 and r.stderr.startswith("error: "), r.stderr
        assert "Traceback" not in r.output


def test_the_table_says_what_a_node_loss_takes_and_spread_keeps_a_copy():
    # at 24 GPUs the fastest plan packs critic_train on one node (at 16 the spread plan is
    # the fastest, so nothing is exposed there)
    at_24 = [a if a != "16" else "24" for a in BASE]  # --gpus once: a second is refused
    r = runner.invoke(app, [*at_24, "--devices-per-node", "8"])
    assert r.exit_code == 0, r.output
    assert "node loss: the last copy" in r.stdout and "--spread" in r.stdout
    r = runner.invoke(app, [*BASE, "--devices-per-node", "8", "--spread", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    for s in out["stages"]:
        assert len({g // 8 for rep in s["gpus"] for g in rep[:1]}) >= 2  # replicas on 2 nodes
    r = runner.invoke(app, [*BASE, "--devices-per-node", "8", "--spread"])
    assert "any one node can go" in r.stdout


def test_an_evaluated_plan_file_is_a_plan_file_for_transition(tmp_path):
    cfg = "examples/llama-3.1-8b-ppo.yaml"
    r = runner.invoke(app, ["plan", "--config", cfg, "--evaluate",
                            "examples/layouts/verl-colocated-8b.yaml", "--json"])
    assert r.exit_code == 0, r.output
    assert {"fits", "problems", "best_step_latency_s"} <= set(json.loads(r.stdout))
    (tmp_path / "now.json").write_text(r.stdout)
    r = runner.invoke(app, ["plan", "--config", cfg, "--json"])
    (tmp_path / "best.json").write_text(r.stdout)
    r = runner.invoke(app, ["transition", str(tmp_path / "now.json"), str(tmp_path / "best.json"),
                            "--config", cfg, "--json"])
    assert r.exit_code in (0, 3), r.output  # read as a plan (3: a move that cannot run)
    assert "estimated_s" in r.stdout


def test_evaluate_compares_with_the_spread_plan_under_spread():
    r = runner.invoke(app, ["plan", "--config", "examples/llama-3.1-8b-ppo.yaml", "--evaluate",
                            "examples/layouts/verl-colocated-8b.yaml", "--spread"])
    assert r.exit_code == 0, r.output
    assert "best plan (--spread)" in r.stdout and r.stdout.count("node loss:") == 2


# every model-stage of a 70B PPO job on all 32 GPUs: training does not fit, and no plan does
CRAMMED_70B = {"actor_gen": {"tp": 8, "pp": 1, "dp": 4},
               "reference_infer": {"tp": 8, "pp": 1, "dp": 4},
               "reward_infer": {"tp": 8, "pp": 1, "dp": 4},
               "critic_infer": {"tp": 8, "pp": 1, "dp": 4},
               "actor_train": {"tp": 8, "pp": 4, "dp": 1},
               "critic_train": {"tp": 8, "pp": 4, "dp": 1}}
JOB_70B = ["plan", "--model", "llama-3.3-70b", "--gpus", "32"]


def test_evaluate_of_a_job_no_plan_fits_scores_yours_then_fails_as_plan_does(tmp_path):
    """--evaluate exits 2 where the plain command does, with the same one-line error, after
    printing its evaluation; a memory-problem list cut short says how many it left out."""
    layout = tmp_path / "L.yaml"
    layout.write_text(json.dumps(CRAMMED_70B))
    plain = runner.invoke(app, JOB_70B)
    assert plain.exit_code == 2, plain.output
    r = runner.invoke(app, [*JOB_70B, "--evaluate", str(layout)])
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output
    assert r.stderr == plain.stderr and r.stderr.count("\n") == 1, r.stderr
    assert "your plan (L.yaml)" in r.stdout and "does not fit: 32 problem(s)" in r.stdout
    assert r.stdout.count("  - GPU ") == 10 and "... and 22 more (--json lists all)" in r.stdout
    assert "no best plan" in r.stdout
    r = runner.invoke(app, [*JOB_70B, "--evaluate", str(layout), "--json"])
    assert r.exit_code == 2 and r.stderr == plain.stderr, r.output
    out = json.loads(r.stdout)
    assert out["fits"] is False and len(out["problems"]) == 32
    assert out["best_step_latency_s"] is None
    assert any(n.startswith("no best plan: ") and "no plan fits 32 GPUs" in n
               for n in out["notes"]), out["notes"]
    # the output still reads back as a plan
    again = tmp_path / "yours.json"
    again.write_text(r.stdout)
    assert runner.invoke(app, [*JOB_70B, "--evaluate", str(again), "--json"]).exit_code == 2


def test_evaluate_names_the_job_it_priced():
    plain = runner.invoke(app, BASE)
    header = plain.stdout.splitlines()[0]
    assert header.startswith("PPO llama-3.1-8b on 16 x h100-sxm-80gb"), header
    r = runner.invoke(app, [*BASE, "--evaluate", "examples/layouts/verl-colocated-8b.yaml"])
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    assert lines[0] == header and lines[1].startswith("your plan (verl-colocated-8b.yaml)")


def test_framework_verl_prints_verl_s_best_plan_its_overrides_and_the_planner_s_best():
    job = ["plan", "--model", "llama-3.1-8b", "--gpus", "12", "--response-len", "2048"]
    r = runner.invoke(app, [*job, "--framework", "verl"])
    assert r.exit_code == 0, r.output
    out = " ".join(r.stdout.split())
    assert "best plan in verl's space" in out
    # 12 GPUs split a batch of 512 evenly over no TP x DP: verl runs on one node of 8
    assert "trainer.nnodes=1" in out and "trainer.n_gpus_per_node=8" in out
    assert "actor_rollout_ref.rollout.tensor_model_parallel_size=" in out
    assert "the planner's best plan (any layout): " in out and "estimated" in out
    plan = json.loads(runner.invoke(app, [*job, "--framework", "verl", "--json"]).stdout)
    assert sorted({g for s in plan["stages"] for r in s["gpus"] for g in r}) == \
        list(range(8))


def test_framework_errors_are_one_line_and_exit_2():
    base = ["plan", "--model", "llama-3.1-8b", "--gpus", "16"]
    for args, says in ((["--framework", "openrlhf"], "error: --framework: unknown framework"),
                       (["--framework", "verl", "--execution", "async"],
                        "error: --framework: verl: "),
                       (["--framework", "verl", "--spread"], "error: --spread: cannot be")):
        r = runner.invoke(app, [*base, *args])
        lines = [ln for ln in r.output.splitlines() if ln.strip()]
        assert r.exit_code == 2 and len(lines) == 1 and lines[0].startswith(says), r.output


def test_an_uneven_split_is_marked_and_said():
    """On 12 GPUs generation runs dp=3 over 512 sequences: its b x a is the largest share, and
    the caption says how the batch splits (3 x 171 is not 512)."""
    r = runner.invoke(app, ["plan", "--config", "examples/llama-3.1-8b-ppo.yaml", "--gpus", "12"],
                      terminal_width=200)
    assert r.exit_code == 0, r.output
    assert "171x1*" in r.output
    assert "actor_gen splits 512 sequences over dp=3, 2 replicas 171 and the rest 170" \
        in " ".join(r.output.split())
    r = runner.invoke(app, ["plan", "--config", "examples/llama-3.1-8b-ppo.yaml"],
                      terminal_width=200)
    assert r.exit_code == 0 and "largest replica" not in r.output  # 16 GPUs: even shares
    r = runner.invoke(app, ["plan", "--config", "examples/llama-3.1-8b-ppo.yaml", "--gpus", "12",
                            "--frontier", "reference_infer"], terminal_width=200)
    assert r.exit_code == 0, r.output
    assert "1x86*" in r.output and "1x64*" not in r.output  # dp 6 uneven, dp 8 even
    assert "where dp does not divide the 512 sequences" in " ".join(r.output.split())


def test_a_plan_the_search_did_not_prove_the_fastest_says_so(tmp_path):
    """On stdout in the table, on stderr with --json (stdout stays a plan file)."""
    cfg = tmp_path / "holes.yaml"
    cfg.write_text("model: llama-3.1-8b\nalgo: remax\nexecution: async\n"
                   "gpus: [0, 2, 4, 8, 9, 11, 13, 17, 19, 22, 24, 26, 30, 31]\n")
    r = runner.invoke(app, ["plan", "--config", str(cfg)], terminal_width=400)
    assert r.exit_code == 0, r.output
    assert "note: the fastest plan found, not proven the fastest" in r.stdout
    r = runner.invoke(app, ["plan", "--config", str(cfg), "--json"])
    assert r.exit_code == 0, r.output
    json.loads(r.stdout)
    assert r.stderr.startswith("note: the fastest plan found, not proven the fastest")
    r = runner.invoke(app, ["plan", "--model", "llama-3.1-8b", "--gpus", "16"])
    assert r.exit_code == 0 and "not proven" not in r.output


def test_exhaustive_searches_until_the_plan_is_proven(tmp_path):
    """The note says how to get the proof; --exhaustive lifts the cap (about 2 s here), and
    the same plan comes out, proven, with no note. A search it cannot change is refused."""
    cfg = tmp_path / "holes.yaml"
    cfg.write_text("model: llama-3.1-8b\nalgo: remax\nexecution: async\n"
                   "gpus: [0, 2, 4, 8, 9, 11, 13, 17, 19, 22, 24, 26, 30, 31]\n")
    capped = runner.invoke(app, ["plan", "--config", str(cfg), "--json"])
    assert capped.exit_code == 0, capped.output
    assert "--exhaustive searches on until it is proven" in capped.stderr
    assert capped.stderr.count("\n") == 1  # one line, whatever the width, for a script
    r = runner.invoke(app, ["plan", "--config", str(cfg), "--json", "--exhaustive"])
    assert r.exit_code == 0, r.output
    assert r.stderr == ""
    assert json.loads(r.stdout)["step_latency_s"] == json.loads(capped.stdout)["step_latency_s"]
    r = runner.invoke(app, ["plan", "--config", str(cfg), "--exhaustive", "--frontier",
                            "actor_train"])
    assert r.exit_code == 2
    assert r.output.count("\n") == 1 and "--exhaustive" in r.output


def test_the_note_names_only_what_can_stop_the_search_it_ran():
    """With --exhaustive only combinations that do not place can stop the search: the note
    names that alone and does not offer --exhaustive again (reviewer's finding: it blamed
    the wrong limit, built by editing the capped note's text)."""
    from dataclasses import replace

    from nereus.commands.plan import _unproven
    from nereus.plan.search import MAX_REPLACEMENTS, MAX_REPRICED, best_plan
    from nereus.spec import parse_job

    plan = replace(best_plan(parse_job({"model": "llama-3.1-8b", "gpus": 16})), proven=False)
    capped, exhaustive = _unproven(plan), _unproven(plan, exhaustive=True)
    assert capped is not None and exhaustive is not None
    assert f"after {MAX_REPRICED} plans placed dearer" in capped and "--exhaustive" in capped
    assert exhaustive.endswith(f"(after {MAX_REPLACEMENTS} combinations that did not place)")
    assert "--exhaustive" not in exhaustive
    assert _unproven(replace(plan, proven=True), exhaustive=True) is None
