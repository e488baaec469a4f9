"""The engine on one CUDA device, in one process: correctness of its GPU paths and measured
stage costs beside the cost model's estimate.

``benchmarks/engine.py`` runs the engine on the runtime's Ray workers; a one-GPU machine needs
no workers (tp = pp = dp = 1 uses no process group), so this script builds a single unit from
the runtime's seeded state (``seeded_shard``: one arena with bf16 parameters, fp32 master
weights and fp32 moments) and calls ``StageEngine`` directly. It checks, on the device:

1. logits: the engine's equal ``transformers.LlamaForCausalLM``'s with the same weights. fp32:
   max |diff| <= 1e-4 (TF32 off). bf16: both computed in bf16 and compared with transformers in
   fp32, the engine's mean and max error at most 1.5 and 3 times transformers-bf16's own (the
   two bf16 computations round differently, so neither can be the reference of the other);
   the same for next-token log-probs. Also ``tiny-qwen3`` (q/k norms, tied embeddings).
2. training with bf16 parameters and fp32 master weights: after each of two AdamW steps every
   bf16 parameter is its master rounded to bf16 (bitwise); every master tensor moved, on more
   than twice as many elements as the bf16 parameters (at lr 1e-5 most updates are below
   bf16's resolution, so only the masters keep them); the first step's loss (within 1 %),
   gradient norm (5 %) and update (cosine >= 0.9) agree with the same step on fp32 parameters.
   Generation: sampling with a fixed seed gives the same tokens twice (with left padding);
   greedy decoding with the KV cache (fp32) picks the argmax of a full forward pass.
3. per-stage time and peak memory (``torch.cuda.max_memory_allocated``) of train_step,
   forward and generate over a few shapes, beside the cost model's estimate for the device
   preset (``h200-141gb``): uncalibrated, and calibrated on half of the cases and scored on the
   other half (two folds, as ``benchmarks/engine.py``). The estimate compared leaves out the
   cost model's offload / reload term (an idle stage's state to host memory between phases),
   which a stage operation alone does not do, and its ``workspace`` memory (CUDA context,
   library buffers), which the allocator's peak does not see.

The last line is one JSON object with the checks, the figures, the device name and torch's
version. ``--device cpu`` runs the same logic on the CPU (small shapes with ``--quick``).

    python benchmarks/engine_cuda_check.py [--device cuda] [--out DIR]
    python benchmarks/engine_cuda_check.py --device cpu --model small-llama --quick
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import os
import statistics
import sys
import time
import types
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch

from nereus.cost.calibrate import Calibrator
from nereus.cost.candidate import Candidate, Layout
from nereus.cost.efficiency import Efficiencies
from nereus.cost.estimate import Estimate
from nereus.cost.model import CostModel
from nereus.cost.ops import OpClass
from nereus.engine.batch import Batch
from nereus.engine.groups import Position
from nereus.engine.losses import weighted_nll
from nereus.engine.optim import AdamConfig, AdamState
from nereus.engine.pipeline import micro_inputs
from nereus.engine.sampling import SamplingParams
from nereus.engine.stage import StageEngine
from nereus.spec.cluster import Cluster, GpuPool
from nereus.spec.device import get_device
from nereus.spec.job import JobSpec
from nereus.spec.model import Head, ModelSpec, get_model
from nereus.spec.workflow import StageKind, ppo
from nereus.spec.workload import Workload

# A decoder of 254 M parameters (Llama-style, GQA): large enough that an H200's GEMMs, not the
# per-kernel launch overhead the cost model does not price, take most of a step at the shapes
# below; small enough to build from a seeded init in seconds.
BENCH_MODEL = ModelSpec("bench-254m", hidden_size=1024, intermediate_size=2816, num_layers=16,
                        num_heads=16, num_kv_heads=8, head_dim=64, vocab_size=32000,
                        rope_theta=10_000.0, rms_norm_eps=1e-5, max_position_embeddings=4096)
STAGES = {"train": "actor_train", "forward": "reference_infer", "generate": "actor_gen"}
KINDS = {"train": StageKind.TRAIN, "forward": StageKind.FORWARD, "generate": StageKind.GENERATE}
SEED = 11
LR = 1e-5

# Tolerances (see the module docstring).
FP32_LOGITS_ATOL = 1e-4
BF16_MEAN_RATIO = 1.5
BF16_MAX_RATIO = 3.0


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ---------------------------------------------------------------- the runtime's seeded state
def runtime_state() -> types.SimpleNamespace:
    """``seeded_shard`` and friends. ``nereus.runtime``'s package init imports its Ray workers;
    ``state`` and ``loading`` need no Ray. Where Ray is not installed (a GPU machine that runs
    this one process), the package is registered bare so that those two modules import alone."""
    if "nereus.runtime" not in sys.modules and importlib.util.find_spec("ray") is None:
        import nereus

        pkg = types.ModuleType("nereus.runtime")
        pkg.__path__ = [os.path.join(os.path.dirname(nereus.__file__), "runtime")]
        sys.modules["nereus.runtime"] = pkg
    from nereus.runtime import loading, state

    return types.SimpleNamespace(seeded_shard=loading.seeded_shard,
                                 seeded_logical=loading.seeded_logical, StateSpec=state.StateSpec,
                                 PARAM=state.PARAM, MASTER=state.MASTER)


def unit(rt: Any, spec: ModelSpec, dtype: str, trainable: bool, device: str) -> Any:
    """Position (0, 0) of a tp = pp = 1 unit from the seeded init (fresh moments, step 0)."""
    sspec = rt.StateSpec(spec, Head.LM, trainable, dtype, trainable and dtype != "fp32")
    return rt.seeded_shard(sspec, 1, 1, 0, 0, SEED, warm=False, device=device)


def engine_on(rt: Any, st: Any, adam: AdamConfig | None = None) -> StageEngine:
    """The engine over a unit's views, as ``nereus.engine.remote.attach`` builds it."""
    state = None
    if st.spec.trainable:
        state = AdamState(st.exp_avg, st.exp_avg_sq,
                          st.kind(rt.MASTER) if st.spec.master else {}, st.meta.adam_step)
    return StageEngine(st.spec.model, Head.LM, Position(), st.params, None, state, adam)


