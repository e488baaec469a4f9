"""A ``Group``'s point-to-point calls on gloo, between two members in this process (threads over
a HashStore rendezvous; no worker processes)."""

from __future__ import annotations

import datetime
import threading

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
    assert set(groups) == {0, 1}, "the pair did not form"
    return [groups[0], groups[1]]


def test_send_and_recv_return_once_the_message_passed() -> None:
    """Gloo reports a send or receive complete only inside ``wait``: polling the work alone
    never ends, so these calls hung until the group was aborted."""
    g0, g1 = _pair()
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
    g0.close()
    g1.close()
