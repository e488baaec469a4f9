"""Scenarios: overrides cut the traces, YAML bounds, and where every note says a value comes
from (no simulation runs here)."""

import pytest

from nereus.cost.ops import OpClass
from nereus.errors import InputError
from nereus.sim import traces as T
from nereus.sim.scenarios import builtin, load_scenario, with_overrides

JOB = "job: {model: llama-3.1-8b, gpus: 16, cluster: {devices_per_node: 8}}\n"


def test_steps_override_cuts_the_length_trace():
    sc = with_overrides(builtin("default"), steps=100)
    assert sc.steps == 100 and len(sc.lengths) == 100
    assert max(sc.lengths.longest) < 3000          # the full trace reaches ~12,000 tokens
    assert sc.lengths == builtin("default").lengths.head(100)
    assert "first 100 steps" in sc.notes["lengths"] and "--steps" in sc.notes["lengths"]
    full = with_overrides(builtin("stationary"), steps=10_000)   # longer than the trace
    assert full.steps == 300 and full.lengths == builtin("stationary").lengths


def test_steps_override_cuts_drift_periods_at_the_end():
    base = builtin("drift")
    sc = with_overrides(base, steps=300)
    assert sc.drift.periods and all(p.start_step < 300 and p.end_step <= 300
                                    for p in sc.drift.periods)
    assert len(sc.drift.periods) < len(base.drift.periods)
    assert "first 300 steps" in sc.notes["drift"]
    assert with_overrides(base, steps=1000).drift == base.drift


def test_heads_of_traces():
    t = T.growth(10, seed=1)
    assert t.head(4).mean == t.mean[:4] and t.head(4).longest == t.longest[:4]
    assert t.head(10) is t and t.head(50) is t
    with pytest.raises(InputError, match="steps"):
        t.head(0)
    d = T.DriftTrace((T.DriftPeriod(2, 8, OpClass.GEMM, 0.5),
                      T.DriftPeriod(9, 12, OpClass.GEMM, 0.5)))
    assert d.head(5).periods == (T.DriftPeriod(2, 5, OpClass.GEMM, 0.5),)
    assert d.head(12) is d
    # what a cut leaves out is said, not dropped quietly (a period past the run is more often
    # a mistake in the file than a wish)
    assert d.head(5).source.endswith("cut to its first 5 steps: 1 of 2 periods starts at or "
                                     "after step 5 and is left out, 1 period cut to end at "
                                     "step 5")
    assert d.head(10).source.endswith("cut to its first 10 steps: 1 period cut to end at "
                                      "step 10")


def test_notes_name_where_each_value_came_from(tmp_path):
    p = tmp_path / "run.yaml"
    p.write_text(JOB + "steps: 3\n"
                 "restart: {storage_read_gb_per_s_per_node: 4, checkpoint_interval_steps: 5}\n"
                 "control: {delta_len: 0.2, gamma: 0.4}\n"
                 "hidden_efficiency: {gemm: 0.5}\nnoise: 0.02\n")
    sc = load_scenario(p)
    n = sc.notes
    for k in ("restart.storage_read_bw_per_node", "restart.checkpoint_interval_steps",
              "control.delta_len", "control.gamma", "noise"):
        assert n[k] == "from run.yaml", (k, n[k])
    for k in ("restart.startup_s", "restart.storage_write_bw_per_node", "control.delta_eff",
              "control.length_window"):
        assert "assumption" in n[k] and "run.yaml" not in n[k], (k, n[k])
    assert n["hidden_efficiency"].startswith("from run.yaml: gemm 0.5")
    assert sc.restart.checkpoint_interval_steps == 5 and sc.control.gamma == 0.4
    over = with_overrides(sc, gamma=0.7)
    assert over.control.gamma == 0.7
    assert over.notes["control.gamma"].startswith("--gamma on the command line")
    assert sc.notes["control.gamma"] == "from run.yaml"       # the original is untouched
    p.write_text(JOB + "steps: 3\nrestart: {checkpoint_interval_steps: 5}\n")
    n = load_scenario(p).notes
    assert "assumption" in n["restart.startup_s"] and "paper" in n["control.gamma"]
    assert n["noise"].startswith("assumption")


