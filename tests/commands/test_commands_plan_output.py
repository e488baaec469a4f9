"""What ``nereus plan`` prints: no speed ratio against a plan that does not fit, node-loss
lines grouped by node, '1 node'."""

from pathlib import Path

import yaml
from typer.testing import CliRunner

from nereus.cli import app

runner = CliRunner()
CONFIG = "examples/llama-3.1-8b-ppo.yaml"
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
    assert "frontier (--spread: two or more replicas" in " ".join(r.stdout.split())


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
    """The weight sync's block ended in a bare 'memory per GPU:' (it holds no memory of its
    own) under a header with a fake candidate 'b=1 a=1' and 'peak 0.00 GiB'."""
    for extra in ([], ["--evaluate", "examples/layouts/verl-colocated-8b.yaml"]):
        r = runner.invoke(app, ["plan", "--config", CONFIG, "--explain", *extra])
        assert r.exit_code == 0, r.output
        assert _empty_sections(r.stdout) == [], _empty_sections(r.stdout)
        sync = [ln for ln in r.stdout.splitlines() if ln.startswith("weight sync ")]
        assert len(sync) == 1 and "actor_train [tp=" in sync[0], sync
        assert "(estimated)" in sync[0] and "peak" not in sync[0] and "b=1" not in sync[0]
        block = r.stdout.split(sync[0], 1)[1]
        assert "memory per GPU: no buffer of its own (estimated)" in " ".join(block.split())
