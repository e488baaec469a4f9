"""``nereus transition --execute``: a run that fails ends in one line and exit code 4; one
that SIGTERM stops, in one line and exit code 143."""

import signal
import sys

import pytest
from typer.testing import CliRunner

from nereus.cli import app
from nereus.errors import EXIT_RUN_FAILED, EXIT_TERMINATED
from nereus.runtime import demo
from nereus.runtime.memory import CapacityError
from nereus.transition.instances import paper_example_b

runner = CliRunner()


def _execute_raising(monkeypatch, tmp_path, error: BaseException):
    """``nereus transition cur.json tgt.json --execute`` (the paper's example b) whose run
    raises ``error``."""
    def boom(*args, **kwargs):
        raise error

    monkeypatch.setattr(demo, "execute_transition", boom)
    paths = []
    for name, plan in zip(("cur.json", "tgt.json"), paper_example_b()):
        paths.append(tmp_path / name)
        paths[-1].write_text(plan.to_json())
    return runner.invoke(app, ["transition", *map(str, paths), "--model", "llama-3.1-8b",
                               "--execute"])


@pytest.mark.parametrize("error", [CapacityError(3, 9 << 30, 0, 8 << 30, "a Merge"),
                                   RuntimeError("a bug")])
def test_a_failed_run_is_one_line_and_exit_4(monkeypatch, tmp_path, error) -> None:
    r = _execute_raising(monkeypatch, tmp_path, error)
    if isinstance(error, CapacityError):
        assert r.exit_code == EXIT_RUN_FAILED == 4, r.output
        err = r.stderr.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: the transition did not run")
        assert "CapacityError" in err[0] and "worker 3" in err[0]
        assert "Traceback" not in r.output
    else:  # a bug is not dressed up as a user-facing failure
        assert isinstance(r.exception, RuntimeError) and "a bug" in str(r.exception)


def _in_a_worker(error: BaseException) -> BaseException:
    """``error`` as Ray raises it on the driver when a worker's call raised it: its task name
    coloured, its traceback attached."""
    from ray.exceptions import RayTaskError

    try:
        raise error
    except type(error):
        import traceback
        tb = traceback.format_exc()
    return RayTaskError("Worker.call", tb, error, proctitle="\x1b[36mray::Worker.call()"
                        "\x1b[39m").as_instanceof_cause()


@pytest.mark.parametrize("wrap", ["task", "batch"])
def test_a_workers_error_keeps_its_reason_in_the_one_line(monkeypatch, tmp_path, wrap) -> None:
    """A CapacityError raised inside a worker reached the line as Ray's coloured task name,
    its reason (what the worker needed and held) dropped; in a batch, with Ray's whole
    traceback in the message."""
    from nereus.runtime.workers import WorkerCallsFailed

    inner = CapacityError(3, 9 << 30, 0, 8 << 30, "a Merge")
    error = _in_a_worker(inner)
    if wrap == "batch":
        error = WorkerCallsFailed({3: error}, {})

    r = _execute_raising(monkeypatch, tmp_path, error)
    assert r.exit_code == EXIT_RUN_FAILED, r.output
    err = r.stderr.strip().splitlines()
    assert len(err) == 1, r.stderr
    assert str(inner) in err[0] and "CapacityError" in err[0]
    assert "\x1b" not in err[0] and "ray::" not in err[0] and "Traceback" not in err[0]


def test_ctrl_c_mid_transition_is_an_interruption_with_what_stayed_intact(monkeypatch,
                                                                           tmp_path) -> None:
    """Ctrl-C during the run reached the command as a TransitionFailed: 'did not run to its
    end' and exit 4, where Ctrl-C anywhere else is 'interrupted' and exit 130."""
    from nereus.runtime.faults import FaultReport, TransitionFailed
    from nereus.transition.emu import phi_stage
    from nereus.transition.instances import make_job

    cur, _ = paper_example_b()
    (kept,) = phi_stage(make_job("llama-3.1-8b", 32), cur.stages[0])
    report = FaultReport(frozenset(), {}, {kept.stage: (kept,)}, (),
                         cause="KeyboardInterrupt: ")

    stopped = TransitionFailed(report)
    stopped.__cause__ = KeyboardInterrupt()  # as the executor raises it: from the interrupt
    r = _execute_raising(monkeypatch, tmp_path, stopped)
    assert r.exit_code == 130, r.output
    assert r.stderr == f"error: interrupted mid-transition; intact units: {kept.id}\n"


def test_ctrl_c_while_ray_starts_waits_for_the_start_and_a_second_acts_at_once() -> None:
    """Shutting down a half-started Ray crashed the process (SIGSEGV) and left its agents
    running: a first Ctrl-C is held until the start ends, a second is not."""
    import os
    import signal

    from nereus.interrupts import ctrl_c_deferred

    # Python's own handler, whatever this process inherited (a shell's background job
    # ignores SIGINT)
    outer = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with ctrl_c_deferred() as interrupted:
            assert not interrupted()
            os.kill(os.getpid(), signal.SIGINT)  # delivered here, held
            assert interrupted()
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        with pytest.raises(KeyboardInterrupt), ctrl_c_deferred():
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, outer)