def test_checkpoint_note_names_the_jobs_own_models(tmp_path):
    # regression: the note named a critic for every job, GRPO's (no critic) too
    note = builtin("stationary", steps=5).notes["restart.checkpoint_bytes"]
    assert note.startswith("computed: θ and ω (fp32 master + Adam moments) of the actor and "
                           "critic, θ of the reference and reward, read at a restart")
    assert "writes the actor's and critic's alone" in note
    p = tmp_path / "grpo.yaml"
    p.write_text("job: {model: llama-3.1-8b, algo: grpo, gpus: 16, cluster: "
                 "{devices_per_node: 8}, workload: {responses_per_prompt: 4, "
                 "prompts_per_step: 128}}\nsteps: 3\n")
    note = load_scenario(p).notes["restart.checkpoint_bytes"]
    assert "critic" not in note
    assert note.startswith("computed: θ and ω (fp32 master + Adam moments) of the actor, θ of "
                           "the reference and reward, read at a restart")
    assert "writes the actor's alone" in note
    # ω as the workload has it: no master copy of fp32 θ, no moments without Adam
    p.write_text("job: {model: llama-3.1-8b, algo: remax, gpus: 16, cluster: "
                 "{devices_per_node: 8}, workload: {param_dtype: fp32, optimizer: sgd}}\n"
                 "steps: 3\n")
    assert load_scenario(p).notes["restart.checkpoint_bytes"].startswith(
        "computed: θ and ω (none) of the actor, θ of the reference and reward")


def test_builtin_gamma_override_is_noted():
    sc = with_overrides(builtin("stationary", steps=5), gamma=0.2)
    assert sc.notes["control.gamma"] == "--gamma on the command line (0.2)"
    with pytest.raises(InputError, match="--gamma"):
        with_overrides(sc, gamma=float("nan"))


def test_efficiencies_above_one_only_on_the_cpu_device(tmp_path):
    p = tmp_path / "cpu.yaml"
    p.write_text("job: {model: tiny-llama, gpus: 2, cluster: {device: cpu, devices_per_node: 2}}"
                 "\nsteps: 3\nhidden_efficiency: {gemm: 5}\n")
    assert load_scenario(p).hidden[OpClass.GEMM] == 5
    p.write_text(JOB + "hidden_efficiency: {gemm: 1.5}\n")
    with pytest.raises(InputError, match=r"hidden_efficiency\.gemm"):
        load_scenario(p)


def test_a_lengths_csv_longer_than_the_cap_needs_steps(tmp_path, monkeypatch):
    import nereus.sim.scenarios as S
    monkeypatch.setattr(S, "MAX_STEPS", 5)
    T.save_lengths(T.growth(8, seed=1), tmp_path / "len.csv")
    p = tmp_path / "run.yaml"
    p.write_text(JOB + "lengths: {csv: len.csv}\n")
    with pytest.raises(InputError, match="^steps"):
        load_scenario(p)
    p.write_text(JOB + "lengths: {csv: len.csv}\nsteps: 4\n")
    sc = load_scenario(p)
    assert sc.steps == 4 and len(sc.lengths) == 4


def test_the_drift_scenario_slows_what_its_plans_use():
    """Each drift period makes the plan that runs then slower (a drift on classes no plan
    uses would test nothing)."""
    from nereus.plan.search import best_plan
    from nereus.sim.truth import Truth

    sc = builtin("drift")
    truth = Truth(sc.job, sc.hidden, sc.drift, 0.0, sc.seed)
    pool = sc.job.pool.ids
    for period in {(p.start_step, p.end_step) for p in sc.drift.periods}:
        inside = (period[0] + period[1]) // 2
        mean, longest = sc.lengths.at(inside)
        plan = best_plan(truth.job_at(pool, mean, longest), sc.hidden)
        slow = truth.price(plan, pool, inside, mean, longest).step_s
        usual = truth.price(plan, pool, period[0] - 1, mean, longest).step_s
        assert slow > 1.02 * usual


