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
    assert all(a["latency_s"] > b["latency_s"] for a, b in zip(rows, rows[1:]))


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
    r = runner.invoke(app, [*BASE, "--devices-per-node", "8", "--gpus", "24"])
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
