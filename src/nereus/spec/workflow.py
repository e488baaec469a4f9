"""The RL workflow as data: its models, its model-stages, and the phase each runs in.

A model-stage is one model doing one kind of work (generate, forward, train). Phases run in the
order generation -> inference -> training in synchronous execution. Inside a phase, model-stages
either share a GPU set (and run one after another) or run concurrently on disjoint GPU sets; the
planner chooses. In asynchronous execution generation of the next step overlaps the rest, so
generation and the other phases run on disjoint GPUs.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from enum import Enum
from functools import cached_property

from nereus.errors import InputError
from nereus.spec.model import Head


class Phase(str, Enum):
    GENERATION = "generation"
    INFERENCE = "inference"
    TRAINING = "training"

    @property
    def order(self) -> int:
        """Stage order used to break ties (generation -> inference -> training)."""
        return {"generation": 0, "inference": 1, "training": 2}[self.value]


class StageKind(str, Enum):
    GENERATE = "generate"  # autoregressive sampling with a KV cache
    FORWARD = "forward"    # log-probs, values or rewards of whole sequences
    TRAIN = "train"        # forward, backward and optimizer step


class Execution(str, Enum):
    SYNC = "sync"
    ASYNC = "async"


@dataclass(frozen=True)
class ModelRole:
    """One model of the job: its output head and whether it is trained."""

    name: str
    head: Head
    trainable: bool


@dataclass(frozen=True)
class ModelStage:
    """One model doing one kind of work in one phase."""

    name: str
    model: str
    kind: StageKind
    phase: Phase

    def __post_init__(self) -> None:
        expected = {StageKind.GENERATE: Phase.GENERATION, StageKind.FORWARD: Phase.INFERENCE,
                    StageKind.TRAIN: Phase.TRAINING}[self.kind]
        if self.phase is not expected:
            raise InputError(f"workflow.{self.name}.phase",
                             f"a {self.kind.value} stage runs in {expected.value}, "
                             f"not {self.phase.value}")


# How responses are scored: by a reward model as large as the actor (a model-stage of its own),
# or by a rule on the driver's CPU (a verifier, unit tests, exact match: RLVR, verl's function
# reward), which takes no GPU and no model-stage.
REWARDS = ("model", "rule")


@dataclass(frozen=True)
class Workflow:
    """``greedy_baseline``: ReMax's extra greedy rollout, one per prompt, run by the same
    generation engine as a second generation after the sampled one (as verl does: a second
    ``generate_sequences`` call with do_sample=False; the cost model prices it so) and scored
    as the other responses are. ``reward``: one of REWARDS."""

    algo: str
    models: tuple[ModelRole, ...]
    stages: tuple[ModelStage, ...]
    execution: Execution = Execution.SYNC
    greedy_baseline: bool = False
    reward: str = "model"

    def __post_init__(self) -> None:
        names = {m.name for m in self.models}
        for s in self.stages:
            if s.model not in names:
                raise InputError(f"workflow.{s.name}.model", f"unknown model {s.model!r}", names)
        seen: set[str] = set()
        for s in self.stages:
            if s.name in seen:
                raise InputError("workflow.stages", f"duplicate model-stage {s.name!r}")
            seen.add(s.name)

    @property
    def algo_name(self) -> str:
        """The algorithm as its paper writes it (PPO, GRPO, ReMax), for what a person reads."""
        return ALGO_NAMES.get(self.algo, self.algo.upper())

    def scored_by_rule(self) -> Workflow:
        """This workflow with a rule in place of the reward model: no reward role, no stage."""
        return replace(self, models=tuple(m for m in self.models if m.name != _REWARD.name),
                       stages=tuple(s for s in self.stages if s.model != _REWARD.name),
                       reward="rule")

    def model(self, name: str) -> ModelRole:
        for m in self.models:
            if m.name == name:
                return m
        raise KeyError(name)

    def absence(self, name: str) -> str:
        """Why ``name`` is no model-stage here, where a reason beyond its name applies (for a
        message that already says it is none): the reward model's stage in a workflow scored
        by a rule. Else empty."""
        if self.reward == "rule" and name == _REW_INF.name:
            return ": a rule scores the responses here, with no reward model"
        return ""

    def stage(self, name: str, field: str = "stage") -> ModelStage:
        """The model-stage ``name``; an unknown name is an InputError naming ``field`` (the
        option or file field the name came from) and this workflow's model-stages."""
        for s in self.stages:
            if s.name == name:
                return s
        raise InputError(field, f"unknown model-stage {name!r} for {self.algo}"
                         f"{self.absence(name)}", [s.name for s in self.stages])

    def trained_by(self, model: str) -> str | None:
        """The model-stage that trains ``model`` (None for a frozen model)."""
        return next((s.name for s in self.stages
                     if s.model == model and s.kind is StageKind.TRAIN), None)

    def after_loss(self, empty: Iterable[str]) -> tuple[tuple[str, ...], dict[str, str | None]]:
        """Of the model-stages ``empty`` (every replica gone): (those whose state is gone, so
        the job restarts from a checkpoint; those made again without a restart, each with the
        stage it comes from, or None for storage). A frozen model's stage is read again from
        storage (its weights never change). A stage holding a copy of a trained model's θ
        (generation, value inference) is given the newest θ again by the stage that trains the
        model, where that one has a replica left: what the next weight sync would give it. A
        training stage's optimizer state exists nowhere else: it is gone, and with it every
        copy of its model's θ that has no replica left."""
        empty = tuple(dict.fromkeys(empty))
        gone: list[str] = []
        rebuilt: dict[str, str | None] = {}
        for name in empty:
            role = self.model(self.stage(name).model)
            trainer = self.trained_by(role.name) if role.trainable else None
            if not role.trainable:
                rebuilt[name] = None
            elif trainer is None or trainer in empty:  # a training stage is in ``empty``
                gone.append(name)
            else:
                rebuilt[name] = trainer
        return tuple(gone), rebuilt

    def phase_stages(self, phase: Phase) -> tuple[ModelStage, ...]:
        return self._by_phase.get(phase, ())

    @property
    def phases(self) -> tuple[Phase, ...]:
        return tuple(self._by_phase)

    @cached_property
    def _by_phase(self) -> dict[Phase, tuple[ModelStage, ...]]:
        """Each phase with stages, in ``Phase`` order, and its stages in declaration order:
        read by the planner thousands of times a search (the value is frozen, so computed
        once; not a field, so equality and hashing do not see it)."""
        return {p: got for p in Phase
                if (got := tuple(s for s in self.stages if s.phase is p))}

    def stage_order(self) -> tuple[ModelStage, ...]:
        """Stages sorted generation -> inference -> training, then by declaration order."""
        return tuple(sorted(self.stages, key=lambda s: s.phase.order))

    def weight_sync(self) -> tuple[str, str] | None:
        """(training stage, generation stage) of the policy whose weights sync every step."""
        gens = [s for s in self.stages if s.kind is StageKind.GENERATE]
        if not gens:
            return None
        trains = [s for s in self.stages if s.kind is StageKind.TRAIN and s.model == gens[0].model]
        return (trains[0].name, gens[0].name) if trains else None

    def colocated_sync(self) -> tuple[str, str] | None:
        """``weight_sync`` in synchronous execution, where generation takes turns with training
        on the same GPUs; None in asynchronous execution (generation has GPUs of its own)."""
        return self.weight_sync() if self.execution is Execution.SYNC else None