def test_yaml_drift_factors_are_bounded(tmp_path):
    p = tmp_path / "run.yaml"
    (tmp_path / "drift.csv").write_text("start_step,end_step,op_class,factor\n0,3,gemm,50\n")
    p.write_text(JOB + "steps: 3\ndrift: {csv: drift.csv}\n")
    with pytest.raises(InputError, match=r"^drift: gemm .*above the h100-sxm-80gb's peak") as e:
        load_scenario(p)
    assert "\n" not in str(e.value)
    p.write_text(JOB + "steps: 3\ndrift: {congestion: {factor: 1.0e-300}}\n")
    with pytest.raises(InputError, match=rf"^drift\.congestion\.factor.*{T.MIN_DRIFT_FACTOR:g}"):
        load_scenario(p)
    p.write_text(JOB + "steps: 3\ndrift: {congestion: {factor: 3, op_classes: [gemm]}}\n")
    with pytest.raises(InputError, match=r"^drift: gemm"):
        load_scenario(p)


def _dying_worker(sim, sc, names, index, queue, logging_on):
    """Stands in for ``_worker`` in a forked child: the process with static dies (as on a
    segfault or the OOM killer) once the other is ready; the other never reports, and writes
    to the file named by ``NEREUS_TEST_MARK`` how it ended: "terminated" when the driver
    stops it, "slept" when it was left to run out a sleep far longer than any poll."""
    import os
    import signal
    import time
    mark = os.environ["NEREUS_TEST_MARK"]
    if "static" in names:
        while not os.path.exists(mark):   # the other is ready (or has died: the driver
            time.sleep(0.01)               # then reports that worker, and the test fails)
        os._exit(3)

    def end(how):
        with open(mark + ".tmp", "w") as f:
            f.write(how)
        os.replace(mark + ".tmp", mark)

    signal.signal(signal.SIGTERM, lambda *_: (end("terminated"), os._exit(0)))
    end("ready")
    time.sleep(120)
    end("slept")
    os._exit(0)


def test_a_dead_worker_process_is_an_error_not_a_hang(monkeypatch, tmp_path):
    import multiprocessing as mp

    import nereus.sim.scenarios as S
    if "fork" not in mp.get_all_start_methods():
        pytest.skip("worker processes need fork")
    mark = tmp_path / "sleeper"
    monkeypatch.setenv("NEREUS_TEST_MARK", str(mark))
    monkeypatch.setattr(S, "_worker", _dying_worker)
    monkeypatch.setattr(S, "WORKER_POLL_S", 0.05)
    sc = builtin("stationary", steps=3)
    with pytest.raises(RuntimeError, match=r"worker 1 \(static\) .*exit code 3"):
        S.run_scenario(sc, ["static", "oracle"], workers=2)
    assert mp.active_children() == []
    assert mark.read_text() == "terminated"         # stopped by the driver, not waited for


@pytest.mark.parametrize("line,field", [
    ("steps: '5'", "steps"), ("noise: '0.5'", "noise"), ("seed: true", "seed"),
    ("control: {gamma: '0.9'}", "control.gamma"),
    ("control: {warmup_steps: true}", "control.warmup_steps"),
    ("control: {length_window: 2.5}", "control.length_window"),
    ("restart: {checkpoint_interval_steps: '5'}", "restart.checkpoint_interval_steps"),
    ("lengths: {growth: {start: '500'}}", "lengths.growth.start"),
    ("availability: {churn: {changes: '3'}}", "availability.churn.changes"),
    ("availability: {constant: 'yes'}", "availability.constant"),
    ("hidden_efficiency: {gemm: '0.5'}", "hidden_efficiency.gemm"),
])
def test_yaml_numbers_and_switches_are_strict(tmp_path, line, field):
    p = tmp_path / "run.yaml"
    p.write_text(JOB + line + "\n")
    with pytest.raises(InputError, match=rf"^{field}: ") as e:
        load_scenario(p)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("line,field", [
    ("restart: {storage_write_gb_per_s_per_node: 1.0e-320}",
     "restart.storage_write_gb_per_s_per_node"),
    ("restart: {storage_read_gb_per_s_per_node: 1.0e-300}",
     "restart.storage_read_gb_per_s_per_node"),
    ("restart: {startup_s: 1.0e+308}", "restart.startup_s"),
    ("hidden_efficiency: {gemm: 5.0e-324}", "hidden_efficiency.gemm"),
])
def test_values_that_would_make_simulated_times_overflow_are_refused(tmp_path, line, field):
    """A write bandwidth of 1e-320 GB/s ran, and printed "mean_step_s": Infinity (not JSON);
    a GEMM efficiency of 5e-324 failed on an internal telemetry field after numpy's
    warnings."""
    p = tmp_path / "run.yaml"
    p.write_text(JOB + line + "\n")
    with pytest.raises(InputError, match=rf"^{field}: ") as e:
        load_scenario(p)
    assert "\n" not in str(e.value)


