"""What one RL step processes: prompts, responses, lengths, mini-batches, precision, optimizer."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from enum import Enum

from nereus.errors import InputError

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}

# Upper bounds on one step's batch, well past real RL jobs (a few thousand prompts, up to
# 64-128 samples each for GRPO-style groups): past them a count is a typo, and the planner,
# which enumerates per sequence, would run for hours instead of saying so.
MAX_PROMPTS_PER_STEP = 1 << 20        # 1,048,576
MAX_RESPONSES_PER_PROMPT = 1 << 10    # 1,024
MAX_SEQUENCES_PER_STEP = 1 << 20      # prompts_per_step x responses_per_prompt
# A prompt or a response longer than this is past every model's context window (1M tokens
# for the longest published ones); the cost model's token sums would overflow a float first.
MAX_TOKENS = 1 << 24                  # 16,777,216
# PPO-style jobs make 1-4 passes over a step's samples (verl's ppo_epochs defaults to 1);
# past this a count is a typo, and the priced step would be years long.
MAX_PPO_EPOCHS = 1 << 10              # 1,024
# Upper bound of every integer field of a workload (its lower bound is 1).
INT_BOUNDS = {"prompts_per_step": MAX_PROMPTS_PER_STEP,
              "responses_per_prompt": MAX_RESPONSES_PER_PROMPT,
              "prompt_len": MAX_TOKENS, "response_len_mean": MAX_TOKENS,
              "response_len_max": MAX_TOKENS,
              "ppo_mini_batches": MAX_SEQUENCES_PER_STEP, "ppo_epochs": MAX_PPO_EPOCHS}


def shown(v: object) -> str:
    """A value as an error message quotes it: a 400-digit integer (a YAML typo) as its length,
    so that the message stays one readable line."""
    text = repr(v)
    if isinstance(v, int) and not isinstance(v, bool) and len(text) > 20:
        return f"a {len(text.lstrip('-'))}-digit integer"
    return text


def check_count(field: str, v: object, most: int) -> None:
    """An integer in 1..most, or an InputError naming ``field`` and that range."""
    if not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= most:
        raise InputError(field, f"{shown(v)} is not allowed", f"an integer 1..{most:,}")


def divisors(n: int) -> list[int]:
    """The divisors of ``n`` >= 1, ascending (pairs up to its square root: batches reach a
    million sequences)."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


def largest_share(batch: int, dp: int) -> int:
    """The sequences the largest of ``dp`` replicas runs when ``batch`` is split as evenly as
    it goes, ceil(batch / dp): what a generation or forward stage's time is priced by."""
    return -(-batch // dp)


def divisors_text(n: int, most: int = 12) -> str:
    """'a divisor of 512: 1, 2, 4, ..., 512': every one up to ``most``, else the smallest
    and largest few."""
    ds = divisors(n)
    if len(ds) <= most:
        shown_ds = ", ".join(map(str, ds))
    else:
        shown_ds = (", ".join(map(str, ds[:most - 3])) + ", ..., "
                    + ", ".join(map(str, ds[-2:])) + f" ({len(ds)} in all)")
    return f"a divisor of {n}: {shown_ds}"


class Optimizer(str, Enum):
    ADAM = "adam"  # two fp32 moments per parameter
    SGD = "sgd"    # no optimizer tensors


@dataclass(frozen=True)
class Workload:
    """One RL step. Lengths are in tokens; the response length is the one generated now."""

    prompts_per_step: int = 512
    responses_per_prompt: int = 1
    prompt_len: int = 512
    response_len_mean: int = 2048
    response_len_max: int = 2048
    ppo_mini_batches: int = 4      # optimizer updates per epoch
    ppo_epochs: int = 1
    param_dtype: str = "bf16"      # parameters and activations
    grad_dtype: str = "fp32"       # gradient accumulation buffers (Megatron main_grad)
    master_weights: bool = True    # fp32 master copy of trainable parameters
    optimizer: Optimizer = Optimizer.ADAM

    def __post_init__(self) -> None:
        for f, most in INT_BOUNDS.items():
            check_count(f"workload.{f}", getattr(self, f), most)
        if self.sequences_per_step > MAX_SEQUENCES_PER_STEP:
            raise InputError("workload.responses_per_prompt",
                             f"{self.prompts_per_step} prompts x {self.responses_per_prompt} "
                             f"responses = {self.sequences_per_step:,} sequences per step",
                             f"prompts_per_step x responses_per_prompt up to "
                             f"{MAX_SEQUENCES_PER_STEP:,}")
        if self.response_len_max < self.response_len_mean:
            raise InputError("workload.response_len_max",
                             f"{self.response_len_max} is below the mean {self.response_len_mean}",
                             f"at least {self.response_len_mean}")
        for f in ("param_dtype", "grad_dtype"):
            if getattr(self, f) not in DTYPE_BYTES:
                raise InputError(f"workload.{f}", f"unknown dtype {getattr(self, f)!r}",
                                 DTYPE_BYTES)
        if self.sequences_per_step % self.ppo_mini_batches:
            raise InputError("workload.ppo_mini_batches",
                             f"{self.ppo_mini_batches} does not divide the "
                             f"{self.sequences_per_step} sequences of a step "
                             f"({self.prompts_per_step} prompts x {self.responses_per_prompt} "
                             f"response{'s' if self.responses_per_prompt != 1 else ''})",
                             divisors_text(self.sequences_per_step))

    @property
    def sequences_per_step(self) -> int:
        return self.prompts_per_step * self.responses_per_prompt

    @property
    def sequences_per_update(self) -> int:
        """The fixed global batch of one optimizer update (dp x b x a)."""
        return self.sequences_per_step // self.ppo_mini_batches

    @property
    def updates_per_step(self) -> int:
        return self.ppo_mini_batches * self.ppo_epochs

    @property
    def seq_len_mean(self) -> int:
        return self.prompt_len + self.response_len_mean

    @property
    def seq_len_max(self) -> int:
        return self.prompt_len + self.response_len_max

    @property
    def param_bytes(self) -> int:
        return DTYPE_BYTES[self.param_dtype]

    @property
    def grad_bytes(self) -> int:
        return DTYPE_BYTES[self.grad_dtype]

    def trainable_state_bytes_per_param(self) -> int:
        """Bytes a trainable parameter holds on its device: param, grad, master, moments."""
        master = 4 if self.master_weights and self.param_bytes < 4 else 0
        moments = 8 if self.optimizer is Optimizer.ADAM else 0
        return self.param_bytes + self.grad_bytes + master + moments

    def optimizer_state_bytes_per_param(self) -> int:
        """Bytes of ω per parameter (master copy and moments), the part a transition moves."""
        master = 4 if self.master_weights and self.param_bytes < 4 else 0
        return master + (8 if self.optimizer is Optimizer.ADAM else 0)

    def with_response_len(self, mean: int, max_len: int | None = None) -> Workload:
        mean = max(1, int(mean))
        return replace(self, response_len_mean=mean,
                       response_len_max=max(mean, int(max_len) if max_len else mean))
