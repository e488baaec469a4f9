"""A ``Group``'s calls on gloo between two members in this process (threads; no worker
processes): point-to-point, and an Extend whose group is aborted before its data settled."""

from __future__ import annotations

import datetime
import threading
from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist

from nereus.runtime.comm import Group, GroupSpec, StoreAddress, _make_backend

TIMEOUT_S = 20.0


def _pair() -> list[Group]:
    store = dist.HashStore()
    spec = GroupSpec("p2p", StoreAddress("127.0.0.1", 0), (0, 1), "p2p/", TIMEOUT_S)
    groups: dict[int, Group] = {}

    def join(rank: int) -> None:
        backend = _make_backend(dist.PrefixStore(spec.prefix, store), rank, 2,
                                torch.device("cpu"), datetime.timedelta(seconds=TIMEOUT_S),
                                "127.0.0.1")
        groups[rank] = Group(spec, rank, backend, torch.device("cpu"), 0.0)

    ts = [threading.Thread(target=join, args=(r,), daemon=True) for r in (0, 1)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=TIMEOUT_S)
    if set(groups) != {0, 1}:
        for g in groups.values():  # the member that formed releases its port
            g.close()
        raise AssertionError("the pair did not form")
    return [groups[0], groups[1]]


@pytest.fixture()
def pair() -> Iterator[list[Group]]:
    """Two joined members; both closed after the test, a failing one included, so a failure
    does not leave their listening ports behind (closing again is a no-op)."""
    groups = _pair()
    try:
        yield groups
    finally:
        for g in groups:
            g.close()


def test_send_and_recv_return_once_the_message_passed(pair: list[Group]) -> None:
    """Gloo reports a send or receive complete only inside ``wait``: polling the work alone
    never ends, so these calls hung until the group was aborted."""
    g0, g1 = pair
    got = torch.zeros(1000)
    errors: list[BaseException] = []

    def run(fn: object) -> None:
        try:
            fn()  # type: ignore[operator]
        except BaseException as e:  # noqa: BLE001 - checked below
            errors.append(e)

    ts = [threading.Thread(target=run, args=(lambda: g0.send(torch.arange(1000.0), 1, 7),),
                           daemon=True),
          threading.Thread(target=run, args=(lambda: g1.recv(got, 0, 7),), daemon=True)]
    try:
        for t in ts:
            t.start()
        for t in ts:
            t.join(timeout=TIMEOUT_S / 2)
        hung = any(t.is_alive() for t in ts)
    finally:
        if any(t.is_alive() for t in ts):  # unblock a hung call before failing
            g0.abort()
            g1.abort()
            for t in ts:
                t.join(timeout=TIMEOUT_S)
    assert not hung, "send / recv did not return"
    assert not errors and torch.equal(got, torch.arange(1000.0))
    assert g0.idle() and g1.idle()


