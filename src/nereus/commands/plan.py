"""``nereus plan``: the fastest plan that fits, where its time and memory go, and how a user's
current plan compares."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from nereus.commands.common import (
    Command,
    FitTable,
    console,
    err_console,
    one_line_errors,
    refuse_together,
)
from nereus.commands.jobopts import JOB_HELP, job_and_fields_from_options
from nereus.commands.planfile import (
    check_record,
    job_shaped,
    output_kind,
    split_record,
    with_record,
)
from nereus.cost.calibrate import Calibrator
from nereus.cost.estimate import HEADROOM
from nereus.cost.model import CostModel
from nereus.errors import InfeasibleError, InputError, count
from nereus.plan.candidates import frontier
from nereus.plan.evaluate import (
    PLAN_FILES,
    StageLayoutSpec,
    evaluate_plan,
    layout_spec_from_data,
    read_plan_file,
)
from nereus.plan.exposure import exposed_by_node, spans_nodes
from nereus.plan.frameworks import best_verl_plan, verl_overrides
from nereus.plan.search import MAX_REPLACEMENTS, MAX_REPRICED, Planner, ReplicaExceedsNode
from nereus.plan.types import Plan, stage_estimate, weight_sync_estimate
from nereus.plan.validate import validate_plan
from nereus.spec.cluster import gpu_ranges
from nereus.spec.device import DEVICE_PRESETS, gib
from nereus.spec.job import JobSpec
from nereus.spec.workflow import Execution

GiB = 1024**3


def pool_nodes(job: JobSpec) -> str:
    """'2 nodes x 8' when the pool fills its nodes; '6 nodes of up to 3' when it does not
    (16 GPUs on nodes of 3: 'x 3' would read as 18)."""
    per = job.cluster.devices_per_node
    counts: dict[int, int] = {}
    for g in job.pool.ids:
        counts[g // per] = counts.get(g // per, 0) + 1
    n = len(counts)
    nodes = f"{n} node{'s' if n != 1 else ''}"
    if all(c == per for c in counts.values()):
        return f"{nodes} x {per}"
    return f"{nodes} of up to {per}"


def plan_table(job: JobSpec, plan: Plan, title: str) -> Table:
    """One row per model-stage; stages with the same group letter share GPUs and take turns.
    Peak memory is shown against the limit plans are held to (``HEADROOM`` of the device's
    memory), not the device's memory, which a peak near it would seem to fit; the caption
    says what the letters and the limit are."""
    mem = job.cluster.device.memory_bytes
    limit = HEADROOM * mem
    letters = {name: chr(ord("A") + i) for i, g in enumerate(plan.groups) for name in g}
    # a generation or forward stage whose dp does not divide its batch: b x a is the largest
    # replica's share, and the caption says how the batch splits (3 x 171 is not 512)
    cost = CostModel(job)
    uneven = {}
    for sp in plan.stages:
        batch, dp = cost.stage_batch(sp.stage), sp.candidate.dp
        if batch % dp:
            per, more = divmod(batch, dp)
            uneven[sp.stage] = (f"{sp.stage} splits {batch} sequences over dp={dp}, "
                                f"{count(more, 'replica')} {per + 1} and the rest {per}")
    split = f"; *: the largest replica's share ({'; '.join(uneven.values())})" if uneven \
        else ""
    t = FitTable(title=f"{title} (latency and memory estimated)", title_justify="left",
                 fold=("model-stage", "phase", "GPUs"),
                 caption=f"shares: model-stages of a phase with the same letter run one after "
                         f"another on the same GPUs (-: on GPUs of its own in its phase); "
                         f"limit: {HEADROOM * 100:.0f} % of {gib(mem)} per GPU{split}",
                 caption_justify="left")
    for col in ("model-stage", "phase", "tp", "pp", "dp", "b x a", "recomp", "GPUs", "shares",
                "latency s", "peak/limit GiB"):
        t.add_column(col, justify="right" if col in ("tp", "pp", "dp", "latency s") else "left",
                     no_wrap=True)
    for sp in plan.stages:
        c = sp.candidate
        t.add_row(sp.stage, job.workflow.stage(sp.stage).phase.value, str(c.tp), str(c.pp),
                  str(c.dp), f"{c.micro_batch}x{c.grad_accum}{'*' if sp.stage in uneven else ''}",
                  "yes" if c.recompute else "no",
                  gpu_ranges(sp.gpus), letters.get(sp.stage, "-"), f"{sp.latency_s:.3f}",
                  f"{sp.peak_mem_bytes / GiB:.1f}/{limit / GiB:.1f}")
    return t


def _summary(plan: Plan, job: JobSpec) -> str:
    """The step latency and how its terms make it: added one after another, or, asynchronous,
    generation beside inference and training (the longer side) and then the weight sync."""
    t = plan.terms
    if job.workflow.execution is Execution.ASYNC and "generation" in t:
        rest = " + ".join(f"{k} {t[k]:.3f}" for k in ("inference", "training") if k in t)
        how = f"max(generation {t['generation']:.3f}, {rest or '0'})"
        how += "".join(f" + {k} {v:.3f}" for k, v in t.items()
                       if k not in ("generation", "inference", "training"))
        return f"step latency {plan.step_latency_s:.3f} s (estimated) = {how} s (asynchronous)"
    parts = ", ".join(f"{k} {v:.3f} s" for k, v in t.items())
    return f"step latency {plan.step_latency_s:.3f} s (estimated): {parts}"


UNPROVEN = ("note: the fastest plan found, not proven the fastest: on this pool of partly "
            "filled nodes the search stopped before its bound ruled out a faster placement")


def _best(job: JobSpec, cost: CostModel, spread: bool, exhaustive: bool) -> Plan:
    """``Planner.best``; an exhaustive search shows a spinner to a person watching (stderr a
    terminal; nothing at all otherwise, so the one-line output rules hold)."""
    watched = exhaustive and err_console.is_terminal
    with (err_console.status("searching until the plan is proven the fastest ...")
          if watched else nullcontext()):
        return Planner(job, cost=cost, spread=spread, exhaustive=exhaustive).best()


def _unproven(plan: Plan, exhaustive: bool = False) -> str | None:
    """The note for a plan the search did not prove the fastest of its space, else None:
    why the search stopped and, without ``exhaustive``, how to search on."""
    if plan.proven:
        return None
    unplaced = f"{MAX_REPLACEMENTS} combinations that did not place"
    if exhaustive:  # only the combinations that did not place can stop it
        return f"{UNPROVEN} (after {unplaced})"
    return (f"{UNPROVEN} (after {MAX_REPRICED} plans placed dearer than it priced them, or "
            f"{unplaced}); --exhaustive searches on until it is proven (it may take minutes)")


def _comparison(yours: Plan, best: Plan, problems: list[str]) -> str:
    """The best plan's speed against the user's; no ratio against a plan that does not fit
    (it may look faster because it uses GPUs the pool does not have or memory it lacks)."""
    yours_s, best_s = yours.step_latency_s, best.step_latency_s
    if problems:
        return (f"best plan: {best_s:.3f} s per step (estimated); yours does not fit, so its "
                f"{yours_s:.3f} s is no comparison")
    if yours_s < best_s:
        # the search ranks by its count model of the weight sync (training on the pool's
        # fullest nodes); a placement of the user's can sync over cheaper links
        why = ""
        if yours.terms.get("weight_sync", 0.0) < best.terms.get("weight_sync", 0.0):
            why = (f"; its weight sync takes {yours.terms['weight_sync']:.3f} s against "
                   f"{best.terms['weight_sync']:.3f} s: the search prices the sync with "
                   "training packed on the pool's fullest nodes, and your placement syncs over "
                   "cheaper links")
        return (f"your plan is {(best_s / yours_s - 1) * 100:.2f} % faster per step than the "
                f"best plan found ({yours_s:.3f} s against {best_s:.3f} s, estimated){why}")
    if yours_s <= best_s * (1 + 1e-9):
        return f"your plan is as fast as the best plan found ({best_s:.3f} s per step, estimated)"
    if yours_s < best_s * 1.005:  # "1.00x" would hide it
        return (f"the best plan is {(yours_s / best_s - 1) * 100:.2f} % faster per step than "
                f"yours ({best_s:.3f} s against {yours_s:.3f} s, estimated)")
    return f"best plan: {yours_s / best_s:.2f}x the speed of yours per step (estimated)"


def _takes(hit: Mapping[int, Any]) -> str:
    """``{8: [critic_train], 9: [critic_train], 3: [actor_gen]}`` -> 'nodes 8-9 take
    critic_train; node 3 takes actor_gen': one clause per set of model-stages (a 70B plan can
    lose the same stage with any of eight nodes)."""
    by: dict[tuple[str, ...], list[int]] = {}
    for n, stages in hit.items():
        by.setdefault(tuple(stages), []).append(n)
    out = []
    for stages, nodes in by.items():
        verb = "takes" if len(nodes) == 1 else "take"
        out.append(f"node{'s' if len(nodes) > 1 else ''} {gpu_ranges(nodes)} {verb} "
                   f"{', '.join(stages)}")
    return "; ".join(out)


# where the search for the smallest pool that fits a job gives up (GPUs)
MAX_SUGGESTED_GPUS = 1024


def smallest_pool(n: int, fits: Callable[[int], bool | None],
                  limit: int = MAX_SUGGESTED_GPUS) -> int | None:
    """The fewest GPUs above ``n`` (which do not fit) that ``fits``: doubling, then halving
    the gap, taking a pool that fits to fit with more GPUs too (it offers every layout of the
    smaller one). ``fits`` says None for a pool the cluster cannot hold: the counts from there
    up are out of reach, and the search halves back below it. None where nothing fits up to
    ``limit`` or the cluster's size."""
    lo, cap = n, limit + 1  # lo: too few GPUs; cap: out of reach
    hi = None
    k = min(2 * max(1, n), limit)
    while hi is None:
        if k <= lo:
            return None  # no count left between what is too few and what is out of reach
        ok = fits(k)
        if ok is None:
            cap, k = k, (lo + k) // 2
        elif ok:
            hi = k
        else:
            lo, k = k, min(2 * k, cap - 1)
    while hi - lo > 1:  # every count below hi is within reach
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if fits(mid) else (mid, hi)
    return hi


