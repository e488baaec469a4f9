"""``nereus simulate``: how the policies fare on a trace of response-length growth, GPU churn
and efficiency drift. Every number it prints is simulated and names its scenario."""

from __future__ import annotations

import csv
import json
import os
import shlex
from contextlib import nullcontext
from functools import partial
from pathlib import Path

import typer
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table
from rich.text import Text

from nereus.commands.common import (
    FIGURE_FORMATS,
    Command,
    FitTable,
    console,
    err_console,
    one_line_errors,
    output_path,
    refuse_together,
    with_default,
    writable,
)
from nereus.commands.simplot import draw
from nereus.control.restart import checkpoint_bytes, saved_bytes
from nereus.errors import InputError, count
from nereus.files import os_reason, read_yaml
from nereus.interrupts import sigterm_raises
from nereus.sim.policies import ALL_POLICIES, POLICIES, check_runs
from nereus.sim.scenarios import (
    SCENARIO_FILES,
    SCENARIOS,
    Scenario,
    builtin,
    load_scenario,
    run_scenario,
    simulator,
    with_overrides,
)
from nereus.sim.simulator import PolicyResult, SimResult
from nereus.writes import whole_file


def _policies(text: str) -> list[str]:
    names = [p.strip() for p in text.split(",") if p.strip()]
    bad = [p for p in names if p not in ALL_POLICIES]
    if bad or not names:
        raise InputError("--policies", f"unknown policy {bad[0]!r}" if bad else "empty",
                         ALL_POLICIES)
    return list(dict.fromkeys(names))


def _scenario_file(path: Path) -> Path:
    """A job YAML (for ``nereus plan``) given as the scenario is the likely mistake: say so,
    rather than that a field ``job`` is missing."""
    try:
        data = read_yaml(path, "--config")
    except InputError:
        return path  # load_scenario says what is wrong with it
    if isinstance(data, dict) and "job" not in data and "model" in data:
        raise InputError("--config", f"{path.name} is a job file (as nereus plan reads); a "
                         "scenario puts the job under job:, beside its traces",
                         SCENARIO_FILES)
    return path


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)  # a hard link or another spelling of the path too
    except OSError:  # one does not exist (an output not written yet)
        return a.resolve() == b.resolve()


def refuse_overwriting_inputs(outputs: dict[str, Path | None], inputs: dict[str, Path]) -> None:
    """An output file that is one of the run's inputs would be overwritten by it, silently."""
    for option, out in outputs.items():
        for field, src in inputs.items():
            if out is not None and _same_file(out, src):
                raise InputError(option, f"{out} is the scenario's {field} ({src}): the run "
                                 "would overwrite it", "a file that is none of the scenario's "
                                 "inputs")


def result_json(res: SimResult, sc: Scenario, command: str | None = None
                ) -> dict[str, object]:
    """Scenario, source, the run (``run_json``), and per policy every number the table prints
    (and the calibrator's error after 10 steps, where the policy has a calibrator; else
    null). ``mean_step_s``: see ``PolicyResult.mean_step_s`` (checkpoint writes included)."""
    return {"scenario": res.scenario, "source": "simulated", "run": run_json(res, sc, command),
            "policies": {n: policy_json(r) for n, r in res.results.items()}}


def run_json(res: SimResult, sc: Scenario, command: str | None = None) -> dict[str, object]:
    """What was simulated, as run (after --steps and --gamma): two runs of one scenario with
    other steps, seed or γ print different objects, not only different numbers. ``command``
    runs it again (:func:`run_command`)."""
    return {"scenario": sc.name, "steps": sc.steps, "seed": sc.seed,
            "gamma": sc.control.gamma, "policies": list(res.results),
            "command": command or run_command(sc, None, policies=list(res.results))}


def policy_json(r: PolicyResult) -> dict[str, object]:
    return {"tokens_per_s": r.tokens_per_s, "mean_step_s": r.mean_step_s,
            "transitions": r.transitions, "transition_s": r.transition_s,
            "restarts": r.restarts, "restart_s": r.restart_s, "lost_s": r.lost_s,
            "paused_s": r.paused_s, "checkpoint_s": r.checkpoint_s,
            f"calib_error_at_step_{CALIB_STEP}": r.calib_error_at(CALIB_STEP)}


# the step the calibrator's error is reported at (the README's target: after 10 steps)
CALIB_STEP = 10


# what "mean step s" adds up (PolicyResult.mean_step_s): more than the step, so say it; and
# tokens/s is over the same time (a CSV's last end_s also holds the pauses)
MEAN_STEP = ("mean step s: the step plus its transitions, restarts, lost work and checkpoint "
             "writes (pauses excepted); tokens/s: response tokens over that time")