def test_an_extend_whose_group_was_aborted_before_its_data_settled_holds_nothing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """On NCCL a collective only enqueues, and an abort ends a blocked kernel early: the stream
    then drains as if it had finished. Simulated here on gloo (an abort that lands while the
    members wait on the stream): neither member may take the received buffer for a complete
    unit; the receiver frees it, the sender keeps its source."""
    from nereus.runtime import movement as mv
    from nereus.runtime.comm import GroupAborted, Rendezvous
    from nereus.runtime.state import StateSpec
    from nereus.runtime.workers import WorkerContext
    from nereus.spec.model import MODEL_PRESETS

    spec = StateSpec(MODEL_PRESETS["tiny-llama"])
    ctxs = [WorkerContext(d, torch.device("cpu"), 1 << 30) for d in (0, 1)]
    mv.place_seeded(ctxs[0], "src", spec, (1, 1), (0, 0), seed=3)
    held = [c.memory.stats().held for c in ctxs]

    def synchronize_then_aborted(self: Group) -> None:
        self.aborted.set()  # the abort arrived while the stream drained

    monkeypatch.setattr(Group, "synchronize", synchronize_then_aborted)
    rv = Rendezvous(timeout_s=TIMEOUT_S)
    errors: dict[int, BaseException] = {}
    try:
        gs = GroupSpec.new("t0.extend.0", (0, 1), rv, TIMEOUT_S)

        def run(d: int) -> None:
            try:
                mv.extend_member(ctxs[d], gs, "src" if d == 0 else None, "out", spec, (1, 1),
                                 (0, 0))
            except BaseException as e:  # noqa: BLE001 - checked below
                errors[d] = e

        ts = [threading.Thread(target=run, args=(d,), daemon=True) for d in (0, 1)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(timeout=TIMEOUT_S)
        assert not any(t.is_alive() for t in ts), "extend_member did not return"
    finally:
        rv.close()
    assert set(errors) == {0, 1} and all(isinstance(e, GroupAborted) for e in errors.values())
    assert "out" not in ctxs[1].units and ctxs[1].memory.stats().held == held[1]
    assert set(ctxs[0].units) == {"src"} and ctxs[0].memory.stats().held == held[0]


def test_an_abort_that_comes_before_the_join_is_not_lost() -> None:
    """The driver aborts a failed primitive's groups once; a member whose call has not reached
    its join yet (a host copy first, say) must fail at the join at once, not wait out the
    group's timeout for peers that are gone. Another instance of the same name still joins."""
    from nereus.runtime.comm import GroupAborted, Rendezvous, _abort_all, join_group
    from nereus.runtime.workers import WorkerContext

    ctx = WorkerContext(0, torch.device("cpu"), 1 << 20)
    rv = Rendezvous(timeout_s=120.0)
    outcome: list[BaseException | None] = []
    try:
        gs = GroupSpec.new("t0.extend.0", (0, 1), rv, 120.0)  # the peer never comes
        assert _abort_all(ctx, [gs.name], [gs.prefix]) == []  # nothing to abort yet

        def join() -> None:
            try:
                join_group(ctx, gs)
                outcome.append(None)
            except BaseException as e:  # noqa: BLE001 - checked below
                outcome.append(e)

        t = threading.Thread(target=join, daemon=True)
        t.start()
        t.join(timeout=30.0)  # far below the group's 120 s timeout
        assert not t.is_alive(), "the join waited for its timeout"
        assert len(outcome) == 1 and isinstance(outcome[0], GroupAborted)
        assert gs.name not in ctx.groups
        solo = GroupSpec.new("t0.extend.0", (0,), rv, 120.0)  # a later run, the same name
        join_group(ctx, solo).close()
    finally:
        rv.close()


def test_a_group_aborted_and_freed_before_its_first_collective_raises_group_aborted(
        pair: list[Group]) -> None:
    """An abort between a member's join and its first collective parks the group, and the
    worker frees it at once (nothing runs on it): the member's collective must fail as aborted,
    not on the freed backend (a flaky fault test once saw an AttributeError there)."""
    from nereus.runtime.comm import GroupAborted

    g0, g1 = pair
    for g in (g0, g1):
        g.abort()
        g.close()
    with pytest.raises(GroupAborted):
        g0.broadcast(torch.zeros(4), src=0)
    with pytest.raises(GroupAborted):
        g1.start_broadcast(torch.zeros(4), src=0)
    with pytest.raises(GroupAborted):
        g1.send(torch.zeros(4), 0)


class _EndsInError:
    """An operation that ends in the backend's own error (gloo: the peer closed the
    connection; NCCL: the communicator was aborted); ``abort`` sets its group's abort as it
    ends, as an abort landing then does."""

    def __init__(self, group: Group, abort: bool):
        self.group, self.abort = group, abort

    def is_completed(self) -> bool:  # gloo's wait polls, then waits
        return True

    def wait(self) -> None:
        if self.abort:
            self.group.aborted.set()
        raise RuntimeError("Connection closed by peer")


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_an_operation_that_the_abort_ends_in_error_raises_group_aborted(device: str) -> None:
    """A member's receive can end in the backend's own error when its group is aborted; the
    fault report then said 'RuntimeError: ... GLHF' for that member instead of that its group
    was aborted. An error with no abort behind it stays as it is."""
    from nereus.runtime.comm import GroupAborted

    spec = GroupSpec("g", StoreAddress("127.0.0.1", 0), (0, 1), "g/", TIMEOUT_S)
    g = Group(spec, 0, None, torch.device(device), 0.0)
    with pytest.raises(GroupAborted) as info:
        g._wait(_EndsInError(g, abort=True))
    assert isinstance(info.value.__cause__, RuntimeError)
    g.aborted.clear()
    with pytest.raises(RuntimeError, match="Connection closed"):
        g._wait(_EndsInError(g, abort=False))


def test_a_broadcast_started_and_not_yet_waited_for_keeps_the_group_busy(
        pair: list[Group]) -> None:
    """A Split keeps several broadcasts in flight and waits for them later; ``idle`` only saw
    those being waited for, so an abort between two waits closed the group at once, and
    gloo's shutdown then blocked the worker's control thread for the whole operation
    timeout (a reviewer's run: 8 s)."""
    g0, g1 = pair
    got = torch.zeros(64)
    work = g1.start_broadcast(got, src=0)  # the root has not sent yet
    assert not g1.idle()
    g0.broadcast(torch.arange(64.0), src=0)
    g1.wait([work])
    assert g1.idle() and torch.equal(got, torch.arange(64.0))


def test_groups_opened_before_a_member_failed_are_left_again() -> None:
    """Worker 2 fails to join: worker 0 had joined ``a`` (with 1) and waits for 2 in ``b``
    until its timeout. Everything joined is left again, so the same names open afterwards
    (they stayed registered, and a retry raised 'already in group')."""
    from nereus.runtime.comm import Rendezvous, open_groups
    from nereus.runtime.workers import WorkerCallsFailed, WorkerContext

    ctxs = {d: WorkerContext(d, torch.device("cpu"), 1 << 20) for d in (0, 1, 2)}

    class Pool:  # runs each worker's call on a thread of this process; worker 2 fails
        def __init__(self, fail: set[int]):
            self.fail = fail

        def run(self, calls, timeout_s=None):
            results: dict[int, object] = {}
            errors: dict[int, BaseException] = {}

            def go(d: int, fn, args) -> None:
                try:
                    if d in self.fail:
                        raise RuntimeError(f"worker {d} failed")
                    results[d] = fn(ctxs[d], *args)
                except BaseException as e:  # noqa: BLE001 - reported as the pool does
                    errors[d] = e

            ts = [threading.Thread(target=go, args=(d, fn, a), daemon=True)
                  for d, (fn, a) in calls.items()]
            for t in ts:
                t.start()
            for t in ts:
                t.join(timeout=60.0)
            if errors:
                raise WorkerCallsFailed(errors, results)
            return results

    with Rendezvous(host="127.0.0.1", timeout_s=30.0) as rv:
        try:
            with pytest.raises(WorkerCallsFailed):
                open_groups(Pool({2}), {"a": (0, 1), "b": (0, 2)}, rv, timeout_s=2.0)
            assert all(not c.groups for c in ctxs.values())
            assert set(open_groups(Pool(set()), {"a": (0, 1)}, rv, timeout_s=20.0)) == {"a"}
        finally:
            for c in ctxs.values():
                for g in list(c.groups.values()):
                    g.close()
