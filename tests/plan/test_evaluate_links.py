"""A layout's GPU ids decide which links its collectives use (``nereus plan --evaluate``)."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from nereus.cli import app
from nereus.cost.model import CostModel
from nereus.plan.evaluate import StageLayoutSpec, evaluate_plan, layout_spec_from_data
from nereus.plan.search import Planner
from nereus.plan.types import Plan, idle_bytes, stage_estimate
from nereus.spec.job import load_job
from nereus.spec.workflow import StageKind

EXAMPLES = sorted(p.name for p in Path("examples").glob("*.yaml"))
JOB = load_job("examples/llama-3.1-8b-ppo.yaml")  # 16 GPUs, 2 nodes x 8
LAYOUT = {"actor_gen": {"tp": 2, "pp": 1, "dp": 8},
          "reference_infer": {"tp": 1, "pp": 1, "dp": 16},
          "reward_infer": {"tp": 1, "pp": 1, "dp": 16}, "critic_infer": {"tp": 1, "pp": 1, "dp": 16},
          "actor_train": {"tp": 4, "pp": 1, "dp": 4, "micro_batch": 2},
          "critic_train": {"tp": 4, "pp": 2, "dp": 2}}
ALIGNED = [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]]
SHIFTED = [[2, 3, 4, 5], [6, 7, 8, 9], [10, 11, 12, 13], [14, 15, 0, 1]]  # 2 TP groups across


def _layout(actor_train_gpus: list[list[int]] | None) -> dict[str, StageLayoutSpec]:
    data = {k: dict(v) for k, v in LAYOUT.items()}
    if actor_train_gpus is not None:
        data["actor_train"]["gpus"] = actor_train_gpus
    return layout_spec_from_data(data)


def _sized(cost: CostModel, plan: Plan, stage: str) -> float:
    """The stage as the cost model prices it from sizes alone (how every plan was priced)."""
    sp = plan.stage(stage)
    return cost.estimate(stage, sp.candidate, idle_bytes(cost, plan, stage)).latency_s


def test_a_tp_group_across_nodes_is_priced_on_the_network():
    cost = CostModel(JOB)
    aligned = evaluate_plan(JOB, _layout(ALIGNED), cost)
    shifted = evaluate_plan(JOB, _layout(SHIFTED), cost)
    a, s = aligned.stage("actor_train"), shifted.stage("actor_train")
    assert a.candidate == s.candidate
    ea, es = stage_estimate(cost, aligned, "actor_train"), stage_estimate(cost, shifted,
                                                                          "actor_train")
    # the TP all-reduces, and only they, move to the network
    assert {k: v for k, v in es.terms.items() if k != "tp_comm"} == pytest.approx(
        {k: v for k, v in ea.terms.items() if k != "tp_comm"})
    assert es.terms["tp_comm"] - ea.terms["tp_comm"] == pytest.approx(
        s.latency_s - a.latency_s)
    assert s.latency_s > a.latency_s + 1.0
    # the weight sync gathers from training replicas that span nodes
    assert shifted.terms["weight_sync"] > aligned.terms["weight_sync"]
    assert shifted.step_latency_s > aligned.step_latency_s
    # the estimate and --explain agree with the plan's table, and the plan says why
    assert es.latency_s == s.latency_s
    assert any("TP group [6, 7, 8, 9] across nodes" in n for n in shifted.notes)
    assert any(n.startswith("weight sync:") for n in shifted.notes)
    assert aligned.notes == ()


def test_a_layout_without_gpu_ids_prices_as_before():
    """Without ids (and with ids where the default placement puts them) nothing changes."""
    cost = CostModel(JOB)
    bare = evaluate_plan(JOB, _layout(None), cost)
    assert bare.notes == () and not any(sp.as_placed for sp in bare.stages)
    for sp in bare.stages:
        assert sp.latency_s == _sized(cost, bare, sp.stage)
    same = evaluate_plan(JOB, _layout(ALIGNED), cost)  # the ids the default gives
    assert same.stage("actor_train").as_placed
    assert [sp.latency_s for sp in same.stages] == [sp.latency_s for sp in bare.stages]
    assert same.step_latency_s == bare.step_latency_s and same.terms == bare.terms


def test_layouts_built_in_code_keep_pricing_by_sizes():
    """The planner's plans placed again (``plan.near``, the controller's targets) give GPU ids
    in code: they price as the search does, spanning or not."""
    cost = CostModel(JOB)
    specs = _layout(None)
    specs["actor_train"] = StageLayoutSpec(4, 1, 4, tuple(map(tuple, SHIFTED)), 2)
    plan = evaluate_plan(JOB, specs, cost)
    assert not plan.stage("actor_train").as_placed and plan.notes == ()
    assert plan.stage("actor_train").latency_s == _sized(cost, plan, "actor_train")


@pytest.mark.parametrize("example", EXAMPLES)
def test_the_planners_plans_price_exactly_as_before(example):
    """The search prices by sizes (no ``Links``), and its plan read back as a layout file,
    GPU ids and all, prices bit for bit the same."""
    job = load_job(f"examples/{example}")
    cost = CostModel(job)
    best = Planner(job, cost=cost).best()
    assert best.notes == () and not any(sp.as_placed for sp in best.stages)
    for sp in best.stages:
        assert sp.latency_s == _sized(cost, best, sp.stage)
    again = evaluate_plan(job, layout_spec_from_data(best.to_dict()), cost)
    assert all(sp.as_placed for sp in again.stages)
    assert again.step_latency_s == best.step_latency_s
    assert [sp.latency_s for sp in again.stages] == [sp.latency_s for sp in best.stages]
    # the search sums a phase's stages in its own order: the last bit may differ
    assert again.terms == pytest.approx(best.terms, rel=1e-12)


def test_dp_groups_across_nodes_keep_the_planners_price_and_say_so():
    """The 8B PPO best plan trains two 4-GPU replicas on two nodes, priced (by sizes) on the
    node fabric; read back, it keeps that price and notes what the network would add."""
    cost = CostModel(JOB)
    best = Planner(JOB, cost=cost).best()
    again = evaluate_plan(JOB, layout_spec_from_data(best.to_dict()), cost)
    assert again.step_latency_s == best.step_latency_s
    spans = {sp.stage for sp in best.stages
             if JOB.workflow.stage(sp.stage).kind is StageKind.TRAIN and sp.dp > 1
             and not JOB.cluster.same_node([r[0] for r in sp.replicas])}
    noted = {n.split(":")[0] for n in again.notes if "DP group" in n}
    assert spans and noted == spans
    assert all("more over the network" in n for n in again.notes if "DP group" in n)


def test_evaluate_prints_and_writes_the_notes(tmp_path):
    layout = {k: dict(v) for k, v in LAYOUT.items()}
    layout["actor_train"]["gpus"] = SHIFTED
    path = tmp_path / "x.json"
    path.write_text(json.dumps(layout))
    base = ["plan", "--config", "examples/llama-3.1-8b-ppo.yaml", "--evaluate", str(path)]
    r = CliRunner().invoke(app, base)
    assert r.exit_code == 0, r.output
    assert "note: actor_train: priced on the links its GPU ids use" in " ".join(r.stdout.split())
    r = CliRunner().invoke(app, [*base, "--json"])
    out = json.loads(r.stdout)
    assert any("TP group [6, 7, 8, 9]" in n for n in out["notes"])
    # the verdict, notes included, reads back as a plan file
    again = tmp_path / "again.json"
    again.write_text(r.stdout)
    r2 = CliRunner().invoke(app, [*base[:-1], str(again), "--json"])
    assert r2.exit_code == 0, r2.output
    assert json.loads(r2.stdout)["step_latency_s"] == out["step_latency_s"]