def test_yaml_ints_still_count_where_floats_are_expected(tmp_path):
    p = tmp_path / "run.yaml"
    p.write_text(JOB + "steps: 3\nnoise: 0\ncontrol: {gamma: 1, length_margin: 0}\n"
                 "restart: {startup_s: 60}\n"
                 "drift: {congestion: {length: [1, 2], op_classes: [gemm], factor: 1}}\n")
    sc = load_scenario(p)
    assert sc.noise == 0 and sc.control.gamma == 1.0 and sc.restart.startup_s == 60
    assert {p.op_class for p in sc.drift.periods} == {OpClass.GEMM}


@pytest.mark.parametrize("job,field", [
    ("{model: llama-3.1-8b, gpus: 0}", "job.gpus"),
    ("{model: llama-3.1-8b, gpus: 16, colour: red}", "job.colour"),
    ("{gpus: 16}", "job.model"),
    ("{model: llama-3.1-8b, gpus: 16, cluster: {devices_per_node: '8'}}",
     "job.cluster.devices_per_node"),
])
def test_errors_in_the_job_section_name_it(tmp_path, job, field):
    p = tmp_path / "run.yaml"
    p.write_text(f"job: {job}\nsteps: 3\n")
    with pytest.raises(InputError, match=rf"^{field}: ") as e:
        load_scenario(p)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("margin", ["1.0e+300", "1.5", "-0.1", "1e300"])
def test_length_margin_is_bounded(tmp_path, margin):
    p = tmp_path / "run.yaml"
    p.write_text(JOB + f"steps: 3\ncontrol: {{length_margin: {margin}}}\n")
    with pytest.raises(InputError, match=r"^control\.length_margin: ") as e:
        load_scenario(p)
    assert "\n" not in str(e.value)
    assert "0..1" in str(e.value) or "1.0e+300" in str(e.value)   # YAML reads 1e300 as text
    p.write_text(JOB + "steps: 3\ncontrol: {length_margin: 1.0}\n")
    assert load_scenario(p).control.length_margin == 1.0


@pytest.mark.parametrize("churn,field", [("{hours: 1.0e-300}", "hours"),
                                         ("{hours: 0.01}", "hours"), ("{changes: 0}", "changes"),
                                         ("{changes: 1000000000}", "changes")])
def test_churn_parameters_have_sane_bounds(tmp_path, churn, field):
    p = tmp_path / "run.yaml"
    p.write_text(JOB + f"steps: 3\navailability: {{churn: {churn}}}\n")
    with pytest.raises(InputError, match=rf"^availability\.churn\.{field}: ") as e:
        load_scenario(p)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("line,field", [
    ("availability: {churn: {min_nodes: 5}}", "availability.churn.min_nodes"),
    ("availability: {churn: {min_nodes: 2}}", "availability.churn.min_nodes"),
    ("availability: {spot: {start_tick: 99999999}}", "availability.spot.start_tick"),
    ("drift: {congestion: {op_classes: [gemm, flops]}}", "drift.congestion.op_classes"),
    # periods that slow nothing, or one class twice (its factor squared): accepted silently
    ("drift: {congestion: {op_classes: []}}", "drift.congestion.op_classes"),
    ("drift: {congestion: {op_classes: [gemm, p2p.intra, gemm]}}", "drift.congestion.op_classes"),
])
def test_errors_from_generated_traces_name_the_yaml_field(tmp_path, line, field):
    p = tmp_path / "run.yaml"
    p.write_text(JOB + "steps: 3\n" + line + "\n")
    with pytest.raises(InputError) as e:
        load_scenario(p)
    assert e.value.field == field and e.value.allowed
    assert "\n" not in str(e.value)


