"""The CUDA check script's logic, on the CPU: its checks pass on the real engine with bf16
parameters and fp32 masters, and fail when the master relation is broken (CI has no GPU, so
this keeps ``benchmarks/engine_cuda_check.py`` runnable as the engine changes)."""

from __future__ import annotations

import runpy
from pathlib import Path
from typing import Any

import pytest
import torch

from nereus.spec.model import MODEL_PRESETS

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "engine_cuda_check.py"


@pytest.fixture(scope="module")
def cc() -> dict[str, Any]:
    return runpy.run_path(str(SCRIPT), run_name="engine_cuda_check")


def test_reference_and_generation_checks_pass_on_cpu(cc: dict[str, Any]) -> None:
    rt = cc["runtime_state"]()
    for name in ("tiny-llama", "tiny-qwen3"):
        ref = cc["check_reference"](rt, MODEL_PRESETS[name], "cpu", 2, 12)
        assert ref["ok"], ref
    gen = cc["check_generation"](rt, MODEL_PRESETS["tiny-llama"], "cpu", 3, 6, 4)
    assert gen["ok"], gen


def test_training_check_passes_and_master_relation_detects_a_break(cc: dict[str, Any]) -> None:
    rt = cc["runtime_state"]()
    spec = MODEL_PRESETS["tiny-llama"]
    out = cc["check_training"](rt, spec, "cpu", 4, 16, 2)
    assert out["ok"], out
    st = cc["unit"](rt, spec, "bf16", True, "cpu")
    master = st.kind(rt.MASTER)
    assert cc["master_relation"](st.params, master) == []
    name = next(iter(master))
    master[name].add_(torch.full_like(master[name], 0.5))
    assert cc["master_relation"](st.params, master) == [name]


def test_estimates_leave_out_offload_and_workspace(cc: dict[str, Any]) -> None:
    case = cc["Case"]("train", 8, 64, 64, 2)
    est, host_s = cc["stage_estimate"](case, cc["BENCH_MODEL"], "h200-141gb", "bf16")
    assert host_s > 0 and all(o.cls.value != "host" for o in est.ops)
    assert 0 < cc["tensor_bytes"](est) < est.peak_mem_bytes
