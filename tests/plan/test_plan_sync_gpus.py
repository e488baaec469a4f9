"""The search under a weight sync whose price depends on how many GPUs actor training uses
(generation GPUs beyond them hold no training shard): it stays exact, and it looks past the
fastest training phase when more training GPUs make the sync cheaper."""

import math
import random
from dataclasses import replace

import pytest

from nereus.cost.candidate import Candidate, Layout
from nereus.cost.efficiency import Efficiencies
from nereus.cost.model import CostModel
from nereus.cost.ops import OpClass
from nereus.errors import InfeasibleError
from nereus.plan.bruteforce import brute_force_latency
from nereus.plan.candidates import enumerate_candidates
from nereus.plan.evaluate import StageLayoutSpec, evaluate_plan
from nereus.plan.placement import GroupAssignment, place_phase
from nereus.plan.search import Planner
from nereus.plan.types import weight_sync_estimate
from nereus.spec import parse_job

from plan_testlib import searched_latency


def _tiny_ppo(per_node: int = 2, stages=("actor_gen", "actor_train", "critic_train"), **work):
    job = parse_job({"model": "tiny-qwen3", "algo": "ppo", "execution": "sync", "gpus": 4,
                     "cluster": {"device": "cpu", "devices_per_node": per_node,
                                 "device_memory_gib": 0.2},
                     "workload": {"prompts_per_step": 4, "responses_per_prompt": 2,
                                  "prompt_len": 16, "response_len": 1024, "ppo_mini_batches": 2,
                                  **work}})
    wf = job.workflow
    return replace(job, workflow=replace(wf, stages=tuple(s for s in wf.stages
                                                          if s.name in stages)))


SLOW_NETWORK = Efficiencies({OpClass.ALLGATHER_INTER: 1e-4, OpClass.ALLGATHER_INTRA: 1e-2})


def test_search_moves_training_onto_every_generation_gpu_when_the_sync_would_cross_nodes():
    """Two nodes of 2 CPU slots, a slow network. The fastest training phase runs actor and
    critic side by side on 2 slots each (0.628 s); generation runs on all 4. Priced as if
    colocated, that plan's sync was free (same layouts); in truth the second node's generation
    slots hold no actor shard and pull the whole model over the network. The exact plan runs
    actor and critic training one after another on all 4 slots, so every generation slot holds
    its shard, as brute force confirms."""
    job = _tiny_ppo()
    cost = CostModel(job, SLOW_NETWORK)
    plan = Planner(job, cost=cost).best_placed()
    gen, train = plan.stage("actor_gen").candidate, plan.stage("actor_train").candidate
    assert train.gpus >= gen.gpus == 4
    assert plan.terms["weight_sync"] == cost.weight_sync(train, gen).latency_s == 0.0
    assert plan.step_latency_s == pytest.approx(brute_force_latency(job, cost), rel=1e-9)
    # the plan the search used to pick: actor_train on one node, generation on both
    half = Candidate(train.layout, 2, 1, 2)
    assert cost.sync_receivers(half.gpus, gen.gpus).off_node == 2
    assert cost.weight_sync(half, gen).latency_s > 0.05


def test_planned_and_evaluated_plans_price_the_sync_alike():
    """PPO on 2 x 8 H100s (the plan once put generation on 16 GPUs and actor training on 8 and
    priced the sync as colocated): the plan's sync term is the sync of its two candidates, and
    evaluating the same layout gives the same step."""
    job = parse_job({"model": "llama-3.1-8b", "algo": "ppo", "gpus": 16,
                     "cluster": {"devices_per_node": 8},
                     "workload": {"response_len": 1024, "prompts_per_step": 64}})
    cost = CostModel(job)
    plan = Planner(job, cost=cost).best_placed()
    gen, train = plan.stage("actor_gen").candidate, plan.stage("actor_train").candidate
    assert plan.terms["weight_sync"] == pytest.approx(cost.weight_sync(train, gen).latency_s,
                                                      rel=1e-12)
    specs = {sp.stage: StageLayoutSpec(sp.tp, sp.pp, sp.dp, sp.replicas,
                                       sp.candidate.micro_batch, sp.candidate.grad_accum,
                                       sp.candidate.recompute) for sp in plan.stages}
    again = evaluate_plan(job, specs, cost)
    assert again.terms["weight_sync"] == pytest.approx(plan.terms["weight_sync"], rel=1e-12)
    # the old choice, generation tp=4 dp=4 beside actor training on one node, now pays the
    # network for the second node
    old = cost.weight_sync(Candidate(Layout(4, 2), 1, 1, 16), Candidate(Layout(4, 1), 4, 16, 1))
    assert old.latency_s > 0.1