def no_plan_error(e: InfeasibleError, job: JobSpec, fields: Mapping[str, Any],
                  config: Path | None, options: Mapping[str, Any], profile: Path | None,
                  spread: bool) -> Exception:
    """The one-line error for a job the planner finds no plan for (``e``), naming the option
    or field that would fix it and what it allows: ``--spread`` where no pool can spread a
    replica that spans more than a node; else the pool size, with the fewest GPUs where the
    planner finds a plan (:func:`smallest_pool`); else, where no pool up to
    ``MAX_SUGGESTED_GPUS`` (or up to what the config's ``cluster.nodes`` hold) fits, that field
    or the device's memory. ``fields``: the job's fields as read (the config's, with the
    options in place); ``options``: the job's options, by parameter name. A pool of GPU ids the
    config lists keeps ``e``: which ids to add is the user's choice."""
    if isinstance(e, ReplicaExceedsNode):  # more GPUs do not help: say so before looking
        return InputError("--spread", str(e), f"no --spread for this job: it needs a replica "
                          f"of every model-stage inside one node of {e.node_gpus} GPUs (a "
                          "device with more memory per GPU makes replicas smaller)")
    if job.pool.ids != tuple(range(job.pool.size)):
        return e
    capped = False  # the config's cluster.nodes hold fewer GPUs than the search would try

    def fits(k: int) -> bool | None:
        nonlocal capped
        try:
            bigger, _ = job_and_fields_from_options(config, **{**options, "gpus": k})
        except InputError:
            capped = True
            return None  # the config's cluster does not hold k GPUs
        try:
            Planner(bigger, cost=cost_model(bigger, profile), spread=spread).best()
        except ReplicaExceedsNode:
            raise  # a pool with memory enough still cannot spread it: --spread is the problem
        except InfeasibleError:
            return False
        return True

    with err_console.status(f"no plan fits {count(job.pool.size, 'GPU')}: looking for the "
                            "fewest that fit ..."):
        try:
            k = smallest_pool(job.pool.size, fits)
        except ReplicaExceedsNode as outgrown:
            return no_plan_error(outgrown, job, fields, config, options, profile, spread)
    if k is not None:
        return InputError("--gpus" if options.get("gpus") is not None else "gpus", str(e),
                          f"at least {count(k, 'GPU')}, where the planner finds a plan "
                          "(estimated)")
    if capped:
        return InputError("cluster.nodes", f"{e}; no larger pool that the cluster's "
                          f"{count(job.cluster.num_nodes, 'node')} can hold fits either "
                          "(estimated)", "more nodes, or a device with more memory per GPU")
    device = job.cluster.device
    cluster = fields.get("cluster") or {}
    if cluster.get("device_memory_gib") is not None:  # it overrides every device's memory
        field = "cluster.device_memory_gib"
    elif options.get("device") is not None or config is None:
        field = "--device"
    else:
        field = "cluster.device"
    more = [name for name, d in DEVICE_PRESETS.items() if d.memory_bytes > device.memory_bytes]
    allowed = f"a device with more than {gib(device.memory_bytes)} per GPU"
    if field != "cluster.device_memory_gib" and more:
        allowed += f": {', '.join(more)}"
    return InputError(field, f"{e}; no pool of up to {MAX_SUGGESTED_GPUS:,} GPUs of "
                      f"{device.name} fits either (estimated)", allowed)