def test_an_unknown_device_in_the_job_section_names_its_field(tmp_path):
    p = tmp_path / "run.yaml"
    p.write_text("job: {model: llama-3.1-8b, gpus: 16, cluster: {device: tpu}}\nsteps: 3\n")
    with pytest.raises(InputError, match=r"^job\.cluster\.device: unknown device 'tpu' "
                                         r"\(allowed: h100-sxm-80gb"):
        load_scenario(p)


def test_the_default_scenario_says_its_pool_follows_the_trace_and_how_it_starts():
    """The default job does not run on 16 GPUs from the start: the real spot trace gives 3,
    then 8, 7 and 16 (up to 16). Its description and its job note say so, from the trace."""
    sc = builtin("default")
    av = sc.availability
    assert [len(p) for p in av.pools[:4]] == [3, 8, 7, 16]
    assert max(len(p) for p in av.pools) == 16
    start = "3 GPUs for the first 5 minutes, then 8 from minute 5, 7 from minute 10, 16 from " \
            "minute 15"
    for text in (sc.description, sc.notes["job"]):
        assert "up to 16" in text and start in text, text
        assert "on 16 H100s" not in text
    assert "waited out" in sc.description
    cut = with_overrides(sc, steps=50)
    assert cut.description == sc.description  # the trace it describes is the same


def _job(gpus: str, nodes: str = "") -> str:
    return (f"job: {{model: llama-3.1-8b, algo: ppo, gpus: {gpus}, cluster: {{device: "
            f"h100-sxm-80gb, devices_per_node: 8{nodes}}}}}\nsteps: 8\n")


def test_a_spot_trace_gives_the_job_at_most_the_gpus_it_asked_for(tmp_path):
    """The spot trace counts up to 16 instances: a 12-GPU job held 16 (the cluster's two
    nodes), and the oracle ran on all 16. A list of ids gets those GPUs, not the first ones."""
    p = tmp_path / "run.yaml"
    p.write_text(_job("12") + "availability: {spot: {}}\n")
    sc = load_scenario(p)
    assert max(len(q) for q in sc.availability.pools) == 12
    assert sc.availability.ids() == set(range(12))     # so no policy plans on more
    p.write_text(_job("[0, 1, 2, 3, 8, 9, 10, 11]") + "availability: {spot: {}}\n")
    sc = load_scenario(p)
    assert sc.availability.ids() == {0, 1, 2, 3, 8, 9, 10, 11}
    assert "onto the job's GPUs 0-3,8-11" in sc.availability.source


@pytest.mark.parametrize("gpus,nodes", [("12", ""), ("8", ", nodes: 2"),
                                        ("[0, 1, 2, 3, 8, 9, 10, 11]", "")])
def test_whole_node_churn_needs_a_job_on_two_or_more_whole_nodes(tmp_path, gpus, nodes):
    """Nodes leave whole: a job on part of a node, or on one node (even of a larger cluster,
    whose other nodes it did not ask for), has no whole-node churn to follow."""
    p = tmp_path / "run.yaml"
    p.write_text(_job(gpus, nodes) + "availability: {churn: {}}\n")
    with pytest.raises(InputError, match=r"^job\.gpus: whole-node churn needs whole nodes") as e:
        load_scenario(p)
    assert "\n" not in str(e.value) and "multiple of 8 from 16" in str(e.value)