def _random_sync_job(rng: random.Random):
    stage_sets = [("actor_gen", "actor_train", "critic_train"),
                  ("actor_gen", "critic_infer", "actor_train", "critic_train"),
                  ("actor_gen", "reference_infer", "actor_train")]
    job = _tiny_ppo(per_node=rng.choice([1, 2, 4]), stages=rng.choice(stage_sets),
                    prompts_per_step=rng.choice([2, 4]),
                    responses_per_prompt=rng.choice([1, 2]),
                    response_len=rng.choice([256, 1024]))
    gpus = rng.choice([2, 3, 4])
    # any GPUs may be gone, so any node may be partly used (the receivers' node counts)
    pool = job.pool.without(rng.sample(list(job.pool.ids), len(job.pool.ids) - gpus))
    eff = Efficiencies({OpClass.ALLGATHER_INTER: rng.choice([1e-2, 1e-3, 1e-4]),
                        OpClass.ALLGATHER_INTRA: rng.choice([1e-1, 1e-2, 1e-3])})
    return replace(job, pool=pool), eff


@pytest.mark.parametrize("seed,count", [pytest.param(5, 20, marks=pytest.mark.slow), (11, 4)])
def test_search_equals_brute_force_when_the_sync_depends_on_training_gpus(seed, count):
    rng = random.Random(seed)
    cases = 0
    while cases < count:
        job, eff = _random_sync_job(rng)
        cost = CostModel(job, eff)
        combos = math.prod(max(1, len(enumerate_candidates(cost, s, job.pool.size)))
                           for s in job.workflow.stages)
        if combos > 20_000:
            continue
        expected = brute_force_latency(job, cost)
        try:
            got = searched_latency(job, Planner(job, cost=CostModel(job, eff)).best_placed(), cost)
        except InfeasibleError:
            got = math.inf
        cases += 1
        assert (got == expected == math.inf) or got == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("model,algo,gpus,length", [
    ("llama-3.1-8b", "ppo", 12, 2048), ("llama-3.1-8b", "ppo", 20, 2048),
    ("llama-3.1-8b", "ppo", 24, 2048), ("llama-3.1-8b", "ppo", 48, 8192),
    ("qwen3-14b", "grpo", 20, 512)])
def test_generation_is_placed_on_the_training_gpus_first(model, algo, gpus, length):
    """On nodes of 8 (20 GPUs: 8, 8 and 4), the placed receivers are the ones the search
    priced: training on the pool's fullest nodes, generation on training's GPUs first. 8B PPO
    on 24 GPUs once put actor training on GPUs 8-23 and generation on 0-15, so half the
    generation GPUs pulled their shard over the network while the plan was priced as if they
    held it; Qwen3-14B GRPO on 20 put actor training on the 4-GPU node, so 4 of 16 generation
    GPUs held no shard."""
    job = parse_job({"model": model, "algo": algo, "gpus": gpus,
                     "workload": {"response_len": length, "response_len_max": length}})
    cost = CostModel(job)
    plan = Planner(job, cost=cost).best_placed()  # packed, as the search priced it (``best``
    t, g = plan.stage("actor_train"), plan.stage("actor_gen")  # may take the spread plan)
    tr = {i for r in t.replicas for i in r}
    ge = {i for r in g.replicas for i in r}
    assert tr <= ge or ge <= tr
    assert cost.placed_sync_receivers(t.replicas, g.replicas) == \
        cost.sync_receivers(len(tr), len(ge))
    assert plan.terms["weight_sync"] == cost.weight_sync(t.candidate, g.candidate).latency_s