_ACTOR = ModelRole("actor", Head.LM, trainable=True)
_CRITIC = ModelRole("critic", Head.SCALAR, trainable=True)
_REFERENCE = ModelRole("reference", Head.LM, trainable=False)
_REWARD = ModelRole("reward", Head.SCALAR, trainable=False)

_GEN = ModelStage("actor_gen", "actor", StageKind.GENERATE, Phase.GENERATION)
_REF_INF = ModelStage("reference_infer", "reference", StageKind.FORWARD, Phase.INFERENCE)
_REW_INF = ModelStage("reward_infer", "reward", StageKind.FORWARD, Phase.INFERENCE)
_CRITIC_INF = ModelStage("critic_infer", "critic", StageKind.FORWARD, Phase.INFERENCE)
_ACTOR_TRAIN = ModelStage("actor_train", "actor", StageKind.TRAIN, Phase.TRAINING)
_CRITIC_TRAIN = ModelStage("critic_train", "critic", StageKind.TRAIN, Phase.TRAINING)


def ppo(execution: Execution = Execution.SYNC) -> Workflow:
    """PPO: the actor generates, reference/reward/critic score, actor and critic train."""
    return Workflow("ppo", (_ACTOR, _CRITIC, _REFERENCE, _REWARD),
                    (_GEN, _REF_INF, _REW_INF, _CRITIC_INF, _ACTOR_TRAIN, _CRITIC_TRAIN), execution)


def grpo(execution: Execution = Execution.SYNC) -> Workflow:
    """GRPO: no critic; advantages come from a group of responses per prompt."""
    return Workflow("grpo", (_ACTOR, _REFERENCE, _REWARD),
                    (_GEN, _REF_INF, _REW_INF, _ACTOR_TRAIN), execution)


def remax(execution: Execution = Execution.SYNC) -> Workflow:
    """ReMax: no critic; an extra greedy rollout per prompt gives the reward baseline."""
    return Workflow("remax", (_ACTOR, _REFERENCE, _REWARD),
                    (_GEN, _REF_INF, _REW_INF, _ACTOR_TRAIN), execution, greedy_baseline=True)


WORKFLOWS = {"ppo": ppo, "grpo": grpo, "remax": remax}
ALGO_NAMES = {"ppo": "PPO", "grpo": "GRPO", "remax": "ReMax"}


def get_workflow(algo: str, execution: str | Execution = Execution.SYNC,
                 reward: str = "model") -> Workflow:
    key = algo.lower()
    if key not in WORKFLOWS:
        raise InputError("algo", f"unknown algorithm {algo!r}", WORKFLOWS)
    try:
        ex = Execution(execution)
    except ValueError:
        raise InputError("execution", f"unknown execution mode {execution!r}",
                         [e.value for e in Execution]) from None
    if reward not in REWARDS:
        raise InputError("reward", f"unknown reward {reward!r}", REWARDS)
    workflow = WORKFLOWS[key](ex)
    return workflow if reward == "model" else workflow.scored_by_rule()
