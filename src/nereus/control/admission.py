"""Admission (§4.3): is a move executable, and does it repay its cost before conditions change?

Feasibility is the transition layer's memory and pool check (its schedule says feasible or
why not). Profitability is Eq. 2: admit an opportunistic move when

    L_tran / ΔL  <=  γ · H_x

with ΔL the predicted per-step saving of the whole RL step (with the expected cost of a node
loss where the controller prices one: an option's ``risk_s``), L_tran the predicted transition
time and H_x the horizon of the triggering signal (the smallest when several trigger). The ratio
is the payback period in steps; γ in [0, 1] keeps part of the horizon as a margin, and γ = 0
admits only urgent moves. If the best target is rejected, slightly slower targets with cheaper
transitions are tried before keeping the current plan. The urgent path waives profitability and
takes the feasible option that finishes the horizon soonest: L_tran + H · (L_step + risk), the
step priced with its node-loss risk (``Option.expected_s``), as ΔL is.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TypeVar

from nereus.plan.types import Plan
from nereus.transition.schedule import Schedule

REL_EPS = 1e-9  # a "faster" plan must save more than float noise


@dataclass(frozen=True)
class Option:
    """A target the controller may move to, priced at the current telemetry (estimated)."""

    label: str
    plan: Plan
    step_s: float
    risk_s: float = 0.0  # expected restart seconds per step from a node loss (extension)
    in_place: bool = False  # moves no state between GPUs: always priced on the urgent path

    @property
    def expected_s(self) -> float:
        """What a step costs on this plan, expected restarts included: what ΔL compares."""
        return self.step_s + self.risk_s


@dataclass(frozen=True)
class Verdict:
    """The admission check of one option, as data (every number estimated)."""

    label: str
    step_s: float
    delta_l_s: float | None      # L(current) - L(option), each with its risk_s; None when the
    #                              current plan cannot run
    l_tran_s: float              # inf when the transition is infeasible; nan when not priced
    feasible: bool | None        # None: refused before its transition was priced (unknown)
    payback_steps: float | None  # L_tran / ΔL; inf when ΔL <= 0 (nothing saved), None unknown
    admitted: bool
    why: str
    risk_s: float = 0.0          # the option's expected restart seconds per step


def payback_steps(l_tran_s: float, delta_l_s: float) -> float:
    """Steps for the saving ΔL to repay L_tran (inf when nothing is saved)."""
    if delta_l_s <= 0:
        return math.inf
    return l_tran_s / delta_l_s


def profitable(l_tran_s: float, delta_l_s: float, gamma: float, horizon_steps: float) -> bool:
    """Eq. 2, inclusive at the boundary; γ = 0 admits nothing opportunistic. Decided on the
    payback in steps, the number a decision reports (``l_tran / ΔL <= γ·H``): the product
    form rounds differently, and a move was admitted whose stored payback exceeded γ·H."""
    if gamma <= 0 or delta_l_s <= 0:
        return False
    return payback_steps(l_tran_s, delta_l_s) <= gamma * horizon_steps


def apart(a: float, b: float) -> tuple[str, str]:
    """``a`` and ``b`` to three significant digits, or as many more (up to twelve) as it
    takes to tell them apart: a payback a hair over γ·H must not print as equal to it."""
    for digits in range(3, 13):
        x, y = f"{a:.{digits}g}", f"{b:.{digits}g}"
        if x != y:
            break
    return x, y


def _delta(current_step_s: float | None, step_s: float) -> float | None:
    return None if current_step_s is None else current_step_s - step_s


T = TypeVar("T")


def cheapest_to_reach(targets: Sequence[T], schedule_of: Callable[[T], Schedule],
                      step_of: Callable[[T], float]) -> T:
    """Of targets no slower than the first, the one whose transition is cheapest: feasible
    before infeasible, then the shortest L_tran, then the shortest step; ties keep the earlier
    (the search's placement)."""
    def key(t: T) -> tuple[bool, float, float]:
        sched = schedule_of(t)
        return not sched.feasible, sched.estimated_s if sched.feasible else 0.0, step_of(t)
    return min(targets, key=key)


def faster(current_step_s: float | None, step_s: float) -> bool:
    """Whether a plan of ``step_s`` beats the current one by more than rounding (None: the
    current plan cannot run, so anything is faster)."""
    if current_step_s is None:
        return True
    return current_step_s - step_s > REL_EPS * max(1.0, current_step_s)


NOT_FASTER = "not faster than the current plan"
GAMMA_ZERO = "γ = 0 admits only urgent moves"


def unpriced_refusal(current_step_s: float | None, step_s: float, *, urgent: bool,
                     gamma: float, profitability: bool = True) -> str | None:
    """Why a move to a target of ``step_s`` cannot be admitted whatever its transition costs
    (None: it may be, once its transition is priced): outside the urgent path, a target no
    faster than the current plan, or any target under γ = 0. ``select`` gives these reasons
    before it prices anything; the controller asks first, so as not to price what it could not
    take."""
    if urgent:
        return None
    if not faster(current_step_s, step_s):
        return NOT_FASTER
    if profitability and gamma <= 0:
        return GAMMA_ZERO
    return None


def select(options: Sequence[Option], current_step_s: float | None, *, urgent: bool,
           gamma: float, horizon_steps: float,
           schedule_of: Callable[[Option], Schedule | None],
           profitability: bool = True, max_tries: int = 8
           ) -> tuple[int | None, Schedule | None, tuple[Verdict, ...]]:
    """Pick the option to move to (index into ``options``), its schedule, and every verdict.

    ``options[0]`` is the planner's best target S*; the rest are fallbacks. Schedules are
    computed lazily (they cost milliseconds each) and at most ``max_tries`` of them; the urgent
    path prices the options that move no state (``in_place``) within that number first.
    ``schedule_of`` answers None for an option its caller's own budget leaves unpriced (the
    controller counts every schedule of a replan): the option is passed over.
    ``current_step_s`` and every option's latency count expected restarts (``risk_s``).
    """
    verdicts: list[Verdict] = []
    if not options:
        return None, None, ()
    if urgent:
        return _urgent(options, current_step_s, horizon_steps, schedule_of, max_tries)

    best = options[0]
    rest = sorted(options[1:], key=lambda o: o.expected_s)
    order = [best] + [o for o in rest if faster(current_step_s, o.expected_s)]
    best_l_tran: float | None = None
    tries = 0
    for i, opt in enumerate(order):
        delta = _delta(current_step_s, opt.expected_s)
        refused = unpriced_refusal(current_step_s, opt.expected_s, urgent=False, gamma=gamma,
                                   profitability=profitability)
        if refused is not None:
            verdicts.append(_verdict(opt, delta, math.nan, None, None, False, refused))
            if refused == GAMMA_ZERO:
                break  # and every later target alike
            continue
        if tries >= max_tries:
            break
        tries += 1
        sched = schedule_of(opt)
        if sched is None:
            continue  # the caller's budget leaves it unpriced
        if not sched.feasible:
            verdicts.append(_verdict(opt, delta, math.inf, False, None, False,
                                     f"infeasible: {sched.reason}"))
            continue
        l_tran = sched.estimated_s
        if i > 0 and best_l_tran is not None and l_tran >= best_l_tran:
            verdicts.append(_verdict(opt, delta, l_tran, True, None, False,
                                     f"its transition ({l_tran:.3g} s) is not cheaper than the "
                                     f"best target's ({best_l_tran:.3g} s)"))
            continue
        if i == 0:
            best_l_tran = l_tran
        d = float(delta) if delta is not None else math.inf
        pb = payback_steps(l_tran, d)
        if not profitability:
            verdicts.append(_verdict(opt, delta, l_tran, True, pb, True,
                                     "admitted: faster and feasible (no payback check)"))
            return _index(options, opt), sched, tuple(verdicts)
        if profitable(l_tran, d, gamma, horizon_steps):
            verdicts.append(_verdict(opt, delta, l_tran, True, pb, True,
                                     f"admitted: payback {pb:.3g} steps <= γ·H = "
                                     f"{gamma * horizon_steps:.3g}"))
            return _index(options, opt), sched, tuple(verdicts)
        shown_pb, shown_gh = apart(pb, gamma * horizon_steps)
        verdicts.append(_verdict(opt, delta, l_tran, True, pb, False,
                                 f"rejected: payback {shown_pb} steps > γ·H = {shown_gh}"))
    return None, None, tuple(verdicts)


def _urgent(options: Sequence[Option], current_step_s: float | None, horizon_steps: float,
            schedule_of: Callable[[Option], Schedule | None], max_tries: int
            ) -> tuple[int | None, Schedule | None, tuple[Verdict, ...]]:
    verdicts: list[Verdict] = []
    scored: list[tuple[float, int, Schedule, Option]] = []
    h = max(1.0, horizon_steps)
    ranked = sorted(options, key=lambda o: o.expected_s)
    # the moves that carry no state are what the urgent path can always fall back on: they are
    # asked for first, then the others fastest first, until max_tries schedules are in hand
    priced: dict[int, Schedule] = {}
    for opt in [o for o in ranked if o.in_place] + [o for o in ranked if not o.in_place]:
        if len(priced) >= max_tries:
            break
        got = schedule_of(opt)
        if got is not None:  # None: the caller's budget leaves it unpriced
            priced[id(opt)] = got
    for opt in ranked:  # verdicts, and ties, in the order of the step
        sched = priced.get(id(opt))
        if sched is None:
            continue
        delta = _delta(current_step_s, opt.expected_s)
        if not sched.feasible:
            verdicts.append(_verdict(opt, delta, math.inf, False, None, False,
                                     f"infeasible: {sched.reason}"))
            continue
        pb = payback_steps(sched.estimated_s, delta) if delta is not None else None
        verdicts.append(_verdict(opt, delta, sched.estimated_s, True, pb, False,
                                 "feasible (urgent: payback waived)"))
        scored.append((sched.estimated_s + h * opt.expected_s, len(verdicts) - 1, sched, opt))
    if not scored:
        return None, None, tuple(verdicts)
    _, vi, sched, chosen = min(scored, key=lambda s: (s[0], s[1]))
    v = verdicts[vi]
    # the formula names every term it sums: the step's node-loss risk too (expected_s)
    verdicts[vi] = replace(v, admitted=True, why=f"admitted (urgent): L_tran + H·(L_step + "
                           f"risk) = {v.l_tran_s + h * (v.step_s + v.risk_s):.4g} s is the "
                           f"least over H = {h:.3g}")
    # by identity: two options may share a label, and the plan must be the one scheduled
    return _index(options, chosen), sched, tuple(verdicts)


def _verdict(opt: Option, delta: float | None, l_tran_s: float, feasible: bool | None,
             payback: float | None, admitted: bool, why: str) -> Verdict:
    return Verdict(opt.label, opt.step_s, delta, l_tran_s, feasible, payback, admitted, why,
                   opt.risk_s)


def _index(options: Sequence[Option], opt: Option) -> int:
    return next(i for i, o in enumerate(options) if o is opt)