def test_a_spread_plan_prices_its_sync_as_placed():
    """8B PPO on 2 x 8 GPUs with replicas spread over nodes: actor training sits on 4 GPUs of
    each node, so the 8 generation GPUs beyond it share a node with training GPUs (the node's
    fabric), where the count model, with training on one node, said the network. The plan's
    sync term and step latency are the placed sync's."""
    job = parse_job({"model": "llama-3.1-8b", "algo": "ppo", "gpus": 16,
                     "workload": {"response_len": 2048, "response_len_max": 2048}})
    cost = CostModel(job)
    plan = Planner(job, cost=cost, spread=True).best()
    t, g = plan.stage("actor_train"), plan.stage("actor_gen")
    assert cost.placed_sync_receivers(t.replicas, g.replicas) == (8, 8, 0)
    assert cost.sync_receivers(t.candidate.gpus, g.candidate.gpus) == (8, 0, 8)
    sync = weight_sync_estimate(cost, t, g).latency_s
    counted = cost.weight_sync(t.candidate, g.candidate).latency_s
    assert plan.terms["weight_sync"] == sync < counted
    assert plan.step_latency_s == pytest.approx(searched_latency(job, plan, cost) + sync
                                                - counted, rel=1e-12)


def test_placement_takes_the_preferred_gpus_first_and_then_their_nodes():
    """Training on GPUs 4-7 and 8-11 of three nodes of 8: generation of 12 GPUs (chunks of 4)
    takes those 8 first, then 4 more on their nodes (best fit: node 0), none on the third;
    without a preference, best fit from GPU 0."""
    job = parse_job({"model": "llama-3.1-8b", "algo": "ppo", "gpus": 24})
    gen = [GroupAssignment(("actor_gen",), (Candidate(Layout(4, 1), 3, 1, 1),))]
    prefer = {"actor_gen": (4, 5, 6, 7, 8, 9, 10, 11)}
    assert place_phase(job.pool, gen, prefer=prefer)["actor_gen"] == \
        [(4, 5, 6, 7), (8, 9, 10, 11), (0, 1, 2, 3)]
    assert place_phase(job.pool, gen)["actor_gen"] == [(0, 1, 2, 3), (4, 5, 6, 7), (8, 9, 10, 11)]


def test_a_plan_prices_its_sync_from_the_positions_its_gpus_hold():
    """Training and generation both tp=4 on the same GPUs: laid in rank order each GPU trains
    the TP slice it generates, and the sync moves nothing; with each training replica reversed
    (a plan from a file, a kept order) GPU 3 trains slice 0 and generates slice 3, so every
    GPU receives its whole shard. The plan was priced as if laid in rank order (0 s)."""
    job = parse_job({"model": "llama-3.1-8b", "algo": "ppo", "gpus": 8,
                     "cluster": {"devices_per_node": 8}})
    lay = {"actor_gen": (4, 1, 2), "actor_train": (4, 1, 2), "critic_train": (4, 1, 2),
           "reference_infer": (4, 1, 2), "reward_infer": (4, 1, 2), "critic_infer": (4, 1, 2)}
    ordered = ((0, 1, 2, 3), (4, 5, 6, 7))
    flipped = tuple(r[::-1] for r in ordered)
    cost = CostModel(job)

    def sync(train):
        specs = {s: StageLayoutSpec(*v, ordered if s != "actor_train" else train)
                 for s, v in lay.items()}
        plan = evaluate_plan(job, specs, cost=cost)
        return plan.terms["weight_sync"], weight_sync_estimate(
            cost, plan.stage("actor_train"), plan.stage("actor_gen"))

    same, _ = sync(ordered)
    moved, est = sync(flipped)
    assert same == 0.0
    whole = cost.weight_sync_parts(Layout(4, 1), Layout(4, 1), overlap=0.0)[0]
    assert moved == pytest.approx(whole.latency_s, rel=1e-12) and moved > 0
    assert est.latency_s == moved
