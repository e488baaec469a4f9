"""Nereus's cost model beside llm-analysis on the same training and inference configurations.

    pip install fire && pip install --no-deps llm-analysis==0.2.2   # benchmark-only
    python benchmarks/vs_llm_analysis.py [--cases T1 G2 ...]

(``--no-deps``: llm-analysis 0.2.2 pins transformers < 5 and huggingface-hub < 0.15, which
cannot be installed beside the dev extra's transformers; it imports them only to fetch configs
from the Hugging Face hub, which this benchmark never does.)

Each case runs once through ``llm_analysis.analysis.train`` / ``infer`` (PyPI llm-analysis
0.2.2) and once through ``nereus.cost.CostModel.estimate`` for the matching model-stage
(``actor_train``, ``reference_infer``, ``actor_gen``), and prints latency and every memory term
side by side. Both sides are estimates; nothing here is measured.

Knobs set to the same values on both sides, so the figures compare formulas, not assumptions:
- compute efficiency 0.5: llm-analysis ``flops_efficiency``; Nereus GEMM and attention classes;
- HBM efficiency 0.8: llm-analysis ``hbm_memory_efficiency``; Nereus decode and optimizer;
- link efficiency 1.0: llm-analysis intra/inter-node efficiencies; every Nereus collective
  class and the host link (llm-analysis has no host transfers);
- bf16 weights, activations, KV cache and norm activations (``w16a16e16``,
  ``layernorm_dtype_bytes=2``); fp32 gradients; Adam with fp32 master weights
  (llm-analysis's default ``master_weights_dtype_bytes=4``, ``other_op_bytes=8``);
- no ZeRO (``ds_zero=0``), no sequence parallelism (``sp_size=1``), flash attention, full
  recomputation where Nereus recomputes (``activation_recomputation=2``).
The device presets of the two tools agree on peak FLOP/s, HBM bandwidth, NVLink bandwidth and
memory for these GPUs (checked below).

"latency (like for like)" compares only what llm-analysis models: training compute
(forward + backward [+ recompute] FLOPs of all micro-batches), forward compute plus TP
all-reduces, generation prefill plus decode. "latency (all terms)" is Nereus's whole estimate
(adds the pipeline bubble, DP gradient sync, optimizer step, host offload/reload), which
llm-analysis does not model. Relative difference = (nereus - llm_analysis) / llm_analysis.
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from nereus.cost.candidate import Candidate, Layout
from nereus.cost.efficiency import Efficiencies
from nereus.cost.estimate import Estimate
from nereus.cost.model import CostModel
from nereus.cost.ops import OpClass
from nereus.spec import JobSpec, ModelSpec, get_device, get_model, parse_job

FLOPS_EFFICIENCY = 0.5
HBM_EFFICIENCY = 0.8
LINK_EFFICIENCY = 1.0
GPUS_PER_NODE = 8
GiB = 1024**3


@dataclass(frozen=True)
class Case:
    """One configuration. ``prompt + response`` tokens per sequence; for generation the
    response is generated token by token, for training and forward it is part of the input."""

    name: str
    model: str
    device: str
    stage: str          # train | forward | generate
    tp: int
    pp: int
    dp: int
    b: int
    a: int
    prompt: int
    response: int
    recompute: bool = False

    @property
    def seq(self) -> int:
        return self.prompt + self.response

    @property
    def nereus_stage(self) -> str:
        return {"train": "actor_train", "forward": "reference_infer",
                "generate": "actor_gen"}[self.stage]


CASES: tuple[Case, ...] = (
    Case("T1", "llama-3.1-8b", "h100-sxm-80gb", "train", 4, 1, 4, 2, 4, 512, 1536),
    Case("T2", "llama-3.1-8b", "a100-sxm-80gb", "train", 2, 2, 4, 1, 8, 1024, 3072, True),
    Case("T3", "llama-3.3-70b", "h100-sxm-80gb", "train", 8, 4, 2, 1, 16, 512, 1536, True),
    Case("T4", "llama-3.3-70b", "a100-sxm-80gb", "train", 8, 8, 1, 1, 32, 1024, 3072, True),
    Case("T5", "qwen3-14b", "h100-sxm-80gb", "train", 4, 2, 2, 2, 8, 1024, 3072),
    Case("F1", "llama-3.1-8b", "h100-sxm-80gb", "forward", 1, 1, 1, 8, 1, 512, 1536),
    Case("F2", "llama-3.3-70b", "a100-sxm-80gb", "forward", 8, 1, 1, 4, 1, 1024, 3072),
    Case("F3", "qwen3-14b", "a100-sxm-80gb", "forward", 2, 1, 1, 4, 1, 1024, 3072),
    Case("F4", "llama-3.3-70b", "h100-sxm-80gb", "forward", 4, 2, 1, 4, 1, 512, 1536),
    Case("G1", "llama-3.1-8b", "h100-sxm-80gb", "generate", 1, 1, 1, 64, 1, 512, 1536),
    Case("G2", "llama-3.3-70b", "h100-sxm-80gb", "generate", 8, 1, 1, 128, 1, 512, 2048),
    Case("G3", "qwen3-14b", "a100-sxm-80gb", "generate", 2, 1, 1, 64, 1, 1024, 1024),
    Case("G4", "llama-3.1-8b", "a100-sxm-80gb", "generate", 2, 1, 1, 256, 1, 256, 768),
)


# ---------------------------------------------------------------- llm-analysis side
def llm_model_config(m: ModelSpec) -> tuple[dict[str, object], list[str]]:
    """The llm-analysis ``ModelConfig`` fields for a Nereus model, and what they cannot say.

    llm-analysis counts MLP parameters as 2 x hidden x ffn_embed_dim (two matrices); a SwiGLU
    MLP has three of intermediate_size, so ffn_embed_dim = 1.5 x intermediate_size gives the
    right parameter count (expansion_ratio must then be given too: ffn/hidden is not an
    integer for these models).
    """
    ffn = 3 * m.intermediate_size // 2
    notes = []
    if m.head_dim * m.num_heads != m.hidden_size:
        notes.append(f"{m.name}: head_dim {m.head_dim} x {m.num_heads} heads != hidden "
                     f"{m.hidden_size}; llm-analysis assumes head_dim = hidden / heads")
    if not m.tie_embeddings:
        notes.append(f"{m.name}: untied LM head not expressible (llm-analysis counts one "
                     "vocab x hidden embedding)")
    if m.qk_norm:
        notes.append(f"{m.name}: q/k RMSNorm weights not expressible "
                     f"({2 * m.head_dim} parameters a layer)")
    notes.append(f"{m.name}: SwiGLU mapped to ffn_embed_dim = 1.5 x {m.intermediate_size}; "
                 "MLP FLOPs stay llm-analysis's fixed 16 x hidden^2 per token")
    cfg = {"name": f"nereus-{m.name}", "num_layers": m.num_layers, "n_head": m.num_heads,
           "hidden_dim": m.hidden_size, "vocab_size": m.vocab_size,
           "max_seq_len": m.max_position_embeddings, "num_key_value_heads": m.num_kv_heads,
           "ffn_embed_dim": ffn, "expansion_ratio": ffn / m.hidden_size, "model_type": "llama"}
    return cfg, notes


def check_devices() -> list[str]:
    """Where the two tools' device presets differ (figures both sides use)."""
    from llm_analysis.config import get_gpu_config_by_name

    out = []
    for name in sorted({c.device for c in CASES}):
        d, g = get_device(name), get_gpu_config_by_name(name)
        pairs = {"peak FLOP/s": (d.peak_flops, g.peak_fp16_TFLOPS * 1e12),
                 "HBM B/s": (d.hbm_bw, g.hbm_bandwidth_in_GB_per_sec * 1e9),
                 "intra-node B/s": (d.intra_node_bw, g.intra_node_bandwidth_in_GB_per_sec * 1e9),
                 "memory B": (d.memory_bytes, g.mem_per_GPU_in_GB * GiB),
                 "inter-node B/s": (d.inter_node_bw, g.inter_node_bandwidth_in_GB_per_sec * 1e9),
                 "intra-node latency s": (d.intra_latency_s, g.intra_node_min_message_latency)}
        for k, (n, l) in pairs.items():
            if abs(n - l) > 1e-3 * max(abs(n), abs(l)):
                out.append(f"{name} {k}: nereus {n:.4g}, llm-analysis {l:.4g}")
    return out