def job_header(job: JobSpec) -> str:
    """The job a plan is priced for, in one line: the best plan and a user's plan (--evaluate)
    are both read against it."""
    return (f"[bold]{job.workflow.algo_name}[/] {job.model.name} on "
            f"{job.pool.size} x {job.cluster.device.name} ({pool_nodes(job)}), "
            f"response {job.workload.response_len_mean} tokens (max "
            f"{job.workload.response_len_max}), {job.workflow.execution.value}"
            + (", rule reward" if job.workflow.reward == "rule" else ""))


# what --framework knows (nereus.plan.frameworks)
FRAMEWORKS = ("verl",)

# memory problems --evaluate lists in text; --json lists them all
MAX_PROBLEMS_SHOWN = 10


def cost_model(job: JobSpec, profile: Path | None) -> CostModel:
    """The cost model, with a profile's calibrated efficiencies and memory scale where given."""
    if profile is None:
        return CostModel(job)
    cal = Calibrator.from_profile(profile, job.cluster.device.name)
    return CostModel(job, cal.efficiencies(), cal.memory_scale())


def sync_explain(cost: CostModel, plan: Plan, train: str, gen: str) -> str:
    """The weight sync's breakdown. It is no model-stage and has no micro-batches, so its
    header names the two layouts instead of a candidate ``b=1 a=1``. Colocated, its memory is
    what the fullest GPU holds during it (``CostModel.weight_sync_memory``); asynchronous, it
    holds none of its own (the weights land in ``gen``'s parameters, counted in that stage's
    peak) and its memory line says so, instead of a peak of 0.00 GiB and an empty section."""
    t, g = plan.stage(train), plan.stage(gen)
    # as placed: the GPU ids say which generation GPUs hold no training shard, as the plan's
    # own weight_sync term prices them
    est = weight_sync_estimate(cost, t, g)
    lines = est.explain().splitlines()
    head = (f"weight sync {train} [tp={t.tp} pp={t.pp}] -> {gen} [tp={g.tp} pp={g.pp}]: "
            f"{est.latency_s:.3f} s per step ({est.source})")
    if any(est.memory.values()):  # a sync buffer of its own: the estimate lists it
        return "\n".join([head, *lines[1:]])
    body = [ln for ln in lines[1:] if ln != "  memory per GPU:"]
    notes = [ln for ln in body if ln.startswith("  note: ")]
    body = [ln for ln in body if not ln.startswith("  note: ")]
    body.append(f"  memory per GPU: no buffer of its own ({est.source}); the weights land in "
                f"{gen}'s parameters, counted in its peak above")
    return "\n".join([head, *body, *notes])