def summary_table(sc: Scenario, res: SimResult) -> Table:
    base = res.results.get("static")
    # Text: a scenario's name is the user's, not Rich markup ("[red]run[/red]" prints as given)
    t = FitTable(title=Text(f"{sc.name}: {count(sc.steps, 'step')} (simulated)"),
                 title_justify="left", caption=MEAN_STEP, caption_justify="left",
                 fold=("policy",))
    for col in ("policy", "tokens/s", "vs static", "mean step s", "transitions",
                "transition s", "restarts", "restart s", "lost s", "paused s",
                "checkpoint s"):
        t.add_column(col, justify="left" if col == "policy" else "right", no_wrap=True)
    for name, r in res.results.items():
        rel = f"{r.tokens_per_s / base.tokens_per_s:.2f}x" if base and base.tokens_per_s else "-"
        t.add_row(name, f"{r.tokens_per_s:,.0f}", rel, f"{r.mean_step_s:.1f}",
                  str(r.transitions), f"{r.transition_s:.1f}", str(r.restarts),
                  f"{r.restart_s:.0f}", f"{r.lost_s:.0f}", f"{r.paused_s:.0f}",
                  f"{r.checkpoint_s:.0f}")
    return t


def write_csv(res: SimResult, path: Path, sc: Scenario) -> None:
    """Per-step rows of every policy, each naming its scenario, seed and γ (a file read on its
    own, or rows of two runs put together, still say which run they are); the ``source``
    column says the numbers are simulated. ``transitions`` counts the moves before the step:
    summed, each policy's transitions in the table, the oracle's free ones (``transition_s``
    0) included."""
    fields = ["policy", "step", "end_s", "step_s", "transitions", "transition_s", "restart_s",
              "lost_s", "paused_s", "checkpoint_s", "pool_gpus", "plan_gpus", "response_len_mean",
              "tokens", "calib_error"]
    run = [sc.name, sc.seed, sc.control.gamma]
    try:
        with whole_file(path, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["scenario", "seed", "gamma", *fields, "source"])
            for r in res.results.values():
                for row in r.rows:
                    w.writerow([*run, *(getattr(row, k) if getattr(row, k) is not None else ""
                                        for k in fields), "simulated"])
    except OSError as e:
        raise InputError("--csv", f"cannot write {path}: {os_reason(e)}") from None


def run_command(sc: Scenario, config: Path | None, seed: int | None = None,
                steps: int | None = None, gamma: float | None = None,
                policies: list[str] | None = None) -> str:
    """A shell command line that runs it again (``--json``'s ``run.command``): every option
    that changes a result, the ``--config`` path as given, each argument quoted. Unlike
    :func:`run_label` it names no scenario beside a file, which no shell would accept."""
    parts = ["--config", str(config)] if config is not None else ["--scenario", sc.name]
    if seed:
        parts += ["--seed", str(seed)]
    if steps is not None:
        parts += ["--steps", str(sc.steps)]
    if gamma is not None:
        parts += ["--gamma", repr(gamma)]  # all its digits: --gamma 0.1234567 is not 0.123457
    if policies is not None and policies != list(POLICIES):
        parts += ["--policies", ",".join(policies)]
    return shlex.join(["nereus", "simulate", *parts])


def run_label(sc: Scenario, config: Path | None, seed: int | None = None,
              steps: int | None = None, gamma: float | None = None) -> str:
    """The run as a reader names it (the plot's title): ``--config FILE`` with the name of its
    scenario (a file's scenario may carry any name) or ``--scenario NAME``, with the options
    that change what was simulated. Not a command line: :func:`run_command` is one."""
    parts = [f"--config {config.name} (scenario {sc.name})" if config is not None
             else f"--scenario {sc.name}"]
    if seed:
        parts.append(f"--seed {seed}")
    if steps is not None:
        parts.append(f"--steps {sc.steps}")
    if gamma is not None:
        parts.append(f"--gamma {gamma:g}")
    return "nereus simulate " + " ".join(parts)


def plot(res: SimResult, sc: Scenario, path: Path, label: str | None = None) -> None:
    """Where each policy spends its time over the steps (``simplot.draw``): the steps without
    checkpoint writes, restarts and lost work; the time lost so far behind the oracle (or the
    fastest policy), all of "mean step s" counted; the pool and response length. The title is
    ``label`` (the run's command line, :func:`run_label`)."""
    draw(res, label or run_label(sc, None), path)


