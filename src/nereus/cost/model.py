"""The cost model: latency and peak memory of one model-stage candidate, and the weight sync.

Every latency is a sum of ops whose ideal time comes from FLOPs over peak FLOP/s, bytes over
HBM or link bandwidth, and per-message latency; op-class efficiencies scale them (``explain()``
shows each). Memory is the fullest GPU of a replica: parameters, gradients, optimizer state,
activations (with or without recomputation), KV cache, co-resident idle state, workspace.

Modelling choices (each is stated where it is used):
- Training runs 1F1B pipelines; the bubble is (pp - 1) micro-batch slots; DP gradient sync and
  the optimizer step are not overlapped with compute (conservative).
- Time uses the mean sequence length (frameworks pack or remove padding); memory uses the
  maximum (one micro-batch may hold the longest sequences).
- Idle model-stages are offloaded to host memory between phases, as verl and OpenRLHF do when
  models share GPUs; reload and offload cost host-link time. Inside a phase, model-stages that
  share a GPU set keep their state resident (the planner passes it as ``coresident_bytes``).
- Generation follows a vLLM-style engine: chunked prefill, then decode iterations whose batch is
  as large as the KV cache left in memory allows; each iteration costs the larger of its HBM
  reads (weights + KV) and its GEMM time (roofline).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache

from nereus.cost import work
from nereus.cost.candidate import Candidate, Layout, Link, Links
from nereus.cost.comm import collective
from nereus.cost.efficiency import Efficiencies
from nereus.cost.estimate import HEADROOM, Estimate
from nereus.cost.ops import Op, OpClass
from nereus.spec.job import JobSpec
from nereus.spec.model import Head
from nereus.spec.sharding import layout_problem, max_shard_numel
from nereus.spec.workflow import ModelStage, StageKind

GiB = 1024**3
MiB = 1024**2

# Per-GPU workspace outside the tensors we count: CUDA context (~0.5 GiB), cuBLAS and NCCL
# buffers, allocator fragmentation. Assumption, corrected by memory calibration.
GPU_WORKSPACE_BYTES = 2 * GiB
# A CPU device slot: the Python process and torch's allocator arenas. Assumption.
CPU_WORKSPACE_BYTES = 64 * MiB
# Tokens per chunked-prefill step (vLLM's max_num_batched_tokens is of this order). Assumption.
PREFILL_CHUNK_TOKENS = 8192
# Memory traffic of one Adam update, bytes per parameter on top of the param/grad/master reads:
# read and write m and v (fp32) = 16 bytes (Kingma & Ba 2015 update rule; counted by hand).
ADAM_MOMENT_TRAFFIC = 16


@dataclass(frozen=True)
class _Ctx:
    """What every term of one estimate needs."""

    stage: ModelStage
    cand: Candidate
    head: Head
    trainable: bool
    links: Links
    numel: int          # parameters on the fullest GPU of a replica (tp x pp position)
    layers: int         # layers per pipeline block


class CostModel:
    """Prices candidates of one job's model-stages under a set of efficiencies."""

    def __init__(self, job: JobSpec, efficiencies: Efficiencies | None = None,
                 memory_scale: Mapping[StageKind, float] | None = None):
        self.job = job
        self.eff = efficiencies or Efficiencies(device=job.cluster.device.name)
        self.memory_scale = dict(memory_scale or {})
        self.device = job.cluster.device
        self.node_size = min(job.cluster.devices_per_node, job.pool.largest_node_share())
        self._cache: dict[tuple[str, Candidate, int], Estimate] = {}

    # ------------------------------------------------------------------ public API
    def stage_batch(self, stage: ModelStage | str) -> int:
        """Sequences one run of the stage handles: per update (train) or per step."""
        st = self._stage(stage)
        w = self.job.workload
        if st.kind is StageKind.TRAIN:
            return w.sequences_per_update
        greedy = self.job.workflow.greedy_baseline
        if st.kind is StageKind.GENERATE:
            return w.sequences_per_step + (w.prompts_per_step if greedy else 0)
        extra = w.prompts_per_step if greedy and st.model == "reward" else 0
        return w.sequences_per_step + extra

    def layout_problem(self, stage: ModelStage | str, layout: Layout) -> str | None:
        return layout_problem(self.job.model, layout.tp, layout.pp)

    def estimate(self, stage: ModelStage | str, cand: Candidate,
                 coresident_bytes: int = 0) -> Estimate:
        st = self._stage(stage)
        key = (st.name, cand, int(coresident_bytes))
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        est = self._estimate(st, cand, int(coresident_bytes))
        self._cache[key] = est
        return est

    def resident_bytes(self, stage: ModelStage | str, layout: Layout) -> int:
        """State a stage keeps on a GPU while it waits for its turn inside its phase."""
        st = self._stage(stage)
        role = self.job.workflow.model(st.model)
        numel = max_shard_numel(self.job.model, role.head, layout.tp, layout.pp)
        w = self.job.workload
        if st.kind is StageKind.TRAIN:
            return numel * w.trainable_state_bytes_per_param()
        return numel * w.param_bytes

    def weight_sync(self, train: Layout, gen: Layout) -> Estimate:
        """Per-step resharding of the actor's weights from its training to its generation layout.

        Each generation GPU receives the part of its shard that the training shard on the same
        GPU does not already hold (the stages are colocated, so the overlap of their shards is
        local): 1/(tp_g pp_g) - 1/(max(tp) max(pp)) of the weights. Communicators for it are
        created once per layout pair, not per step.
        """
        m, w, dev = self.job.model, self.job.workload, self.device
        sync = self.job.workflow.weight_sync()
        name = f"weight_sync[{train}->{gen}]"
        cand = Candidate(gen, 1, 1, 1)
        if sync is None:
            return Estimate(name, cand, (), self.eff, {}, 0, dev.memory_bytes)
        full = m.param_count(Head.LM) * w.param_bytes
        own = full / gen.size
        overlap = full / (max(gen.tp, train.tp) * max(gen.pp, train.pp))
        need = max(0.0, own - overlap)
        intra = gen.size <= self.node_size and train.size <= self.node_size
        link = Link.INTRA if intra else Link.INTER
        ops: list[Op] = []
        op = collective("allgather", max(2, train.size), need * max(2, train.size) /
                        max(1, train.size - 1), link, dev, term="weight_sync",
                        name="reshard actor weights (train->gen)")
        if op is not None and need > 0:
            ops.append(op)
        notes = () if need > 0 else ("generation shards already resident: no weight movement",)
        return Estimate(name, cand, tuple(ops), self.eff, {}, 0, dev.memory_bytes, notes)

    # ------------------------------------------------------------------ internals
    def _stage(self, stage: ModelStage | str) -> ModelStage:
        return stage if isinstance(stage, ModelStage) else self.job.workflow.stage(stage)

    def _ctx(self, st: ModelStage, cand: Candidate) -> _Ctx:
        role = self.job.workflow.model(st.model)
        m = self.job.model
        return _Ctx(st, cand, role.head, role.trainable and st.kind is StageKind.TRAIN,
                    Links.for_candidate(cand, self.node_size),
                    max_shard_numel(m, role.head, cand.tp, cand.pp), m.num_layers // cand.pp)

    def _estimate(self, st: ModelStage, cand: Candidate, coresident: int) -> Estimate:
        problem = layout_problem(self.job.model, cand.tp, cand.pp)
        if problem:
            raise ValueError(f"{st.name}: {problem}")
        ctx = self._ctx(st, cand)
        if st.kind is StageKind.TRAIN:
            ops, memory, notes = self._train(ctx)
        elif st.kind is StageKind.FORWARD:
            ops, memory, notes = self._forward(ctx)
        else:
            ops, memory, notes = self._generate(ctx, coresident)
        scale = self.memory_scale.get(st.kind, 1.0)
        memory = {k: int(v * scale) for k, v in memory.items()}
        memory["co-resident idle state"] = coresident
        resident = self.resident_bytes(st, cand.layout)
        return Estimate(st.name, cand, tuple(o for o in ops if o is not None), self.eff, memory,
                        int(resident * scale), self.device.memory_bytes, tuple(notes))

    def _workspace(self) -> int:
        return CPU_WORKSPACE_BYTES if self.device.name == "cpu" else GPU_WORKSPACE_BYTES

    def _host_op(self, nbytes: float, name: str) -> Op | None:
        """Offload / reload over the host link; none for a CPU slot (state lives in host RAM)."""
        if self.device.name == "cpu" or nbytes <= 0:
            return None
        return Op(OpClass.HOST, "offload", name, 1, 0.0, nbytes, nbytes / self.device.host_bw)

    def _compute_ops(self, ctx: _Ctx, tokens: float, seq: float, passes: float, count: float,
                     term: str, with_head: bool) -> list[Op]:
        """GEMM and attention ops of ``count`` micro-batches of ``tokens`` on the last block."""
        m, dev, tp = self.job.model, self.device, ctx.cand.tp
        gemm = tokens * work.gemm_flops_per_token(m) * ctx.layers
        if with_head:
            gemm += tokens * work.head_flops_per_token(m, ctx.head)
        attn = (tokens / seq) * work.attention_flops(m, seq, seq, causal=True) * ctx.layers
        per_gemm = passes * gemm / tp
        per_attn = passes * attn / tp
        return [
            Op(OpClass.GEMM, term, "GEMMs (layers + head)", count, per_gemm, 0.0,
               count * per_gemm / dev.peak_flops),
            Op(OpClass.ATTENTION, term, "attention", count, per_attn, 0.0,
               count * per_attn / dev.peak_flops),
        ]

    def _tp_ops(self, ctx: _Ctx, tokens: float, per_layer: int, count: float, term: str,
                loss_reductions: int) -> list[Op | None]:
        m, w, dev = self.job.model, self.job.workload, self.device
        tp = ctx.cand.tp
        act = tokens * m.hidden_size * w.param_bytes
        ops = [collective("allreduce", tp, act, ctx.links.tp, dev, term=term,
                          name=f"tp allreduce x{per_layer}/layer",
                          count=count * per_layer * ctx.layers)]
        if loss_reductions and ctx.head is Head.LM:
            ops.append(collective("allreduce", tp, tokens * 4.0, ctx.links.tp, dev, term=term,
                                  name="vocab-parallel log-softmax",
                                  count=count * loss_reductions))
        return ops

    def _pp_op(self, ctx: _Ctx, tokens: float, per_mb: int, count: float, term: str) -> Op | None:
        if ctx.cand.pp == 1:
            return None
        act = tokens * self.job.model.hidden_size * self.job.workload.param_bytes
        return collective("p2p", 2, act, ctx.links.pp, self.device, term=term,
                          name=f"pp send/recv x{per_mb}/micro-batch", count=count * per_mb)

    # ---- training --------------------------------------------------------------
    def _train(self, ctx: _Ctx) -> tuple[list[Op | None], dict[str, int], list[str]]:
        m, w, dev, c = self.job.model, self.job.workload, self.device, ctx.cand
        updates = w.updates_per_step
        seq_t, seq_m = float(w.seq_len_mean), float(w.seq_len_max)
        tok_t, tok_m = c.micro_batch * seq_t, c.micro_batch * seq_m
        passes = 4.0 if c.recompute else 3.0  # fwd + 2x bwd (+ fwd again when recomputing)
        ar_per_layer = 6 if c.recompute else 4
        ops: list[Op | None] = []
        slots = {"compute": updates * c.grad_accum, "bubble": updates * (c.pp - 1)}
        for term, count in slots.items():
            if count == 0:
                continue
            ops += self._compute_ops(ctx, tok_t, seq_t, passes, count, term, with_head=True)
            ops += self._tp_ops(ctx, tok_t, ar_per_layer, count,
                                "tp_comm" if term == "compute" else term, loss_reductions=3)
            ops.append(self._pp_op(ctx, tok_t, 2, count, "pp_comm" if term == "compute" else term))
        grad = ctx.numel * w.grad_bytes
        ops.append(collective("allreduce", c.dp, grad, ctx.links.dp, dev, term="dp_sync",
                              name="gradient allreduce", count=updates))
        if m.tie_embeddings and ctx.head is Head.LM and c.pp > 1:
            emb = m.vocab_size / c.tp * m.hidden_size * w.grad_bytes
            ops.append(collective("allreduce", 2, emb, ctx.links.pp, dev, term="dp_sync",
                                  name="tied embedding grad (first<->last)", count=updates))
        master = w.optimizer_state_bytes_per_param() - (8 if w.optimizer.value == "adam" else 0)
        moments = ADAM_MOMENT_TRAFFIC if w.optimizer.value == "adam" else 0
        traffic = ctx.numel * (2 * w.param_bytes + w.grad_bytes + 2 * master + moments)
        ops.append(Op(OpClass.OPTIMIZER, "optimizer", "optimizer step", updates, 0.0, traffic,
                      updates * traffic / dev.hbm_bw))
        state = ctx.numel * (w.param_bytes + w.optimizer_state_bytes_per_param())
        ops.append(self._host_op(2 * state, "reload + offload params and optimizer state"))

        # memory on the fullest GPU
        per_layer = work.layer_activation_bytes(m, w.param_bytes).per_rank(c.tp)
        in_flight = min(c.pp, c.grad_accum)
        if c.recompute:
            stored = ctx.layers * tok_m * m.hidden_size * w.param_bytes  # layer inputs only
            first = in_flight * stored + tok_m * per_layer               # + one layer live
            last = stored + tok_m * per_layer
        else:
            first = in_flight * ctx.layers * tok_m * per_layer
            last = ctx.layers * tok_m * per_layer
        logits = 8.0 * tok_m * m.vocab_size / c.tp if ctx.head is Head.LM else 0.0
        memory = {
            "parameters": ctx.numel * w.param_bytes,
            "gradients": ctx.numel * w.grad_bytes,
            "optimizer state": ctx.numel * w.optimizer_state_bytes_per_param(),
            "activations": int(max(first, last + logits)),
            "workspace": self._workspace(),
        }
        notes = [f"1F1B pipeline: {c.grad_accum} micro-batches + {c.pp - 1} bubble slots per "
                 f"update, {updates} updates per step"]
        if c.recompute:
            notes.append("full activation recomputation: one extra forward per micro-batch")
        return ops, memory, notes

    # ---- inference ---------------------------------------------------------------
    def _forward(self, ctx: _Ctx) -> tuple[list[Op | None], dict[str, int], list[str]]:
        m, w, c = self.job.model, self.job.workload, ctx.cand
        seq_t, seq_m = float(w.seq_len_mean), float(w.seq_len_max)
        tok_t, tok_m = c.micro_batch * seq_t, c.micro_batch * seq_m
        ops: list[Op | None] = []
        for term, count in (("compute", c.grad_accum), ("bubble", c.pp - 1)):
            if count == 0:
                continue
            ops += self._compute_ops(ctx, tok_t, seq_t, 1.0, count, term, with_head=True)
            ops += self._tp_ops(ctx, tok_t, 2, count, "tp_comm" if term == "compute" else term,
                                loss_reductions=2)
            ops.append(self._pp_op(ctx, tok_t, 1, count, "pp_comm" if term == "compute" else term))
        ops.append(self._host_op(ctx.numel * w.param_bytes, "reload params"))
        live = work.layer_forward_workspace_bytes(m, w.param_bytes).per_rank(c.tp) * tok_m
        boundary = 2.0 * min(c.pp, c.grad_accum) * tok_m * m.hidden_size * w.param_bytes
        logits = 8.0 * tok_m * m.vocab_size / c.tp if ctx.head is Head.LM else 0.0
        memory = {
            "parameters": ctx.numel * w.param_bytes,
            "activations": int(live + boundary + logits),
            "workspace": self._workspace(),
        }
        return ops, memory, [f"forward pipeline: {c.grad_accum} micro-batches + {c.pp - 1} "
                             f"bubble slots"]

    # ---- generation --------------------------------------------------------------
    def kv_bytes_per_token(self, layout: Layout) -> int:
        """KV-cache bytes one token takes on one GPU (its layers, its KV heads)."""
        m = self.job.model
        heads = max(1, m.num_kv_heads // layout.tp)
        return 2 * (m.num_layers // layout.pp) * heads * m.head_dim * self.job.workload.param_bytes

    def _generate(self, ctx: _Ctx, coresident: int) -> tuple[list[Op | None], dict[str, int],
                                                             list[str]]:
        m, w, dev, c = self.job.model, self.job.workload, self.device, ctx.cand
        n = c.micro_batch * c.grad_accum          # sequences per replica
        prompt, mean, longest = w.prompt_len, w.response_len_mean, w.response_len_max
        weights = ctx.numel * w.param_bytes
        kv_tok = self.kv_bytes_per_token(c.layout)
        kv_seq = kv_tok * (prompt + longest)
        chunk = min(PREFILL_CHUNK_TOKENS, n * prompt)
        prefill_ws = work.layer_forward_workspace_bytes(m, w.param_bytes).per_rank(c.tp) * chunk
        fixed = weights + self._workspace() + prefill_ws + coresident
        sample_bytes = 4.0 * m.vocab_size / c.tp       # fp32 logits of one sequence's next token
        free = HEADROOM * dev.memory_bytes - fixed
        batch = int(min(n, max(1.0, free // (kv_seq + sample_bytes))))
        notes = [f"decode batch {batch} of {n} sequences per replica (KV cache "
                 f"{kv_seq / MiB:.1f} MiB per sequence per GPU)"]
        if free < kv_seq + sample_bytes:
            notes.append("one sequence's KV cache does not fit next to the weights")

        ops: list[Op | None] = []
        # prefill: a forward pass over every prompt, pipelined in chunks across pp blocks
        p_tokens = float(n * prompt)
        chunks = max(1.0, math.ceil(p_tokens / PREFILL_CHUNK_TOKENS))
        gemm = p_tokens * work.gemm_flops_per_token(m) * m.num_layers / (c.tp * c.pp)
        gemm += n * work.head_flops_per_token(m, ctx.head) / c.tp
        attn = n * work.attention_flops(m, prompt, prompt, causal=True) * m.num_layers / (c.tp * c.pp)
        ops.append(Op(OpClass.GEMM, "prefill", "prefill GEMMs", 1, gemm, 0.0, gemm / dev.peak_flops))
        ops.append(Op(OpClass.ATTENTION, "prefill", "prefill attention", 1, attn, 0.0,
                      attn / dev.peak_flops))
        ops += self._tp_ops(ctx, p_tokens / chunks, 2, chunks, "prefill", loss_reductions=0)
        ops.append(self._pp_op(ctx, p_tokens / chunks, 1, chunks + c.pp - 1, "prefill"))

        # decode: iterations of the running batch; each token crosses all pp blocks in turn
        total = float(n * mean)
        iters = max(float(longest), math.ceil(total / batch))
        active = total / iters                       # mean running sequences per iteration
        slots = min(c.pp, max(1.0, active))          # micro-batches in flight in the pipeline
        ctx_len = prompt + mean / 2.0                # mean context a decode step attends over
        hbm = c.pp * weights + active * ctx_len * kv_tok * (c.pp / slots)
        flops = active * (work.gemm_flops_per_token(m) * m.num_layers
                          + work.head_flops_per_token(m, ctx.head)) / c.tp * (1.0 / slots)
        t_hbm = hbm / dev.hbm_bw / self.eff[OpClass.DECODE]
        t_gemm = flops / dev.peak_flops / self.eff[OpClass.GEMM]
        if t_hbm >= t_gemm:  # roofline: whichever bound is slower sets the iteration time
            ops.append(Op(OpClass.DECODE, "decode", "weights + KV reads per iteration", iters,
                          0.0, hbm, iters * hbm / dev.hbm_bw))
        else:
            ops.append(Op(OpClass.GEMM, "decode", "decode GEMMs per iteration", iters, flops,
                          0.0, iters * flops / dev.peak_flops))
        tokens_mb = active / slots
        # every layer all-reduces twice per token: 2 x num_layers per iteration on the path
        ops += self._tp_ops(ctx, tokens_mb, 2, iters * c.pp, "decode", loss_reductions=0)
        ops.append(self._pp_op(ctx, tokens_mb, 1, iters * c.pp, "decode"))

        memory = {
            "parameters": weights,
            "kv cache": int(batch * kv_seq),
            "activations": int(prefill_ws + batch * sample_bytes),
            "workspace": self._workspace(),
        }
        return ops, memory, notes