def free() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


# ---------------------------------------------------------------- 1. logits vs transformers
def hf_model(spec: ModelSpec, weights: dict[str, torch.Tensor], device: str,
             dtype: torch.dtype) -> torch.nn.Module:
    import transformers

    cfg = transformers.AutoConfig.for_model(**spec.to_hf_dict())
    with torch.device(device):   # its random init on the device (fast); replaced below
        m = transformers.AutoModelForCausalLM.from_config(cfg)
    res = m.load_state_dict(weights, strict=False)
    tied = ["lm_head.weight"] if spec.tie_embeddings else []
    if res.unexpected_keys or sorted(res.missing_keys) != tied:
        raise RuntimeError(f"transformers' names differ: unexpected {res.unexpected_keys[:3]}, "
                           f"missing {res.missing_keys[:3]}")
    return m.to(device=device, dtype=dtype).eval()


def engine_logits(eng: StageEngine, b: Batch) -> torch.Tensor:
    m = eng.model
    bd = b.to(m.device)
    with torch.no_grad():
        return m.full_logits(m.stage_forward(bd.input_ids, micro_inputs(m, bd)))


def token_logprobs(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    lp = torch.log_softmax(logits[:, :-1].float(), -1)
    return lp.gather(-1, ids[:, 1:, None].to(lp.device))[..., 0]


def _errors(got: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    d = (got.float() - ref.float()).abs()
    return float(d.mean()), float(d.max())


def check_reference(rt: Any, spec: ModelSpec, device: str, n: int, s: int) -> dict[str, Any]:
    """Engine logits and log-probs (fp32 and bf16) against transformers on ``device``."""
    t0 = time.perf_counter()
    logical = rt.seeded_logical(rt.StateSpec(spec, Head.LM, False, "fp32"), SEED, warm=False)
    weights = {name: t for (kind, name), t in logical.tensors.items() if kind == rt.PARAM}
    g = torch.Generator().manual_seed(5)
    b = Batch(torch.randint(0, spec.vocab_size, (n, s), generator=g))
    ids = b.input_ids.to(device)
    out: dict[str, Any] = {"model": spec.name, "batch": [n, s]}

    ref = hf_model(spec, weights, device, torch.float32)
    with torch.no_grad():
        ref32 = ref(ids).logits.float()
    del ref
    eng32 = engine_on(rt, unit(rt, spec, "fp32", False, device))
    got32 = engine_logits(eng32, b)
    del eng32
    _, out["fp32_max_abs"] = _errors(got32, ref32)
    out["logits_max_abs"] = float(ref32.abs().max())
    del got32

    ref16 = hf_model(spec, weights, device, torch.bfloat16)
    with torch.no_grad():
        hf16 = ref16(ids).logits.float()
    del ref16
    eng16 = engine_on(rt, unit(rt, spec, "bf16", False, device))
    got16 = engine_logits(eng16, b)
    res16 = eng16.forward(b, micro_batch=n).result
    assert res16 is not None and res16.logprobs is not None  # the LM head's last block
    lp_eng = res16.logprobs   # the engine's vocab log-softmax
    del eng16
    e_mean, e_max = _errors(got16, ref32)
    h_mean, h_max = _errors(hf16, ref32)
    out.update(bf16_engine_vs_fp32=[e_mean, e_max], bf16_hf_vs_fp32=[h_mean, h_max],
               bf16_engine_vs_hf_bf16_max=_errors(got16, hf16)[1],
               bf16_argmax_agree=float((got16.argmax(-1) == hf16.argmax(-1)).float().mean()))
    lp32 = token_logprobs(ref32, ids)
    le_mean, le_max = _errors(lp_eng, lp32)
    lh_mean, lh_max = _errors(token_logprobs(hf16, ids), lp32)
    out.update(bf16_logprob_engine_vs_fp32=[le_mean, le_max],
               bf16_logprob_hf_vs_fp32=[lh_mean, lh_max])
    ok32 = out["fp32_max_abs"] <= FP32_LOGITS_ATOL

    def within(e: tuple[float, float], h: tuple[float, float]) -> bool:
        return e[0] <= BF16_MEAN_RATIO * h[0] and e[1] <= BF16_MAX_RATIO * h[1]

    ok16 = within((e_mean, e_max), (h_mean, h_max)) and within((le_mean, le_max),
                                                               (lh_mean, lh_max))
    out.update(fp32_ok=ok32, bf16_ok=ok16, ok=ok32 and ok16, seconds=time.perf_counter() - t0)
    del got16, hf16, ref32, lp32
    free()
    return out


# ---------------------------------------------------------------- 2. bf16 + master, generation
def train_batch(spec: ModelSpec, n: int, s: int, seed: int = 7) -> Batch:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, spec.vocab_size, (n, s), generator=g)
    return Batch(ids, None, {"weight": torch.full((n, s - 1), 1.0 / (n * (s - 1)))})


def _snapshot(ts: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in ts.items()}


def master_relation(params: dict[str, torch.Tensor], master: dict[str, torch.Tensor]
                    ) -> list[str]:
    """Names whose bf16 parameter is not its fp32 master rounded to bf16 (bitwise)."""
    return [n for n, p in params.items()
            if master[n].dtype != torch.float32 or not torch.equal(p, master[n].to(p.dtype))]


def check_training(rt: Any, spec: ModelSpec, device: str, n: int, s: int, micro: int
                   ) -> dict[str, Any]:
    """Two AdamW steps on bf16 parameters with fp32 masters, and the first one on fp32."""
    t0 = time.perf_counter()
    adam = AdamConfig(lr=LR)
    batch = train_batch(spec, n, s)
    st = unit(rt, spec, "bf16", True, device)
    eng = engine_on(rt, st, adam)
    assert eng.adam_state is not None
    master = eng.adam_state.master
    out: dict[str, Any] = {"batch": [n, s], "micro_batch": micro, "lr": LR,
                           "master_tensors": len(master), "param_tensors": len(st.params),
                           "param_dtype": str(next(iter(st.params.values())).dtype),
                           "mismatch_before": len(master_relation(st.params, master))}
    m0, p0 = _snapshot(master), _snapshot(st.params)
    r1 = eng.train_step(batch, weighted_nll, micro).result
    sync(device)
    bad1 = master_relation(st.params, master)
    numel = sum(t.numel() for t in master.values())
    moved = sum(int((master[k] != m0[k]).sum()) for k in master)
    still = [k for k in master if torch.equal(master[k], m0[k])]
    p_moved = sum(int((st.params[k] != p0[k]).sum()) for k in master)
    d16 = {k: (master[k] - m0[k]).float() for k in master}
    m1 = _snapshot(master)
    r2 = eng.train_step(batch, weighted_nll, micro).result
    sync(device)
    bad2 = master_relation(st.params, master)
    moved2 = sum(int((master[k] != m1[k]).sum()) for k in master)
    still += [k for k in master if torch.equal(master[k], m1[k])]
    step = eng.adam_state.step
    del eng, st, m0, p0, m1
    free()

    st32 = unit(rt, spec, "fp32", True, device)
    eng32 = engine_on(rt, st32, adam)
    w0 = _snapshot(st32.params)
    r32 = eng32.train_step(batch, weighted_nll, micro).result
    sync(device)
    dot = n16 = n32 = diff = 0.0
    agree = 0
    for k, d in d16.items():
        d32 = (st32.params[k] - w0[k]).float()
        dot += float((d * d32).sum())
        n16 += float((d * d).sum())
        n32 += float((d32 * d32).sum())
        diff += float(((d - d32) ** 2).sum())
        agree += int((torch.sign(d) == torch.sign(d32)).sum())
    del eng32, st32, w0, d16
    free()
    out.update(
        loss_bf16=r1.loss, loss_bf16_step2=r2.loss, loss_fp32=r32.loss, grad_norm_bf16=r1.grad_norm,
        grad_norm_fp32=r32.grad_norm, clip_coef_bf16=r1.clip_coef, step_after_two=step,
        mismatch_after_step1=len(bad1), mismatch_after_step2=len(bad2),
        master_tensors_unmoved=still[:3],
        master_moved_frac_step1=moved / numel, master_moved_frac_step2=moved2 / numel,
        bf16_param_moved_frac_step1=p_moved / numel,
        update_cosine_vs_fp32=dot / max(1e-30, (n16 * n32) ** 0.5),
        update_rel_l2_vs_fp32=(diff / max(1e-30, n32)) ** 0.5,
        update_sign_agree_vs_fp32=agree / numel)
    assert r1.loss is not None and r32.loss is not None
    checks = {
        "params_are_rounded_masters": out["mismatch_before"] == 0 and not bad1 and not bad2,
        # every master tensor moves in each step (embedding rows of absent tokens do not)
        "masters_move": not still,
        # at this lr most updates are below bf16's resolution: only the masters keep them
        "masters_keep_sub_bf16_updates": moved > 2 * p_moved,
        "step_counted": step == 2,
        "loss_close_to_fp32": abs(r1.loss - r32.loss) <= 1e-2 * abs(r32.loss),
        "grad_norm_close_to_fp32": abs(r1.grad_norm - r32.grad_norm) <= 5e-2 * r32.grad_norm,
        "update_close_to_fp32": out["update_cosine_vs_fp32"] >= 0.9,
    }
    out.update(checks=checks, ok=all(checks.values()), seconds=time.perf_counter() - t0)
    return out


def check_generation(rt: Any, spec: ModelSpec, device: str, n: int, s: int, new: int
                     ) -> dict[str, Any]:
    """Seeded sampling twice (bf16, left-padded prompts); greedy with the cache vs no cache."""
    t0 = time.perf_counter()
    g = torch.Generator().manual_seed(9)
    ids = torch.randint(1, spec.vocab_size, (n, s), generator=g)
    am = torch.ones(n, s, dtype=torch.long)
    for i in range(min(n, 3)):
        am[i, :2 * i] = 0
    prompts = Batch(ids.masked_fill(am == 0, 0), am)
    sp = SamplingParams(max_new_tokens=new, temperature=1.0, top_p=0.9, seed=3)
    eng16 = engine_on(rt, unit(rt, spec, "bf16", False, device))
    a = eng16.generate(prompts, sp).result
    b = eng16.generate(prompts, sp).result
    sp_other = replace(sp, seed=4)
    c = eng16.generate(prompts, sp_other).result
    del eng16
    free()
    out: dict[str, Any] = {"batch": [n, s], "new_tokens": new,
                           "sampled_equal_twice": bool(torch.equal(a.tokens, b.tokens)
                                                       and torch.equal(a.lengths, b.lengths)),
                           "other_seed_differs": not bool(torch.equal(a.tokens, c.tokens))}

    eng32 = engine_on(rt, unit(rt, spec, "fp32", False, device))
    plain = Batch(ids)
    greedy = eng32.generate(plain, SamplingParams(max_new_tokens=new, temperature=0.0)).result
    full = Batch(torch.cat([ids, greedy.tokens], dim=1))
    logits = engine_logits(eng32, full)
    want = logits[:, s - 1:s - 1 + new].argmax(-1).cpu()
    out["greedy_cache_agree"] = float((want == greedy.tokens).float().mean())
    del eng32, logits
    free()
    out["ok"] = (out["sampled_equal_twice"] and out["other_seed_differs"]
                 and out["greedy_cache_agree"] >= 0.95)
    out["seconds"] = time.perf_counter() - t0
    return out


# ---------------------------------------------------------------- 3. measured vs estimated
@dataclass(frozen=True)
class Case:
    """``seqs`` sequences of ``prompt`` + ``response`` tokens (generation samples ``response``
    new ones), ``a`` micro-batches of ``seqs // a``; tp = pp = dp = 1."""

    kind: str
    seqs: int
    prompt: int
    response: int
    a: int = 1

    @property
    def b(self) -> int:
        return self.seqs // self.a

    @property
    def name(self) -> str:
        return f"{self.kind} b{self.b}a{self.a} n{self.seqs} s{self.prompt}+{self.response}"


def cases(quick: bool) -> list[Case]:
    if quick:
        shapes = [(4, 32, 32, 1), (8, 32, 32, 2), (4, 64, 64, 1), (8, 64, 64, 2)]
        gens = [(4, 16, 8), (8, 16, 8), (4, 32, 8), (8, 32, 4)]
    else:
        shapes = [(16, 256, 256, 1), (16, 512, 512, 2), (32, 256, 256, 2),
                  (8, 1024, 1024, 2), (32, 512, 512, 4), (16, 1024, 1024, 2)]
        gens = [(16, 128, 64), (64, 128, 64), (32, 256, 32), (128, 64, 32), (8, 512, 64),
                (256, 128, 16)]
    out = [Case("train", n, p, r, a) for n, p, r, a in shapes]
    out += [Case("forward", 2 * n, p, r, a) for n, p, r, a in shapes]
    out += [Case("generate", n, p, r) for n, p, r in gens]
    return out


def job_for(c: Case, spec: ModelSpec, preset: str, dtype: str) -> JobSpec:
    dev = get_device(preset)
    cluster = Cluster(dev, 1, 1)
    wl = Workload(prompts_per_step=c.seqs, responses_per_prompt=1, prompt_len=c.prompt,
                  response_len_mean=c.response, response_len_max=c.response,
                  ppo_mini_batches=1, ppo_epochs=1, param_dtype=dtype, grad_dtype="fp32",
                  master_weights=dtype != "fp32")
    return JobSpec(spec, cluster, GpuPool.first(cluster, 1), ppo(), wl)


def stage_estimate(c: Case, spec: ModelSpec, preset: str, dtype: str,
                   eff: Efficiencies | None = None) -> tuple[Estimate, float]:
    """The cost model's estimate without its offload / reload term, and that term's seconds."""
    est = CostModel(job_for(c, spec, preset, dtype), eff).estimate(
        STAGES[c.kind], Candidate(Layout(1, 1), 1, c.b, c.a))
    host = [o for o in est.ops if o.cls is OpClass.HOST]
    host_s = sum(o.ideal_s / est.efficiencies[o.cls] for o in host)
    return replace(est, ops=tuple(o for o in est.ops if o.cls is not OpClass.HOST)), host_s


def tensor_bytes(est: Estimate) -> int:
    return int(est.peak_mem_bytes - est.memory.get("workspace", 0))


@dataclass(frozen=True)
class Measured:
    case: Case
    wall_s: float                      # fastest of the repeats
    walls: tuple[float, ...]
    peak_mem_bytes: int
    op_s: dict[str, float]             # per op class, fastest run


def run_case(eng: StageEngine, c: Case, spec: ModelSpec, device: str, repeats: int) -> Measured:
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(0, spec.vocab_size, (c.seqs, c.prompt + c.response), generator=g)
    op: Callable[[bool | None], Any]
    if c.kind == "train":
        batch = train_batch(spec, c.seqs, c.prompt + c.response)
        op = lambda tm: eng.train_step(batch, weighted_nll, c.b, track_memory=tm)
    elif c.kind == "forward":
        op = lambda tm: eng.forward(Batch(ids), c.b, track_memory=tm)
    else:
        sp = SamplingParams(max_new_tokens=c.response, temperature=1.0, seed=3)
        op = lambda tm: eng.generate(Batch(ids[:, :c.prompt]), sp, c.b,
                                     track_memory=tm)
    op(None)   # warm-up
    runs = [op(None).measurement for _ in range(repeats)]
    best = min(runs, key=lambda m: m.wall_s)
    peak = best.peak_mem_bytes
    if peak is None:   # CPU: memory from a profiled run of its own
        peak = op(True).measurement.peak_mem_bytes
    assert peak is not None  # a memory run measures it
    free()
    return Measured(c, best.wall_s, tuple(m.wall_s for m in runs), int(peak), dict(best.op_s))


def measure_all(rt: Any, spec: ModelSpec, device: str, dtype: str, todo: list[Case],
                repeats: int) -> list[Measured]:
    """Train cases on a trainable unit, then forward and generation on a parameters-only one:
    only the unit under test is on the device, so the allocator's peak is its state plus the
    operation's transients."""
    out: list[Measured] = []
    for trainable in (True, False):
        group = [c for c in todo if (c.kind == "train") == trainable]
        if not group:
            continue
        st = unit(rt, spec, dtype, trainable, device)
        eng = engine_on(rt, st, AdamConfig(lr=LR))
        for c in group:
            m = run_case(eng, c, spec, device, repeats)
            ops = " ".join(f"{k}={v * 1e3:.1f}" for k, v in sorted(m.op_s.items()))
            log(f"measured  {c.name:<34} {m.wall_s * 1e3:9.2f} ms  "
                f"{m.peak_mem_bytes / 2**20:9.1f} MiB  [{ops} ms]")
            out.append(m)
        del eng, st
        free()
    return out


def calibrated(train: list[Measured], spec: ModelSpec, preset: str, dtype: str
               ) -> tuple[Efficiencies, dict[StageKind, float]]:
    cal = Calibrator(prior=Efficiencies(device=preset), forgetting=1.0)
    for m in train:
        est, _ = stage_estimate(m.case, spec, preset, dtype)
        cal.observe_stage(est, m.wall_s)
        cal.observe_memory(KINDS[m.case.kind], tensor_bytes(est), m.peak_mem_bytes)
    return cal.efficiencies(), cal.memory_scale()


def score(test: list[Measured], eff: Efficiencies, mem_scale: dict[StageKind, float],
          spec: ModelSpec, preset: str, dtype: str) -> list[dict[str, Any]]:
    rows = []
    for m in test:
        raw, host_s = stage_estimate(m.case, spec, preset, dtype)
        est, _ = stage_estimate(m.case, spec, preset, dtype, eff)
        mem = int(tensor_bytes(est) * mem_scale.get(KINDS[m.case.kind], 1.0))
        rows.append({"case": m.case.name, "kind": m.case.kind, "measured_s": m.wall_s,
                     "estimated_s": est.latency_s, "uncalibrated_s": raw.latency_s,
                     "offload_reload_s_left_out": host_s,
                     "latency_err": abs(est.latency_s - m.wall_s) / m.wall_s,
                     "measured_mem": m.peak_mem_bytes, "estimated_mem": mem,
                     "uncalibrated_mem": tensor_bytes(raw),
                     "memory_err": abs(mem - m.peak_mem_bytes) / m.peak_mem_bytes,
                     "op_s": m.op_s, "walls": list(m.walls)})
    return rows


def _mape(rows: list[dict[str, Any]], key: str, kind: str | None = None) -> float:
    sel = [r[key] for r in rows if kind is None or r["kind"] == kind]
    return statistics.fmean(sel) if sel else float("nan")


def scored(results: list[Measured], spec: ModelSpec, preset: str, dtype: str
           ) -> tuple[list[dict[str, Any]], Efficiencies]:
    folds = [results[0::2], results[1::2]]
    rows: list[dict[str, Any]] = []
    for k in (0, 1):
        eff, mem_scale = calibrated(folds[1 - k], spec, preset, dtype)
        rows += score(folds[k], eff, mem_scale, spec, preset, dtype)
    return rows, calibrated(results, spec, preset, dtype)[0]


# ---------------------------------------------------------------- driver
def _guarded(name: str, fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """A failing check is reported (and fails the run), the others still run."""
    try:
        out = fn()
    except Exception as e:  # noqa: BLE001 - reported in the JSON, exit code 1
        import traceback

        traceback.print_exc()
        out = {"ok": False, "error": f"{type(e).__name__}: {e}"}
    log(f"{name}: {json.dumps(out, default=str)}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    ap.add_argument("--model", default=None, help=f"model preset (default {BENCH_MODEL.name}; "
                    "small-llama for a CPU run)")
    ap.add_argument("--preset", default=None, help="device preset the cost model prices "
                    "(default h200-141gb on cuda, cpu on cpu)")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"],
                    help="parameter dtype of the measured cases (bf16: fp32 master weights)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="small shapes (a CPU run of the logic)")
    ap.add_argument("--out", default=None, help="also write the JSON summary to DIR/summary.json")
    args = ap.parse_args(argv)
    t_start = time.perf_counter()
    device = args.device
    cuda = device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        print("engine_cuda_check: --device cuda but torch sees no CUDA device", file=sys.stderr)
        return 2
    spec = BENCH_MODEL if args.model in (None, BENCH_MODEL.name) else get_model(args.model)
    preset = args.preset or ("h200-141gb" if cuda else "cpu")
    torch.backends.cuda.matmul.allow_tf32 = False   # fp32 reference comparisons stay fp32
    torch.backends.cudnn.allow_tf32 = False
    name = torch.cuda.get_device_name() if cuda else "cpu"
    log(f"device {name}, torch {torch.__version__}, model {spec.name} "
        f"({spec.param_count() / 1e6:.1f} M parameters), cost preset {preset}")
    rt = runtime_state()

    q = args.quick
    checks = {
        "reference": _guarded("reference", lambda: check_reference(
            rt, spec, device, 2 if q else 4, 24 if q else 256)),
        "reference_qwen3": _guarded("reference_qwen3", lambda: check_reference(
            rt, get_model("tiny-qwen3"), device, 2, 24 if q else 128)),
        "training": _guarded("training", lambda: check_training(
            rt, spec, device, 4 if q else 8, 32 if q else 512, 2 if q else 4)),
        "generation": _guarded("generation", lambda: check_generation(
            rt, spec, device, 4 if q else 8, 8 if q else 32, 6 if q else 24)),
    }

    rows: list[dict[str, Any]] = []
    eff_all: Efficiencies | None = None
    measure_error = None
    try:
        results = measure_all(rt, spec, device, args.dtype, cases(q), args.repeats)
        rows, eff_all = scored(results, spec, preset, args.dtype)
    except Exception as e:  # noqa: BLE001 - reported in the JSON, exit code 1
        import traceback

        traceback.print_exc()
        measure_error = f"{type(e).__name__}: {e}"
    for r in rows:
        log(f"{r['case']:<34} time {r['measured_s'] * 1e3:9.2f} ms meas / "
            f"{r['estimated_s'] * 1e3:9.2f} est ({r['latency_err']:6.1%}) / "
            f"{r['uncalibrated_s'] * 1e3:9.2f} uncal   memory "
            f"{r['measured_mem'] / 2**20:9.1f} MiB meas / {r['estimated_mem'] / 2**20:9.1f} est "
            f"({r['memory_err']:6.1%}) / {r['uncalibrated_mem'] / 2**20:9.1f} uncal")

    kinds = sorted({r["kind"] for r in rows})
    ok = all(c.get("ok") for c in checks.values()) and measure_error is None
    summary = {
        "source": f"measured on {name}",
        "device_name": name,
        "torch": torch.__version__,
        "cuda": torch.version.cuda if cuda else None,
        "model": spec.name, "params": spec.param_count(), "param_dtype": args.dtype,
        "cost_preset": preset,
        "checks_ok": ok,
        "checks": checks,
        "cases": len(rows),
        "latency_mape": _mape(rows, "latency_err") if rows else None,
        "memory_mape": _mape(rows, "memory_err") if rows else None,
        "latency_mape_by_kind": {k: _mape(rows, "latency_err", k) for k in kinds},
        "memory_mape_by_kind": {k: _mape(rows, "memory_err", k) for k in kinds},
        "scoring": "measured vs estimated, 2-fold: calibrated on the other fold; estimate "
                   "without offload/reload and workspace",
        "calibrated_efficiency_all_cases": eff_all.to_dict()["efficiency"] if eff_all else None,
        "rows": [{k: (round(v, 6) if isinstance(v, float) else v) for k, v in r.items()
                  if k not in ("op_s", "walls")} | {"op_s": {c: round(s, 6) for c, s in
                                                          r["op_s"].items()}} for r in rows],
        "measure_error": measure_error,
        "wall_s": time.perf_counter() - t_start,
    }
    line = json.dumps(summary, default=str)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "summary.json"), "w") as f:
            f.write(line + "\n")
    print(line, flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