def register(app: typer.Typer) -> None:
    @app.command("simulate", cls=Command)
    @one_line_errors
    def simulate_cmd(
        scenario: str | None = typer.Option(
            None, "--scenario", "-s",
            help=with_default(f"built-in scenario: {', '.join(SCENARIOS)}", "default")),
        # readable=False on every file: nereus.files says why one cannot be read, in one line
        config: Path | None = typer.Option(
            None, "--config", "-c", readable=False,
            help="scenario YAML: a job: section, trace files, truth (nereus examples writes "
                 "two)"),
        steps: int | None = typer.Option(
            None, metavar="N", help=with_default("simulate only the first N steps",
                                    "all of the scenario's; a larger N runs them all")),
        seed: int | None = typer.Option(
            None, help=with_default("seed of the generated traces and noise (built-in "
                                    "scenarios; a --config file sets seed: itself)", 0)),
        gamma: float | None = typer.Option(
            None, help=with_default("Nereus's confidence margin γ, 0 to 1",
                                    "the scenario's; 0.5 in the built-in ones")),
        policies: str = typer.Option(",".join(POLICIES), help="policies to compare, "
                                     "comma-separated; also static_verl: static within the "
                                     "plans a verl user can configure"),
        # strings, both: a Path loses a trailing slash (output_path)
        plot_given: str | None = typer.Option(
            None, "--plot", metavar="OUT.png",
            help="draw, over steps: each step's time without checkpoint writes, restarts "
                 "and lost work; the time lost so far behind the oracle (without it, the "
                 "fastest policy), all counted; the pool and response length (.png, .pdf or "
                 ".svg)"),
        csv_given: str | None = typer.Option(
            None, "--csv", metavar="OUT.csv",
            help="write per-step rows of every policy; a row's transitions (moves before the "
                 "step, the oracle's free ones too) sum to the table's"),
        as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
        notes: bool = typer.Option(False, "--notes", help="list every parameter's source "
                                   "and stop, without simulating: the sources are the "
                                   "scenario's (with --steps and --gamma), not the run's"),
        log: bool = typer.Option(False, "--log", help="print the controllers' decisions; "
                                 "one logged at step k is taken at the boundary after step k, "
                                 "so --csv charges its move or restart to step k + 1; one "
                                 "taken before step k ends (it ran out of memory and runs "
                                 "again, or a first step that lost GPUs) is logged at step k "
                                 "and charged to step k"),
    ) -> None:
        """Compare static, replan-always, Nereus and an oracle on a simulated run.

        Exit 2 for bad input: a scenario, trace or option that is wrong, or a job no plan
        fits at the start.
        """
        refuse_together("--json", as_json, "--log", log,
                        "--log with the tables, or --json alone")
        # --notes simulates nothing: an output of the run cannot come with it
        for option, given in (("--json", as_json), ("--log", log),
                              ("--csv", csv_given is not None), ("--plot", plot_given is not None)):
            refuse_together(option, given, "--notes", notes, f"--notes alone (it lists the "
                            f"sources without simulating), or {option} without it")
        names = _policies(policies)
        plot_path = output_path(plot_given, "--plot", FIGURE_FORMATS)
        csv_path = output_path(csv_given, "--csv", (".csv",))
        writable(plot_path, "--plot")  # before the run: its results must not be lost
        writable(csv_path, "--csv")
        if gamma is not None and not 0.0 <= gamma <= 1.0:
            raise InputError("--gamma", f"must be in [0, 1], got {gamma}", "a number in [0, 1]")
        if seed is not None and seed < 0:
            raise InputError("--seed", f"must be >= 0, got {seed}", "an integer >= 0")
        if config is not None:
            for opt, value, where, instead in (
                    ("--scenario", scenario, "the file is the scenario",
                     "one of them: --config FILE or --scenario NAME"),
                    ("--seed", seed, "set seed: in the file",
                     "seed: in the --config file, or --seed with a built-in --scenario")):
                if value is not None:
                    raise InputError(opt, f"cannot be combined with --config ({where})",
                                     instead)
            sc = load_scenario(_scenario_file(config))
            refuse_overwriting_inputs({"--csv": csv_path, "--plot": plot_path},
                                      {"--config": config, **sc.inputs})
        else:
            sc = builtin("default" if scenario is None else scenario, seed=seed or 0)
        sc = with_overrides(sc, steps=steps, gamma=gamma)
        if notes:  # the scenario holds every source: none depends on how the run goes
            console.print(Text.assemble((sc.name, "bold"), f": {sc.description} -- "
                                        f"{count(sc.steps, 'step')}"))
            console.print(notes_table(sc))
            return
        # before anything is printed: building it finds a trace no plan can run on, and an
        # error must stay one line
        check_runs(names, sc.job, "--policies")
        sim = simulator(sc)
        # after the checks: an error that follows stays the one line on stderr
        if steps is not None and steps > sc.steps:  # --steps cuts a scenario short
            err_console.print(f"note: --steps {steps:,} is more than the scenario's "
                              f"{count(sc.steps, 'step')}: all of them are simulated",
                              markup=False, highlight=False, soft_wrap=True)
        lines: list[tuple[str, str]] = []
        on_log = (lambda policy, line: lines.append((policy, line))) if log else None
        if not as_json:  # the name and description are the user's text, not Rich markup
            console.print(Text.assemble((sc.name, "bold"), f": {sc.description} -- "
                                        f"{count(sc.steps, 'step')}, "
                                        f"polic{'y' if len(names) == 1 else 'ies'} "
                                        f"{', '.join(names)} (simulated)"))
        # a bar is for a person watching: stderr sent to a file or a pipe gets none, and no
        # Progress at all (with rich 13.8 a disabled one still leaves an empty line there)
        watched = not as_json and err_console.is_terminal
        # SIGTERM stops the worker processes before the command ends (exit 143); by default
        # Python died at once and left them running, holding stdout open
        with sigterm_raises(), (Progress(TextColumn("simulating"), BarColumn(),
                                         MofNCompleteColumn(), TimeElapsedColumn(),
                                         console=err_console, transient=True)
                                if watched else nullcontext()) as bar:
            progress = None if bar is None else partial(
                _show_step, bar, bar.add_task("steps", total=sc.steps))
            res = run_scenario(sc, names, progress, on_log, sim=sim)
        label = run_label(sc, config, seed, steps, gamma)
        if as_json:
            command = run_command(sc, config, seed, steps, gamma, names)
            print(json.dumps(result_json(res, sc, command), allow_nan=False))
        else:
            print_results(sc, res, lines, log)
        # the files after the results: one that cannot be saved costs no printed result
        if csv_path is not None:
            write_csv(res, csv_path, sc)
            if not as_json:
                console.print(f"wrote per-step rows to {csv_path}", markup=False,
                              highlight=False)
        if plot_path is not None:
            plot(res, sc, plot_path, label)
            if not as_json:
                console.print(f"wrote plot to {plot_path}", markup=False, highlight=False)