def run_llm_analysis(c: Case, model_path: str) -> dict[str, float]:
    from llm_analysis.analysis import infer, train

    common = dict(model_name=model_path, gpu_name=c.device, dtype_name="w16a16e16",
                  log_level="ERROR", tp_size=c.tp, pp_size=c.pp, sp_size=1, dp_size=c.dp,
                  flops_efficiency=FLOPS_EFFICIENCY, hbm_memory_efficiency=HBM_EFFICIENCY,
                  intra_node_memory_efficiency=LINK_EFFICIENCY,
                  inter_node_memory_efficiency=LINK_EFFICIENCY)
    if c.stage == "train":
        s = train(**common, batch_size_per_gpu=c.b, gradient_accumulation_steps=c.a,
                  global_batch_size=c.dp * c.b * c.a, seq_len=c.seq,
                  activation_recomputation=2 if c.recompute else 0, ds_zero=0,
                  layernorm_dtype_bytes=2, master_weights_dtype_bytes=4, other_op_bytes=None,
                  flash_attn=True, num_gpus_per_node=GPUS_PER_NODE)
        return {"latency like-for-like": s["latency_per_iter"],
                "latency all terms": s["latency_per_iter"],
                "weights": s["weight_memory_per_gpu"],
                "gradients": s["gradient_memory_per_gpu"],
                "optimizer state": s["optimizer_state_memory_per_gpu"],
                "activations": s["activation_memory_per_gpu"],
                "memory total": s["(weight+op_state+grad+act)_memory_per_gpu"]}
    if c.stage == "forward":
        s = infer(**common, batch_size_per_gpu=c.b, seq_len=c.seq, num_tokens_to_generate=1,
                  use_kv_cache=True, layernorm_dtype_bytes=2)
        act = s["prefill_activation_memory_per_gpu"]
        return {"latency like-for-like": s["prefill_latency"],
                "latency all terms": s["prefill_latency"],
                "weights": s["weight_memory_per_gpu"], "activations": act,
                "memory total": s["weight_memory_per_gpu"] + act}
    s = infer(**common, batch_size_per_gpu=c.b, seq_len=c.prompt,
              num_tokens_to_generate=c.response, use_kv_cache=True, layernorm_dtype_bytes=2)
    act = max(s["prefill_activation_memory_per_gpu"], s["decode_activation_memory_per_gpu"])
    return {"latency like-for-like": s["total_latency"], "latency all terms": s["total_latency"],
            "weights": s["weight_memory_per_gpu"], "kv cache": s["kv_cache_memory_per_gpu"],
            "activations": act,
            "memory total": s["weight_memory_per_gpu"] + s["kv_cache_memory_per_gpu"] + act}