def test_whole_node_churn_moves_only_the_jobs_nodes(tmp_path):
    """Churn ran over every node of the cluster: a 16-GPU job on a 4-node cluster held up to
    32 GPUs. It now churns the job's own nodes, wherever they are."""
    p = tmp_path / "run.yaml"
    p.write_text(_job("16", ", nodes: 4") + "availability: {churn: {}}\n")
    av = load_scenario(p).availability
    assert av.ids() == set(range(16)) and av.changes() > 0
    ids = [*range(8, 16), *range(24, 32)]
    p.write_text(_job(str(ids), ", nodes: 4") + "availability: {churn: {}}\n")
    av2 = load_scenario(p).availability
    assert av2.ids() == set(ids) and av2.times == av.times
    assert all(len(q) in (8, 16) and len({g // 8 for g in q}) == len(q) // 8
               for q in av2.pools)


def test_a_spot_trace_of_your_own_in_the_shipped_format(tmp_path):
    """The issue asks for spot traces read in the format of the shipped one; only the shipped
    file could be read. The same file given as a user's gives the same pool."""
    import json

    from nereus.sim.traces import SPOT_TRACE, spot_counts

    counts, tick = spot_counts()
    mine = tmp_path / "mine.json"
    mine.write_text(json.dumps({"metadata": {"gap_seconds": tick}, "data": counts}))
    p = tmp_path / "run.yaml"
    p.write_text(_job("16") + "availability: {spot: {start_tick: 3372, file: mine.json}}\n")
    sc = load_scenario(p)
    p.write_text(_job("16") + "availability: {spot: {start_tick: 3372}}\n")
    shipped = load_scenario(p)
    assert (sc.availability.times, sc.availability.pools) == (shipped.availability.times,
                                                              shipped.availability.pools)
    assert f"spot trace {mine} from tick 3372" in sc.availability.source
    assert SPOT_TRACE in shipped.availability.source


def test_a_spot_file_shorter_than_the_window_replays_whole(tmp_path):
    """Regression: a 10-tick file without start_tick failed ("no 360-tick window runs 80% of
    the time"); it is replayed from its first tick, and one that can't be says what to set."""
    import json

    (tmp_path / "short.json").write_text(json.dumps(
        {"metadata": {"gap_seconds": 300}, "data": [16, 16, 8, 16, 16, 8, 16, 16, 16, 16]}))
    p = tmp_path / "run.yaml"
    p.write_text(_job("16") + "availability: {spot: {file: short.json}}\n")
    av = load_scenario(p).availability
    assert [len(q) for q in av.pools] == [16, 8, 16, 8, 16]
    assert av.times == (0.0, 600.0, 900.0, 1500.0, 1800.0)
    assert "from tick 0" in av.source
    (tmp_path / "short.json").write_text(json.dumps(
        {"metadata": {"gap_seconds": 300}, "data": [0, 16, 16]}))
    with pytest.raises(InputError) as e:
        load_scenario(p)
    assert e.value.field == "availability.spot.start_tick" and "0..2" in str(e.value)


@pytest.mark.parametrize("data,field", [
    ({"metadata": {"gap_seconds": 0}, "data": [1]}, "metadata.gap_seconds"),
    ({"metadata": {}, "data": [1]}, "metadata.gap_seconds"),
    ({"metadata": {"gap_seconds": 300}, "data": []}, "data"),
    ({"metadata": {"gap_seconds": 300}, "data": [4, -1]}, "data.1"),
    ({"metadata": {"gap_seconds": 300}, "data": [4, 2.5]}, "data.1"),
    ([1, 2], ""),  # not an object at all: the file is what is wrong
])
def test_a_bad_spot_trace_file_names_its_field(tmp_path, data, field):
    import json

    (tmp_path / "bad.json").write_text(json.dumps(data))
    p = tmp_path / "run.yaml"
    p.write_text(_job("16") + "availability: {spot: {start_tick: 0, file: bad.json}}\n")
    with pytest.raises(InputError) as e:
        load_scenario(p)
    assert e.value.field == "availability.spot.file" + (f".{field}" if field else ""), e.value
    assert "\n" not in str(e.value)


# ---------------------------------------------------- lengths past the model's context window
@pytest.mark.parametrize("lengths, field", [
    ("{growth: {start: 500, end: 200000}}", "lengths.growth.end"),
    ("{growth: {start: 200000, end: 500}}", "lengths.growth.start"),
    ("{stationary: {length: 100000}}", "lengths.stationary.length"),
])
def test_generated_lengths_past_the_context_window_name_their_field(tmp_path, lengths, field):
    """It was "no plan fits ... actor_train fits nowhere ... 99.9 GiB": a memory problem, not
    the context window that ``nereus plan`` names for the same lengths."""
    p = tmp_path / "run.yaml"
    p.write_text(_job("16") + f"lengths: {lengths}\n")
    with pytest.raises(InputError) as e:
        load_scenario(p)
    assert e.value.field == field, e.value
    msg = str(e.value)
    assert "context window of 131072 tokens" in msg and "prompt 512 + longest response" in msg
    assert "up to 130560 tokens with a 512-token prompt" in msg and "\n" not in msg
    assert "GiB" not in msg


def test_a_lengths_row_past_the_context_window_names_its_file_and_row(tmp_path):
    (tmp_path / "l.csv").write_text("step,response_len_mean,response_len_max\n"
                                    "0,500,700\n1,500,200000\n")
    p = tmp_path / "run.yaml"
    p.write_text(_job("16").replace("steps: 8\n", "") + "lengths: {csv: l.csv}\n")
    with pytest.raises(InputError) as e:
        load_scenario(p)
    assert e.value.field == f"lengths ({tmp_path / 'l.csv'}) row 3.response_len_max", e.value
    assert "512 + longest response 200000 = 200512 tokens exceed llama-3.1-8b's context " \
           "window of 131072 tokens" in str(e.value)


def test_lengths_at_the_context_window_are_accepted(tmp_path):
    (tmp_path / "l.csv").write_text("step,response_len_mean,response_len_max\n"
                                    "0,500,700\n1,500,130560\n")
    p = tmp_path / "run.yaml"
    p.write_text(_job("16").replace("steps: 8\n", "") + "lengths: {csv: l.csv}\n")
    assert load_scenario(p).lengths.longest == (700, 130560)


@pytest.mark.parametrize("lengths, field", [
    ("{stationary: {length: 0.001}}", "lengths.stationary.length"),
    ("{growth: {start: 0.5}}", "lengths.growth.start"),
    ("{growth: {end: 0.9}}", "lengths.growth.end"),
])
def test_generated_lengths_below_one_token_are_refused(tmp_path, lengths, field):
    """As a lengths CSV's mean (1 <= mean): 0.001 tokens was accepted (and clamped to 1)."""
    p = tmp_path / "run.yaml"
    p.write_text(_job("16") + f"lengths: {lengths}\n")
    with pytest.raises(InputError) as e:
        load_scenario(p)
    assert e.value.field == field and "1..1,048,576" in str(e.value), e.value
    p.write_text(_job("16") + "lengths: {stationary: {length: 1}}\n")
    assert min(load_scenario(p).lengths.mean) >= 1


def test_overlapping_congestion_periods_name_periods_and_length_not_the_factor(tmp_path):
    """It was "allreduce.inter at step 0: combined factor 0 is below 0.01": a factor the
    user never wrote (they set 0.4; overlapping periods multiplied it away)."""
    p = tmp_path / "run.yaml"
    p.write_text(_job("16") + "drift: {congestion: {length: [50000, 90000], periods: 100000}}\n")
    with pytest.raises(InputError) as e:
        load_scenario(p)
    msg = str(e.value)
    assert e.value.field == "drift.congestion", msg
    assert "periods: 100000 and length: [50000, 90000]" in msg and "overlap at step 0" in msg
    assert "0.4^" in msg and "(allowed: at most 5 overlapping periods at factor 0.4" in msg
    assert "combined factor 0 " not in msg and "\n" not in msg
    p.write_text(_job("16").replace("steps: 8", "steps: 1000")
                 + "drift: {congestion: {length: [100, 300], periods: 20}}\n")
    with pytest.raises(InputError, match=r"^drift\.congestion: .*6 congestion periods of up to "
                       r"300 steps overlap at step \d+, so their factors multiply to 0\.4\^6"):
        load_scenario(p)
    # a few overlaps whose product stays above the floor are allowed
    p.write_text(_job("16").replace("steps: 8", "steps: 1000")
                 + "drift: {congestion: {length: [100, 300], periods: 5}}\n")
    assert load_scenario(p).drift.periods


@pytest.mark.parametrize("data, field, words", [
    ([16, 16, 8], "availability.spot.file",
     ("bad.json holds a list, not an object with metadata and data (allowed: a JSON object "
     '{"metadata": {"gap_seconds": s}, "data": [n, n, ...]}, as skypilot-org/spot-traces')),
    ({"data": [16, 8]}, "availability.spot.file.metadata", "bad.json: metadata is missing"),
    ({"metadata": {}, "data": [16]}, "availability.spot.file.metadata.gap_seconds",
     "metadata.gap_seconds is missing"),
    ({"metadata": {"gap_seconds": None}, "data": [16]},
     "availability.spot.file.metadata.gap_seconds", "metadata.gap_seconds is null"),
    ({"metadata": {"gap_seconds": "300"}, "data": [16]},
     "availability.spot.file.metadata.gap_seconds", 'gap_seconds is the string "300"'),
    ({"metadata": {"gap_seconds": 300}}, "availability.spot.file.data", "data is missing"),
    ({"metadata": {"gap_seconds": 300}, "data": [16, None, 8]}, "availability.spot.file.data.1",
     "data[1] is null, not an instance count"),
])
def test_a_bad_spot_trace_says_what_the_file_holds_in_json_terms(tmp_path, data, field, words):
    """Python's words were printed: "None is not a tick length" for a top-level list, a
    missing key or a JSON null."""
    import json

    (tmp_path / "bad.json").write_text(json.dumps(data))
    p = tmp_path / "run.yaml"
    p.write_text(_job("16") + "availability: {spot: {start_tick: 0, file: bad.json}}\n")
    with pytest.raises(InputError) as e:
        load_scenario(p)
    assert e.value.field == field, e.value
    assert words in str(e.value) and "None" not in str(e.value)
    assert "(allowed: " in str(e.value) and "\n" not in str(e.value)


def test_notes_and_errors_count_in_the_singular_for_one():
    from nereus.sim.scenarios import pool_start
    assert pool_start(T.constant([0])) == "1 GPU throughout"
    assert pool_start(T.Availability((0.0, 60.0), ((0,), (0, 1)))) == \
        "1 GPU for the first 1 minute, then 2 from minute 1"
    sc = with_overrides(builtin("stationary"), steps=1)
    assert "its first 1 step (--steps" in sc.notes["lengths"]
    assert T.growth(1, seed=0).source.startswith("generated: linear growth 500->8000 tokens "
                                                 "over 1 step,")


def test_a_grpo_job_needs_groups_as_nereus_plan_says(tmp_path):
    """nereus plan refused a GRPO job with one response per prompt; the same job in a
    scenario ran."""
    p = tmp_path / "run.yaml"
    p.write_text(_job("16").replace("algo: ppo", "algo: grpo"))
    with pytest.raises(InputError, match=r"^job\.workload\.responses_per_prompt: 1 response "
                       r"per prompt leaves grpo no group .* \(allowed: >= 2 for grpo\)$"):
        load_scenario(p)
    p.write_text(_job("16").replace("algo: ppo", "algo: grpo, workload: "
                                    "{responses_per_prompt: 4, prompts_per_step: 128}"))
    assert load_scenario(p).job.workload.responses_per_prompt == 4


def test_an_availability_file_gives_the_job_at_most_the_gpus_it_asked_for(tmp_path):
    """A 12-GPU job held all 16 GPUs the file lists, and a 2-GPU job was refused because the
    file lists GPU 15 ('device id 15 is above 7'): job.gpus is what the job holds of it."""
    (tmp_path / "pool.csv").write_text("time_s,gpus\n0,0-15\n3600,0-7\n10800,0-15\n")
    p = tmp_path / "run.yaml"
    p.write_text(_job("12") + "availability: {csv: pool.csv}\n")
    av = load_scenario(p).availability
    assert av.pools == (tuple(range(12)), tuple(range(8)), tuple(range(12)))
    assert "the job's GPUs of it (0-11, job.gpus)" in av.source
    p.write_text(_job("2") + "availability: {csv: pool.csv}\n")
    assert load_scenario(p).availability.ids() == {0, 1}
    p.write_text(_job("[8, 9, 10, 11]") + "availability: {csv: pool.csv}\n")
    assert load_scenario(p).availability.pools == ((8, 9, 10, 11), (), (8, 9, 10, 11))
    p.write_text(_job("16") + "availability: {csv: pool.csv}\n")
    assert "job's GPUs" not in load_scenario(p).availability.source  # all of it: as read


def test_an_availability_file_without_the_jobs_gpus_names_job_gpus(tmp_path):
    (tmp_path / "pool.csv").write_text("time_s,gpus\n0,0-7\n600,0-3\n")
    p = tmp_path / "run.yaml"
    p.write_text(_job("[8, 9, 10, 11]") + "availability: {csv: pool.csv}\n")
    with pytest.raises(InputError, match=r"^job\.gpus: the job's GPUs 8-11 are in no row of "
                       r"the availability trace .*\(allowed: GPUs the trace lists, e\.g\. "
                       r"0-7\)$"):
        load_scenario(p)