def layout_from_data(data: Any, field: str = "evaluate") -> dict[str, StageLayoutSpec]:
    """A parsed layout; every model-stage must say its dp, as a plan file does (a missing dp
    is not taken as 1: a layout that forgot it would be scored as another plan). A plan
    file's ``planned_for`` record is read past (the caller checks it where it matters);
    errors name ``field`` where the evaluate layer says ``evaluate``."""
    data, _ = split_record(data, field)
    with renamed_field(field):
        specs = layout_spec_from_data(data)  # checks the shape and every field first
    stages: Any = data.get("stages", data)
    prefix = f"{field}.stages" if "stages" in data else field
    entries = stages.items() if isinstance(stages, Mapping) else enumerate(stages)
    for key, raw in entries:
        if isinstance(raw, Mapping) and "dp" not in raw:
            raise InputError(f"{prefix}.{key}.dp", "required field is missing",
                             "an integer >= 1: the data-parallel replicas of the model-stage")
    return specs


def _check_stage_names(job: JobSpec, specs: Mapping[str, StageLayoutSpec]) -> None:
    """A layout's key that names no model-stage of the job (``actor_trian``), named itself
    before the model-stage it was meant for is reported missing."""
    names = [s.name for s in job.workflow.stages]
    extra = sorted(set(specs) - set(names))
    if not extra:
        return
    missing = [n for n in names if n not in specs]
    lacks = f"; the layout lacks {', '.join(missing)}" if missing else ""
    # a layout's key is the name; a plan file's stage (``evaluate.stages.0``) has a name field
    at = specs[extra[0]].where or f"evaluate.{extra[0]}"
    field = at if at.endswith(f".{extra[0]}") else f"{at}.name"
    raise InputError(field, f"not a model-stage of this job"
                     f"{job.workflow.absence(extra[0])}{lacks}", names)