# ---------------------------------------------------------------- Nereus side
def efficiencies(device: str) -> Efficiencies:
    values = {OpClass.GEMM: FLOPS_EFFICIENCY, OpClass.ATTENTION: FLOPS_EFFICIENCY,
              OpClass.DECODE: HBM_EFFICIENCY, OpClass.OPTIMIZER: HBM_EFFICIENCY,
              OpClass.HOST: LINK_EFFICIENCY}
    values.update({c: LINK_EFFICIENCY for c in OpClass if c.is_comm})
    return Efficiencies(values, device)


def nereus_job(c: Case) -> JobSpec:
    return parse_job({
        "model": c.model, "algo": "grpo", "gpus": c.tp * c.pp * c.dp,
        "cluster": {"device": c.device},
        "workload": {"prompts_per_step": c.dp * c.b * c.a, "responses_per_prompt": 1,
                     "prompt_len": c.prompt, "response_len": c.response,
                     "ppo_mini_batches": 1, "ppo_epochs": 1}})


LIKE_FOR_LIKE = {"train": ("compute",), "forward": ("compute", "tp_comm"),
                 "generate": ("prefill", "decode")}


def run_nereus(c: Case) -> tuple[dict[str, float], Estimate]:
    cost = CostModel(nereus_job(c), efficiencies(c.device))
    e = cost.estimate(c.nereus_stage, Candidate(Layout(c.tp, c.pp), c.dp, c.b, c.a, c.recompute))
    terms, mem = e.terms, e.memory
    out = {"latency like-for-like": sum(terms.get(t, 0.0) for t in LIKE_FOR_LIKE[c.stage]),
           "latency all terms": e.latency_s, "weights": mem["parameters"]}
    if c.stage == "train":
        out.update({"gradients": mem["gradients"], "optimizer state": mem["optimizer state"]})
    if c.stage == "generate":
        out["kv cache"] = mem["kv cache"]
    out["activations"] = mem["activations"]
    out["memory total"] = e.peak_mem_bytes
    return out, e


# ---------------------------------------------------------------- report
def rel(n: float, ref: float) -> float | None:
    return None if ref == 0 else (n - ref) / ref


def fmt(term: str, v: float) -> str:
    return f"{v:.3f} s" if term.startswith("latency") else f"{v / GiB:.2f} GiB"


