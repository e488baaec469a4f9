"""Achieved fraction of peak, per op class.

Peak rates overstate what kernels and collectives achieve. Each op class has one efficiency in
(0, 1]; classes never measured start from conservative defaults and are refined by the
calibrator. Values above 1 are allowed for the cpu device, whose peak figures are guesses.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from nereus.cost.ops import OpClass
from nereus.errors import InputError
from nereus.files import read_json, validate

# Conservative starting points (assumptions, refined online): dense GEMMs of LLM training
# usually reach 40-60 % of peak (Megatron-LM reports ~50 % MFU at scale); attention kernels less;
# HBM-bound kernels ~60-80 % of datasheet bandwidth; NCCL bus bandwidth ~70-80 % of link peak
# intra-node and ~60-70 % inter-node in nccl-tests. We start below those figures so that an
# uncalibrated plan is not optimistic about what it has never measured.
# Copies of state into a new shard (a transition's Merge, read + write at HBM bandwidth): plain
# device-to-device copies, as STREAM-style copy kernels (BabelStream's Copy) measure, are
# commonly reported at roughly 80-90 % of datasheet HBM bandwidth on data-center GPUs -- an
# assumption here, not measured by this project; a Merge cuts tensor by tensor (many copies,
# some strided) into freshly allocated memory, so it starts below that, at 0.70.
# A collective's per-step latency (α, ``DeviceSpec.intra_latency_s`` / ``inter_latency_s``) is
# already an achieved figure (nccl-tests' small-message times), not a peak, so like set-up it
# starts at 1.0: dividing it by a link efficiency counted the shortfall twice (an 8-GPU small
# all-reduce priced at 47 us against the 20-30 us it is cited at).
DEFAULT_EFFICIENCY: Mapping[OpClass, float] = {
    OpClass.GEMM: 0.45,
    OpClass.ATTENTION: 0.30,
    OpClass.DECODE: 0.55,
    OpClass.OPTIMIZER: 0.50,
    OpClass.HOST: 0.60,
    OpClass.SETUP: 1.0,
    OpClass.LATENCY_INTRA: 1.0,
    OpClass.LATENCY_INTER: 1.0,
    OpClass.COPY: 0.70,
}
DEFAULT_COMM_EFFICIENCY_INTRA = 0.60
DEFAULT_COMM_EFFICIENCY_INTER = 0.50


def default_efficiency(cls: OpClass) -> float:
    if cls in DEFAULT_EFFICIENCY:
        return DEFAULT_EFFICIENCY[cls]
    return DEFAULT_COMM_EFFICIENCY_INTRA if cls.value.endswith("intra") else \
        DEFAULT_COMM_EFFICIENCY_INTER


# The least efficiency anything learns or loads: a millionth of the peak. The calibrator clips
# its fit there (less is noise no timing supports), and a profile below it would price a step
# in years and make every plan look alike.
MIN_EFFICIENCY = 1e-6

# an efficiency as a profile holds it: a finite number >= MIN_EFFICIENCY (true, "0.5" or
# Infinity are not)
EfficiencyValue = Annotated[float, Field(ge=MIN_EFFICIENCY, allow_inf_nan=False)]


class _EfficiencyFile(BaseModel):
    """What :meth:`Efficiencies.to_dict` writes."""

    model_config = ConfigDict(extra="forbid", strict=True)

    device: str = ""
    efficiency: dict[str, EfficiencyValue] = Field(default_factory=dict)


_DEFAULTS: Mapping[OpClass, float] = {c: default_efficiency(c) for c in OpClass}
_NO_PEAK = frozenset({OpClass.SETUP, OpClass.LATENCY_INTRA, OpClass.LATENCY_INTER})


def peak_bound(cls: OpClass, device: str) -> float:
    """The largest efficiency ``cls`` can have on ``device``: 1 (the datasheet peak: a link's
    bandwidth, the HBM bandwidth for the memory-bound classes copy, decode and optimizer, ...),
    or no bound on the cpu device (its peaks are guesses a measurement may beat) and for set-up
    and latency (estimates, not peaks). Profiles, fits and scenarios all hold to it."""
    return math.inf if device == "cpu" or cls in _NO_PEAK else 1.0


@dataclass(frozen=True)
class Efficiencies:
    """Efficiency per op class; classes absent here use :func:`default_efficiency`."""

    values: Mapping[OpClass, float] = field(default_factory=dict)
    device: str = ""

    def __post_init__(self) -> None:
        for cls, v in self.values.items():
            if not v > 0:
                raise InputError(f"efficiency.{cls.value}", f"must be > 0, got {v}")

    def __getitem__(self, cls: OpClass) -> float:
        v = self.values.get(cls)
        return _DEFAULTS[cls] if v is None else v

    def measured(self) -> frozenset[OpClass]:
        return frozenset(self.values)

    def updated(self, new: Mapping[OpClass, float]) -> Efficiencies:
        return Efficiencies({**self.values, **new}, self.device)

    def to_dict(self) -> dict[str, object]:
        return {"device": self.device,
                "efficiency": {c.value: v for c, v in sorted(self.values.items())}}

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> Efficiencies:
        """``{"device": ..., "efficiency": {op class: value}}`` (what :meth:`to_dict` writes),
        strictly checked: each value finite and > 0, at most 1 (the peak) except on the cpu
        device and for op classes without a peak; errors name ``profile.<field>``."""
        if isinstance(data, Mapping) and not isinstance(data.get("efficiency", {}), Mapping):
            raise InputError("profile.efficiency", "must be a mapping of op class to efficiency",
                             [c.value for c in OpClass])
        f = validate(_EfficiencyFile, dict(data) if isinstance(data, Mapping) else data,
                     "profile", prefix="profile.")
        values: dict[OpClass, float] = {}
        for k, v in f.efficiency.items():
            try:
                cls_ = OpClass(k)
            except ValueError:
                raise InputError(f"profile.efficiency.{k}", "unknown op class",
                                 [c.value for c in OpClass]) from None
            if v > peak_bound(cls_, f.device):
                raise InputError(f"profile.efficiency.{k}", f"{v:g} is above the "
                                 f"{f.device or 'device'}'s peak", "(0, 1]")
            values[cls_] = float(v)
        return cls(values, f.device)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> Efficiencies:
        data = read_json(path, "profile")
        if not isinstance(data, Mapping):
            raise InputError("profile", "must be a JSON object")
        return cls.from_dict(data)