def test_a_long_fault_report_keeps_the_intact_units_at_its_end(monkeypatch, tmp_path) -> None:
    """Cut to 300 characters, the line lost 'intact units: ...', which comes last."""
    from nereus.runtime.faults import FaultReport, TransitionFailed
    from nereus.transition.emu import phi_stage
    from nereus.transition.instances import make_job

    (kept,) = phi_stage(make_job("llama-3.1-8b", 32), paper_example_b()[0].stages[0])
    why = "CapacityError: " + "needs more than it holds " * 10
    report = FaultReport(frozenset(), {0: {3: why, 4: why}}, {kept.stage: (kept,)}, ())
    r = _execute_raising(monkeypatch, tmp_path, TransitionFailed(report))
    assert r.exit_code == EXIT_RUN_FAILED, r.output
    assert r.stderr.count("\n") == 1 and r.stderr.endswith(f"intact units: {kept.id})\n")


def test_an_error_without_a_message_is_named_alone(monkeypatch, tmp_path) -> None:
    from nereus.runtime.comm import GroupAborted

    r = _execute_raising(monkeypatch, tmp_path, GroupAborted(""))
    assert r.stderr == "error: the transition did not run to its end (GroupAborted)\n"


def test_an_ignored_sigint_stays_ignored_while_ray_starts() -> None:
    """Under nohup or `cmd &` SIGINT is ignored; holding it turned it into a Ctrl-C."""
    import os
    import signal

    from nereus.interrupts import ctrl_c_deferred

    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with ctrl_c_deferred() as interrupted:
            os.kill(os.getpid(), signal.SIGINT)
            assert not interrupted()
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, before)


def _terminated_inside_ray() -> SystemError:
    """What SIGTERM's ``Terminated`` reaches the command as where the signal found Ray's
    compiled code calling back into Python (seen: ``ray.get`` deserialising a result)."""
    from nereus.interrupts import Terminated

    try:
        raise Terminated
    except Terminated as t:
        try:
            raise SystemError("<built-in method __new__ of type object> returned a result "
                              "with an exception set") from t
        except SystemError as e:
            return e


@pytest.mark.parametrize("error", [
    _terminated_inside_ray(),
    # a run the executor stopped and reported, whose cause was the signal
    demo.RunFailed("the transition did not run to its end (TransitionFailed): stopped"),
])
def test_sigterm_mid_run_is_one_line_and_exit_143(monkeypatch, tmp_path, error) -> None:
    """SIGTERM printed Ray's native crash dump ('*** SIGTERM received at time=...') and
    exited 1, the code for a state that differs; where the signal surfaced inside Ray, a
    traceback of a SystemError. It now ends as Ctrl-C does, with its own code."""
    if isinstance(error, demo.RunFailed):
        error.__context__ = _terminated_inside_ray()
    r = _execute_raising(monkeypatch, tmp_path, error)
    assert r.exit_code == EXIT_TERMINATED == 143, r.output
    assert r.stderr == "error: terminated\n", r.output


@pytest.fixture
def default_sigterm():
    """SIGTERM's handler as a new nereus process has it (the default), whatever an earlier
    test's real ray.init left in this pytest process; put back afterwards."""
    before = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    yield
    signal.signal(signal.SIGTERM, before)


def test_ray_init_leaves_the_callers_sigterm_handler(monkeypatch, default_sigterm) -> None:
    """ray.init puts in its own SIGTERM handler (and its core worker a native one, which
    prints a crash dump): the command's, which stops the workers, is put back."""
    from nereus.interrupts import sigterm_raises
    from nereus.runtime import workers

    def ray_init(**kwargs):  # what ray.init does to SIGTERM's handler
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(signum))

    monkeypatch.setattr(workers.ray, "is_initialized", lambda: False)
    monkeypatch.setattr(workers.ray, "init", ray_init)
    with sigterm_raises():
        mine = signal.getsignal(signal.SIGTERM)
        workers._init_ray(None, 1, "slot")
        assert signal.getsignal(signal.SIGTERM) is mine


def test_sigterm_while_ray_starts_is_terminated_and_stops_ray(monkeypatch, default_sigterm) -> None:
    """A SIGTERM inside ray.init meets Ray's handler, sys.exit(15): exit 15, and Ray's
    agents left running. It is the command's Terminated, after Ray is shut down."""
    from nereus.interrupts import Terminated, sigterm_raises
    from nereus.runtime import workers

    def ray_init(**kwargs):
        raise SystemExit(signal.SIGTERM)

    stopped: list[bool] = []
    monkeypatch.setattr(workers.ray, "is_initialized", lambda: False)
    monkeypatch.setattr(workers.ray, "init", ray_init)
    monkeypatch.setattr(workers.ray, "shutdown", lambda: stopped.append(True))
    with pytest.raises(Terminated), sigterm_raises():
        workers._init_ray(None, 1, "slot")
    assert stopped == [True]
