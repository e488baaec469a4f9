"""A runner closes its groups on every live worker whatever failed before, and never hides
the error that made the caller leave: checked against a stand-in pool (no Ray, no groups)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import pytest
import ray

from nereus.cost.candidate import Layout
from nereus.engine import remote
from nereus.engine.runner import StageRunner
from nereus.runtime import comm
from nereus.runtime.comm import StoreAddress
from nereus.runtime.workers import WorkerCallsFailed
from nereus.transition.emu import Emu, Holds

# two replicas of pp = 2: a pp group per replica, a dp group per position
EMUS = [Emu(f"actor_train/{i}", "actor_train", "actor", Layout(1, 2), gpus, Holds.THETA_OMEGA)
        for i, gpus in enumerate([(0, 1), (2, 3)])]


@dataclass(frozen=True)
class _Info:
    node_id: str = "node-0"
    device: str = "cpu"


class _Rendezvous:
    address = StoreAddress("127.0.0.1", 1)
    timeout_s = 10.0


class _Pool:
    """Runs nothing; records each call by worker-side function, and fails the calls of
    ``dead`` workers (the actor died) and of ``fail[fn]`` workers (the call raised)."""

    def __init__(self, dead: set[int] = frozenset(),
                 fail: Mapping[Callable[..., Any], set[int]] | None = None) -> None:
        self.dead = set(dead)
        self.fail = dict(fail or {})
        self.calls: list[tuple[Callable[..., Any], int, tuple[Any, ...]]] = []

    device_ids = (0, 1, 2, 3)

    def infos(self) -> dict[int, _Info]:
        return {d: _Info() for d in self.device_ids}

    def run(self, calls: Mapping[int, tuple[Callable[..., Any], tuple[Any, ...]]],
            timeout_s: float | None = None,
            release: Mapping[int, tuple[Callable[..., Any], tuple[Any, ...]]] | None = None
            ) -> dict[int, Any]:
        results: dict[int, Any] = {}
        errors: dict[int, BaseException] = {}
        for d, (fn, args) in calls.items():
            self.calls.append((fn, d, args))
            if d in self.dead:
                errors[d] = ray.exceptions.RayActorError()
            elif d in self.fail.get(fn, ()):
                errors[d] = RuntimeError(f"{fn.__name__} failed on worker {d}")
            elif fn is comm._join_all:
                results[d] = {s.name: 0.0 for s in args[0]}
            else:
                results[d] = None
        if errors:
            for d, (fn, args) in (release or {}).items():   # every call here has ended
                self.calls.append((fn, d, args))
            raise WorkerCallsFailed(errors, results)
        return results

    def left(self) -> dict[int, set[str]]:
        """The groups each worker was told to leave."""
        out: dict[int, set[str]] = {}
        for fn, d, args in self.calls:
            if fn is comm._leave_all:
                out.setdefault(d, set()).update(args[0])
        return out

    def called(self, fn: Callable[..., Any]) -> set[int]:
        return {d for f, d, _ in self.calls if f is fn}


def _groups_of(runner: StageRunner) -> dict[int, set[str]]:
    out: dict[int, set[str]] = {}
    for name, members in runner.groups.items():
        for d in members:
            out.setdefault(d, set()).add(name)
    return out


def test_close_skips_a_dead_worker_and_still_closes_the_others_groups() -> None:
    pool = _Pool()
    runner = StageRunner(pool, EMUS, _Rendezvous())
    want = _groups_of(runner)
    assert set(want) == {0, 1, 2, 3}
    pool.dead = {3}
    runner.close()  # a dead worker has nothing to clean up: no error
    assert pool.left() == {d: want[d] for d in (0, 1, 2)}
    assert runner.groups == {}


def test_an_error_leaving_the_with_block_is_not_replaced_by_a_failed_close() -> None:
    pool = _Pool(fail={remote.detach: {1}})
    with pytest.raises(ValueError, match="the step failed") as info, \
            StageRunner(pool, EMUS, _Rendezvous()) as runner:
        want = _groups_of(runner)
        raise ValueError("the step failed")
    assert any("close() failed as well" in n for n in info.value.__notes__)
    assert pool.left() == {d: want[d] for d in (0, 2, 3)}  # worker 1 is stuck: not queued


def test_close_reports_a_live_worker_that_could_not_detach_after_closing_the_rest() -> None:
    pool = _Pool()
    runner = StageRunner(pool, EMUS, _Rendezvous())
    want = _groups_of(runner)
    pool.fail = {remote.detach: {2}}
    with pytest.raises(WorkerCallsFailed, match="worker 2"):
        runner.close()
    assert pool.left() == {d: want[d] for d in (0, 1, 3)}


def test_a_runner_that_fails_to_open_its_groups_closes_what_was_opened() -> None:
    pool = _Pool(fail={comm._join_all: {3}})
    with pytest.raises(WorkerCallsFailed, match="_join_all failed on worker 3"):
        StageRunner(pool, EMUS, _Rendezvous())
    assert pool.called(comm._leave_all) == {0, 1, 2, 3}
    assert pool.called(remote.attach) == set()


def test_a_runner_that_fails_to_attach_closes_its_groups() -> None:
    pool = _Pool(fail={remote.attach: {1}})
    with pytest.raises(WorkerCallsFailed, match="attach failed on worker 1"):
        StageRunner(pool, EMUS, _Rendezvous())
    assert pool.called(comm._leave_all) == {0, 1, 2, 3}


def test_a_pipeline_gets_a_second_communicator_for_its_gradients() -> None:
    """Each PP group is opened twice, activations and gradients, with the same members in the
    same rank order, and every worker is attached to both (NCCL would deadlock 1F1B on one)."""
    pool = _Pool()
    runner = StageRunner(pool, EMUS, _Rendezvous())
    pp = {n: m for n, m in runner.groups.items() if "/pp/" in n}
    grad = {n: m for n, m in runner.groups.items() if "/ppg/" in n}
    assert sorted(pp.values()) == sorted(grad.values()) == [(0, 1), (2, 3)]
    attached = {d: args[3] for fn, d, args in pool.calls if fn is remote.attach}
    assert set(attached) == {0, 1, 2, 3}
    for names in attached.values():
        assert names.pp in pp and names.pp_grad in grad
        assert pp[names.pp] == grad[names.pp_grad]
    runner.close()


def test_after_a_failed_operation_the_runner_refuses_the_next_until_made_anew() -> None:
    """A replica whose step raised left its peers in a collective that fails at the
    communicators' timeout; every later step on those groups failed at once with gloo's
    'connection closed by peer', which reads as a crashed worker. The runner now refuses them
    itself, naming the first failure, and still closes every group."""
    import torch

    from nereus.engine.batch import Batch
    from nereus.engine.runner import RunnerFailed

    pool = _Pool(fail={remote.forward: {0}})
    runner = StageRunner(pool, EMUS, _Rendezvous())
    batch = Batch(torch.ones(2, 4, dtype=torch.long), None)
    with pytest.raises(WorkerCallsFailed, match="forward failed on worker 0"):
        runner.forward(batch, 1)
    want = _groups_of(runner)
    released = {d: set(args[1]) for fn, d, args in pool.calls if fn is remote.release}
    assert released == want  # each worker left its groups as its call ended: peers are free
    asked = len(pool.calls)
    with pytest.raises(RunnerFailed, match=r"^actor_train: an earlier operation failed "
                       r"\(forward: 1 worker call\(s\) failed; worker 0: RuntimeError: "
                       r"forward failed on worker 0\).*make a new StageRunner$"):
        runner.forward(batch, 1)
    with pytest.raises(RunnerFailed, match="an earlier operation failed"):
        runner.full_logits(batch)
    assert len(pool.calls) == asked  # no worker was asked
    runner.close()
    assert pool.left() == want