def compare(cases: tuple[Case, ...]) -> tuple[list[dict[str, object]], list[str], dict[str, str]]:
    logging.getLogger("__name__").setLevel(logging.ERROR)  # llm-analysis's logger name
    rows: list[dict[str, object]] = []
    notes: list[str] = []
    breakdown: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        paths: dict[str, str] = {}
        for name in sorted({c.model for c in cases}):
            cfg, why = llm_model_config(get_model(name))
            p = Path(tmp) / f"{cfg['name']}.json"
            p.write_text(json.dumps(cfg))
            paths[name] = str(p)
            notes += why
        for c in cases:
            la = run_llm_analysis(c, paths[c.model])
            ne, est = run_nereus(c)
            breakdown[c.name] = ", ".join(f"{k} {v:.3f} s" for k, v in
                                          sorted(est.terms.items(), key=lambda kv: -kv[1]))
            for term, ref in la.items():
                r = rel(ne[term], ref)
                rows.append({"case": c.name, "model": c.model, "device": c.device,
                             "stage": c.nereus_stage, "tp": c.tp, "pp": c.pp, "dp": c.dp,
                             "b": c.b, "a": c.a, "prompt": c.prompt, "response": c.response,
                             "recompute": c.recompute, "term": term,
                             "unit": "s" if term.startswith("latency") else "bytes",
                             "nereus": round(float(ne[term]), 6),
                             "llm_analysis": round(float(ref), 6),
                             "rel_diff": None if r is None else round(r, 4)})
    return rows, notes, breakdown


def max_by_term(rows: list[dict[str, object]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for r in rows:
        if r["rel_diff"] is not None:
            t = str(r["term"])
            out[t] = max(out.get(t, 0.0), abs(float(r["rel_diff"])))  # type: ignore[arg-type]
    return {k: round(v, 4) for k, v in out.items()}


def print_table(console: Console, cases: tuple[Case, ...], rows: list[dict[str, object]],
                breakdown: Mapping[str, str]) -> None:
    by_case = {c.name: c for c in cases}
    table = Table(title="Nereus cost model vs llm-analysis 0.2.2 (both estimated)",
                  show_lines=False)
    for col, j in (("case", "left"), ("configuration", "left"), ("term", "left"),
                   ("nereus", "right"), ("llm-analysis", "right"), ("diff", "right")):
        table.add_column(col, justify=j)  # type: ignore[arg-type]
    last = None
    for r in rows:
        c = by_case[str(r["case"])]
        first = r["case"] != last
        if first and last is not None:
            table.add_section()
        last = r["case"]
        desc = (f"{c.model} {c.device.split('-')[0]} {c.nereus_stage} tp{c.tp} pp{c.pp} "
                f"dp{c.dp} b{c.b} a{c.a} {c.prompt}+{c.response}"
                + (" rc" if c.recompute else "")) if first else ""
        d = r["rel_diff"]
        diff = "n/a" if d is None else f"{100 * float(d):+.0f} %"  # type: ignore[arg-type]
        style = "bold red" if d is not None and abs(float(d)) > 0.10 else ""  # type: ignore[arg-type]
        table.add_row(c.name if first else "", desc, str(r["term"]),
                      fmt(str(r["term"]), float(r["nereus"])),  # type: ignore[arg-type]
                      fmt(str(r["term"]), float(r["llm_analysis"])),  # type: ignore[arg-type]
                      f"[{style}]{diff}[/]" if style else diff)
    console.print(table)
    console.print("Nereus latency terms per case (estimated):")
    for name, text in breakdown.items():
        console.print(f"  {name}: {text}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", nargs="*", help="case names to run (default: all)")
    args = ap.parse_args()
    try:
        import llm_analysis  # noqa: F401
    except ImportError:
        raise SystemExit("llm-analysis is not installed: pip install fire && "
                         "pip install --no-deps llm-analysis==0.2.2") from None
    cases = tuple(c for c in CASES if not args.cases or c.name in args.cases)
    console = Console(width=140)
    t0 = time.perf_counter()
    rows, notes, breakdown = compare(cases)
    elapsed = time.perf_counter() - t0
    print_table(console, cases, rows, breakdown)
    console.print("What llm-analysis cannot express for these models:")
    for n in notes:
        console.print(f"  - {n}")
    for n in check_devices():
        console.print(f"  - device preset differs: {n}")
    console.print(f"knobs: flops efficiency {FLOPS_EFFICIENCY}, HBM efficiency {HBM_EFFICIENCY}, "
                  f"link efficiency {LINK_EFFICIENCY} on both sides; {len(cases)} cases in "
                  f"{elapsed:.1f} s")
    print(json.dumps({"cases": len(cases), "rows": rows, "max_rel_diff_by_term": max_by_term(rows),
                      "source": "estimated"}))


if __name__ == "__main__":
    main()