@contextmanager
def renamed_field(field: str) -> Iterator[None]:
    """Errors of the evaluate layer (``evaluate.stages.3.tp``) named after ``field``
    (``current.stages.3.tp``) where a layout is read as something else."""
    try:
        yield
    except InputError as e:
        if field == "evaluate" or not (e.field == "evaluate" or e.field.startswith("evaluate.")):
            raise
        # the allowed text may name another stage of the same file (``evaluate.stages.0``)
        allowed = e.allowed and re.sub(r"\bevaluate\.(?=\w)", f"{field}.", e.allowed)
        raise InputError(field + e.field[len("evaluate"):], e.problem, allowed) from None


def register(app: typer.Typer) -> None:
    @app.command("plan", cls=Command)
    @one_line_errors
    def plan_cmd(
        # readable=False on every file: nereus.files says why one cannot be read, in one
        # line naming the option, where typer would say only that it "is not readable"
        config: Path | None = typer.Option(None, "--config", "-c", readable=False,
                                           help="job YAML (nereus examples writes some)"),
        model: str | None = typer.Option(None, help=JOB_HELP["model"]),
        algo: str | None = typer.Option(None, help=JOB_HELP["algo"]),
        execution: str | None = typer.Option(None, help=JOB_HELP["execution"]),
        reward: str | None = typer.Option(None, help=JOB_HELP["reward"]),
        gpus: int | None = typer.Option(None, help=JOB_HELP["gpus"]),
        device: str | None = typer.Option(None, help=JOB_HELP["device"]),
        devices_per_node: int | None = typer.Option(None, help=JOB_HELP["devices_per_node"]),
        response_len: int | None = typer.Option(None, help=JOB_HELP["response_len"]),
        response_len_max: int | None = typer.Option(None, help=JOB_HELP["response_len_max"]),
        prompt_len: int | None = typer.Option(None, help=JOB_HELP["prompt_len"]),
        prompts: int | None = typer.Option(None, help=JOB_HELP["prompts"]),
        responses_per_prompt: int | None = typer.Option(
            None, help=JOB_HELP["responses_per_prompt"]),
        ppo_mini_batches: int | None = typer.Option(None, help=JOB_HELP["ppo_mini_batches"]),
        explain: bool = typer.Option(False, "--explain", help="break every estimate down by term"),
        frontier_stage: str | None = typer.Option(None, "--frontier", metavar="STAGE",
                                                  help="list STAGE's latency-GPU frontier"),
        evaluate: Path | None = typer.Option(
            None, "--evaluate", metavar="PLAN", readable=False,
            help="score your plan beside the best: a plan JSON (plan --json) or a YAML "
                 "mapping each model-stage to tp, pp and dp, and optionally gpus (one list "
                 "of tp x pp GPU ids per DP replica), micro_batch and grad_accum (not on "
                 "generation) and recompute (training only) (nereus examples writes two, "
                 "under layouts/)"),
        profile: Path | None = typer.Option(None, readable=False, help=JOB_HELP["profile"]),
        spread: bool = typer.Option(False, "--spread",
                                    help="keep two or more replicas of every model-stage on "
                                    "different nodes, so losing any one node (a spot "
                                    "reclaim) leaves a copy of all state"),
        framework: str | None = typer.Option(
            None, "--framework", metavar="NAME",
            help="the fastest plan within what a framework's users configure, beside the "
                 "planner's best, with the framework's config overrides: verl (every "
                 "model-stage on the same GPUs, Megatron TP/PP, the rollout's TP); with "
                 "--json, that plan alone, as a plan file nereus transition reads"),
        exhaustive: bool = typer.Option(
            False, "--exhaustive",
            help="on a pool of partly filled nodes, search until the plan is proven the "
                 f"fastest, past {MAX_REPRICED} plans placed dearer than priced (it may take "
                 "minutes)"),
        as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
    ) -> None:
        """Find the fastest execution plan that fits, and show where its time and memory go.

        Exit 2 for bad input, a job that no plan fits included.
        """
        on = frontier_stage is not None
        refuse_together("--frontier", on, "--evaluate", evaluate is not None,
                        "--frontier STAGE with --json or --spread")
        refuse_together("--frontier", on, "--explain", explain,
                        "--frontier STAGE with --json or --spread")
        refuse_together("--json", as_json, "--explain", explain,
                        "--explain with the tables, or --json alone")
        refuse_together("--exhaustive", exhaustive, "--frontier", on,
                        "--exhaustive with the best plan or --evaluate")
        if framework is not None:
            if framework not in FRAMEWORKS:
                raise InputError("--framework", f"unknown framework {framework!r}", FRAMEWORKS)
            for option, given in (("--evaluate", evaluate is not None), ("--frontier", on),
                                  ("--spread", spread), ("--exhaustive", exhaustive)):
                refuse_together("--framework", True, option, given,
                                "--framework with --json or --explain")
        # the job's options, once: the search for a pool that fits rebuilds it with other gpus
        options: dict[str, Any] = dict(
            model=model, algo=algo, execution=execution, reward=reward, gpus=gpus,
            device=device, devices_per_node=devices_per_node, response_len=response_len,
            response_len_max=response_len_max, prompt_len=prompt_len, prompts=prompts,
            responses_per_prompt=responses_per_prompt, ppo_mini_batches=ppo_mini_batches)
        job, fields = job_and_fields_from_options(config, **options)
        # the model as the user gave it: the record's job finds it again by that (a path)
        given_model = str(fields["model"])
        if frontier_stage is not None:
            job.workflow.stage(frontier_stage, "--frontier")  # before any planning
        if spread and not spans_nodes(job.pool):
            # the Planner takes spread as a no-op on one node (the controller asks for it on
            # a pool that churns, which can shrink to one); a user asked for a copy on another
            # node that this pool does not have
            per = job.cluster.devices_per_node
            raise InputError("--spread", f"the pool of {count(job.pool.size, 'GPU')} is one "
                             "node: losing it loses every copy, and there is no other node to "
                             "keep one on", f"a pool on two or more nodes (a node holds {per} "
                             "GPUs here)")
        cost = cost_model(job, profile)
        if evaluate is not None:
            # the best plan's error, where no plan fits, is the plain command's
            def no_plan(e: InfeasibleError) -> Exception:
                return no_plan_error(e, job, fields, config, options, profile, spread)

            _evaluate(job, cost, evaluate, explain, as_json, spread, given_model, profile,
                      no_plan, exhaustive)
            return
        if framework is not None:
            _framework(job, cost, explain, as_json, given_model, profile)
            return
        if frontier_stage is not None:
            try:
                planner = Planner(job, cost=cost, spread=spread)
            except InfeasibleError as e:
                raise no_plan_error(e, job, fields, config, options, profile, spread) from None
            _frontier(job, planner, frontier_stage, as_json, given_model)
            return
        try:
            plan = _best(job, cost, spread, exhaustive)
        except InfeasibleError as e:
            raise no_plan_error(e, job, fields, config, options, profile, spread) from None
        note = _unproven(plan, exhaustive)
        if as_json:  # with the job it was planned for, which nereus transition checks and uses
            print(json.dumps(with_record(plan.to_dict(), job, given_model)))
            if note is not None:  # stdout stays a plan file
                err_console.print(note, markup=False, highlight=False, soft_wrap=True)
            return
        console.print(job_header(job))
        if profile is not None:
            console.print(f"cost model calibrated with {profile.name}")
        console.print(plan_table(job, plan, "best plan"))
        console.print(_summary(plan, job))
        if note is not None:
            console.print(note, markup=False, highlight=False)
        console.print(_node_loss(job, plan, spread))
        if explain:
            _explain(cost, plan, "best plan")

    def _framework(job: JobSpec, cost: CostModel, explain: bool, as_json: bool,
                   given_model: str, profile: Path | None) -> None:
        """verl's best plan (``nereus.plan.frameworks``), its config overrides, and how the
        planner's best compares; --json prints the plan as a plan file."""
        try:
            plan = best_verl_plan(job, cost.eff, cost.memory_scale)
        except InfeasibleError as e:
            raise InputError("--framework", f"verl: {e}",
                             "the planner's whole space (without --framework)") from None
        if as_json:
            print(json.dumps(with_record(plan.to_dict(), job, given_model)))
            return
        name = "best plan in verl's space"
        console.print(job_header(job))
        if profile is not None:
            console.print(f"cost model calibrated with {profile.name}")
        console.print(plan_table(job, plan, name))
        console.print(_summary(plan, job))
        console.print(_node_loss(job, plan, best=False))
        try:  # one a line: a wrapped line would not paste back
            console.print("verl's config overrides (Megatron backend):\n  "
                          + "\n  ".join(verl_overrides(job, plan)), markup=False,
                          highlight=False)
        except ValueError as e:
            console.print(f"verl: {e}", markup=False, highlight=False)
        best = Planner(job, cost=cost).best()  # verl's plan is one of its space: one exists
        mine, theirs = plan.step_latency_s, best.step_latency_s
        console.print(f"the planner's best plan (any layout): {mine / theirs:.3f}x the speed "
                      f"of verl's per step ({theirs:.3f} s against {mine:.3f} s, estimated)")
        if explain:
            _explain(cost, plan, name)

    def _node_loss(job: JobSpec, plan: Plan, spread: bool = False, best: bool = True) -> str:
        """Which node takes the last copy of a model-stage; ``spread``: --spread was given
        (it placed ``plan`` if ``best``, else ``plan`` is the user's and the best follows)."""
        if not spans_nodes(job.pool):
            return "node loss: the pool is one node"
        hit = {n: s for n, s in exposed_by_node(plan, job.cluster, job.workflow).items() if s}
        if not hit:
            if any(exposed_by_node(plan, job.cluster).values()):
                return ("node loss: any one node can go without a restart; every training "
                        "stage keeps a copy elsewhere (a copy of θ is given θ again by its "
                        "training stage, a frozen model's weights are read again)")
            return "node loss: any one node can go; every model-stage keeps a copy elsewhere"
        parts = _takes(hit)
        if spread and best:
            # --spread keeps layouts whose replicas can sit on different nodes; how the pool
            # is split between groups of model-stages can still put them on one (asynchronous
            # generation's own GPUs, most often): the search did not find such a placement,
            # which is not to say none exists
            return (f"node loss: the last copy of a model-stage goes with a node ({parts}); "
                    f"--spread did not find a placement that keeps a copy of it on another "
                    f"node (--evaluate scores one you write)")
        if spread:
            return (f"node loss: the last copy of a model-stage goes with a node ({parts}); "
                    f"the best plan below is placed with --spread")
        return (f"node loss: the last copy of a model-stage goes with a node ({parts}); "
                f"--spread looks for a plan that keeps a copy on another node")

    def _explain(cost: CostModel, plan: Plan, whose: str) -> None:
        """Every estimate of ``plan`` by term, under a heading naming it (``whose``, as its
        table's title does): --evaluate prints two plans' breakdowns one after the other."""
        console.print(f"{whose}: where its time and memory go (estimated)", markup=False,
                      highlight=False)
        for sp in plan.stages:  # as the plan priced it (on its GPU ids' links, where given)
            console.print(stage_estimate(cost, plan, sp.stage).explain(),
                          markup=False, highlight=False)
        sync = cost.job.workflow.weight_sync()
        if sync:
            console.print(sync_explain(cost, plan, *sync), markup=False, highlight=False)

    def _frontier(job: JobSpec, planner: Planner, stage: str, as_json: bool,
                  given_model: str) -> None:
        job.workflow.stage(stage, "--frontier")  # raises a one-line error for an unknown stage
        f = frontier(planner.options[stage])
        order = sorted(range(len(f)), key=lambda i: (f.gpus[i], f.latency[i]))
        rows = [{"tp": f.candidates[i].tp, "pp": f.candidates[i].pp, "dp": f.candidates[i].dp,
                 "micro_batch": f.candidates[i].micro_batch,
                 "grad_accum": f.candidates[i].grad_accum,
                 "recompute": f.candidates[i].recompute, "gpus": int(f.gpus[i]),
                 "latency_s": float(f.latency[i]),
                 "peak_mem_bytes": int(f.resident[i] + f.transient[i])} for i in order]
        if as_json:
            # the job too: a frontier's latencies and memory are this job's
            print(json.dumps(with_record({"stage": stage, "source": "estimated",
                                          "frontier": rows}, job, given_model)))
            return
        batch = planner.cost.stage_batch(stage)
        notes = ["--spread: two or more replicas, each inside a node"] if planner.spread else []
        if any(batch % r["dp"] for r in rows):
            notes.append(f"*: the largest replica's share where dp does not divide the {batch} "
                         "sequences (the rest run one fewer)")
        # the title stays one short line: a long one wrapped to the narrow table's width
        t = FitTable(title=f"{stage}: latency-GPU frontier (estimated)", title_justify="left",
                     caption="; ".join(notes) or None, caption_justify="left")
        for col in ("GPUs", "tp", "pp", "dp", "b x a", "recompute", "latency s", "peak GiB"):
            t.add_column(col, justify="right")
        for r in rows:
            mark = "*" if batch % r["dp"] else ""
            t.add_row(str(r["gpus"]), str(r["tp"]), str(r["pp"]), str(r["dp"]),
                      f"{r['micro_batch']}x{r['grad_accum']}{mark}",  # as the plan table
                      "yes" if r["recompute"] else "no",
                      f"{r['latency_s']:.3f}", f"{r['peak_mem_bytes'] / GiB:.1f}")
        console.print(t)

    def _evaluate(job: JobSpec, cost: CostModel, path: Path, explain: bool, as_json: bool,
                  spread: bool, given_model: str, profile: Path | None,
                  no_plan: Callable[[InfeasibleError], Exception],
                  exhaustive: bool = False) -> None:
        """Score the user's plan beside the best one. Where no plan fits the job, the user's
        is still scored and printed, then ``no_plan``'s error ends it (exit 2), as the plain
        command's does: a script reading only the exit code is not told the job fits."""
        raw = read_plan_file(path)
        data, record = split_record(raw, "evaluate")
        if job_shaped(data):  # --evaluate given the --config
            raise InputError("--evaluate", f"{path.name} is a job file (as --config reads), "
                             "not a plan", PLAN_FILES)
        if (what := output_kind(data)) is not None:  # another command's --json output
            raise InputError("--evaluate", f"{path.name} is {what}, not a plan", PLAN_FILES)
        check_record(record, job, "evaluate", path)
        specs = layout_from_data(raw)
        _check_stage_names(job, specs)
        yours = evaluate_plan(job, specs, cost)
        problems = validate_plan(job, yours, cost)
        failed: Exception | None = None
        try:
            best: Plan | None = _best(job, cost, spread, exhaustive)
        except InfeasibleError as e:  # context: a job that fits nowhere still scores yours
            best, failed = None, no_plan(e)
        if as_json:
            out = with_record(yours.to_dict(), job, given_model)
            out["fits"] = not problems
            out["problems"] = problems
            out["notes"] = list(yours.notes)
            # null where no plan fits, and a note why (a plan file has no other field for it:
            # the file still reads back as a plan)
            out["best_step_latency_s"] = None if best is None else best.step_latency_s
            if failed is not None:
                out["notes"].append(f"no best plan: {failed}")
            elif best is not None and (note := _unproven(best, exhaustive)) is not None:
                out["notes"].append(f"best plan: {note.removeprefix('note: ')}")
            print(json.dumps(out))
            if failed is not None:
                raise failed
            return
        mine = f"your plan ({path.name})"
        theirs = "best plan" + (" (--spread)" if spread else "")
        console.print(job_header(job))
        if profile is not None:
            console.print(f"cost model calibrated with {profile.name}")
        console.print(plan_table(job, yours, mine))
        console.print(_summary(yours, job))
        for note in yours.notes:  # where its GPU ids price it apart from sizes
            console.print(f"note: {note}", markup=False, highlight=False)
        console.print(_node_loss(job, yours, spread, best=False))
        if problems:
            console.print(f"[red]does not fit[/]: {len(problems)} problem(s)")
            for p in problems[:MAX_PROBLEMS_SHOWN]:
                console.print(f"  - {p}", markup=False)
            if len(problems) > MAX_PROBLEMS_SHOWN:
                console.print(f"  ... and {len(problems) - MAX_PROBLEMS_SHOWN} more "
                              "(--json lists all)", markup=False, highlight=False)
        else:
            console.print("[green]fits[/] (every GPU within 90 % of memory, estimated)")
        if best is not None:
            console.print(plan_table(job, best, theirs))
            console.print(_summary(best, job))
            if (note := _unproven(best, exhaustive)) is not None:
                console.print(note, markup=False, highlight=False)
            console.print(_node_loss(job, best, spread))
            console.print(_comparison(yours, best, problems))
        else:
            console.print("no best plan: no plan fits this job (the error below says what "
                          "would)", markup=False, highlight=False)
        if explain:
            _explain(cost, yours, mine)
            if best is not None:
                _explain(cost, best, theirs)
        if failed is not None:
            raise failed