def _show_step(bar: Progress, task: TaskID, step: int) -> None:
    bar.update(task, completed=step)


def print_results(sc: Scenario, res: SimResult, lines: list[tuple[str, str]],
                  log: bool) -> None:
    """The table, the calibrator's error and the decisions (--log)."""
    console.print(summary_table(sc, res))
    nereus = res.results.get("nereus")
    if nereus is not None and nereus.calib_error_at(CALIB_STEP) is not None:
        console.print(f"Nereus calibrator: stage-latency error "
                      f"{nereus.calib_error_at(CALIB_STEP):.1%} after {CALIB_STEP} steps "
                      f"(simulated, vs the hidden truth)")
    if log:
        for policy, line in lines:
            if " keep [no trigger]" not in line and " keep [always]" not in line:
                # soft_wrap: one decision, one line, at any width (a pipe's console is 160
                # columns, and grep would find half a decision)
                console.print(f"{policy}: {line}", markup=False, highlight=False,
                              soft_wrap=True)


def notes_table(sc: Scenario) -> Table:
    """Every parameter of ``sc`` and where its value comes from (``--notes``). They are the
    scenario's, set when it is built or loaded (and by --steps and --gamma): the simulator
    adds none, so they are listed without a run."""
    t = FitTable(title="parameters and their sources", title_justify="left",
                 fold=("parameter", "value", "source"))
    t.add_column("parameter", no_wrap=True)
    t.add_column("value", no_wrap=True)
    t.add_column("source")
    for k, v in sc.notes.items():
        # a scenario's notes: its text, not markup
        t.add_row(Text(k), Text(note_value(sc, k)), Text(v))
    return t


# units of the restart parameters' values, as --notes prints them: (field suffix, unit, scale)
_UNITS = (("_s", "s", 1.0), ("_bw_per_node", "GB/s per node", 1e-9), ("_steps", "steps", 1.0))


def note_value(sc: Scenario, key: str) -> str:
    """The value a ``control.*`` or ``restart.*`` note is about, as the run uses it (a
    checkpoint's bytes computed from the job), or "" where the note is its own value (a
    trace, a policy's rule)."""
    section, _, name = key.partition(".")
    if section == "control" and hasattr(sc.control, name):
        value = getattr(sc.control, name)
        return str(value).lower() if isinstance(value, bool) else f"{value:g}"
    if section != "restart":
        return ""
    if name == "checkpoint_bytes":  # what a restart reads, and what a checkpoint writes
        return (f"{checkpoint_bytes(sc.job) / 1e9:.1f} GB read, "
                f"{saved_bytes(sc.job) / 1e9:.1f} GB written")
    if not hasattr(sc.restart, name):
        return ""
    value = getattr(sc.restart, name)
    for suffix, unit, scale in _UNITS:
        if name.endswith(suffix):
            return f"{value * scale:g} {unit}"
    return f"{value:g}"
