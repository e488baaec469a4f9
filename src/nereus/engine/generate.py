"""Batched autoregressive generation with a KV cache sharded by heads.

A prefill pass runs the (left-padded) prompts through the pipeline and fills each worker's cache
for its layers and its KV heads; each decode iteration then feeds one token per sequence. The
last block gathers the full-vocabulary logits of the last position over TP (one row per
sequence), samples (``nereus.engine.sampling``) and broadcasts the tokens over the PP group, so
every worker of the replica knows them and stops at the same iteration. That broadcast also
tells a block that its send of the step's hidden states was received, so no step's send
outlives the step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from nereus.engine.batch import Batch
from nereus.engine.comm import broadcast
from nereus.engine.model import ParallelModel
from nereus.engine.pipeline import PipeLinks, forward_step
from nereus.engine.sampling import SamplingParams, sample
from nereus.errors import InputError


@dataclass(frozen=True)
class GenerationResult:
    """``tokens`` [n, max_new_tokens]: generated tokens, ``pad_token`` after a sequence ends;
    ``lengths`` [n]: tokens generated per sequence (a stop token counts)."""

    tokens: torch.Tensor
    lengths: torch.Tensor

    @staticmethod
    def cat(parts: list[GenerationResult]) -> GenerationResult:
        width = max(p.tokens.shape[1] for p in parts)
        toks = [torch.nn.functional.pad(p.tokens, (0, width - p.tokens.shape[1])) for p in parts]
        return GenerationResult(torch.cat(toks), torch.cat([p.lengths for p in parts]))


class Generator:
    """Generates on one worker of a replica; all workers of the replica call it together."""

    def __init__(self, model: ParallelModel) -> None:
        self.model = model

    def generate(self, prompts: Batch, sampling: SamplingParams,
                 micro_batch: int | None = None) -> GenerationResult:
        """Micro-batches of ``micro_batch`` prompts run one after another (default: all).
        Sequences without a global ``index`` are numbered 0..n-1 in this call."""
        if prompts.index is None:
            prompts = Batch(prompts.input_ids, prompts.attention_mask, prompts.extra,
                            torch.arange(prompts.size))
        # a replica of an uneven DP split may end on a short micro-batch (``replica_rows``)
        micros = prompts.to(self.model.device).split(micro_batch or prompts.size,
                                                     short_last=True)
        parts = [self._one(mb, sampling) for mb in micros]
        return GenerationResult.cat(parts)

    @torch.no_grad()
    def _one(self, prompts: Batch, sp: SamplingParams) -> GenerationResult:
        m = self.model
        pos = m.pos
        b, s = prompts.size, prompts.seq_len
        am = prompts.attention_mask
        if am is not None and not bool(am[:, -1].all()):
            raise InputError("prompts.attention_mask", "prompts must be left-padded (the last "
                             "column real for every sequence)")
        index = prompts.index
        assert index is not None
        cap = s + sp.max_new_tokens
        cache = m.new_cache(b, cap)
        am_full = torch.ones(b, cap, dtype=torch.long, device=m.device)
        if am is not None:
            am_full[:, :s] = am
        positions = prompts.positions()
        last_pos = positions[:, -1]
        links = PipeLinks(m)
        out = torch.full((b, sp.max_new_tokens), sp.pad_token, dtype=torch.long, device=m.device)
        done = torch.zeros(b, dtype=torch.bool, device=m.device)
        lengths = torch.zeros(b, dtype=torch.long, device=m.device)
        stops = torch.tensor(sp.stop_tokens, dtype=torch.long, device=m.device)
        x: torch.Tensor = prompts.tokens()
        q_pos = positions
        try:
            for step in range(sp.max_new_tokens):
                m.rec.decode = step > 0
                sq = x.shape[1]
                inp = m.inputs(q_pos, am_full, sq, cache.length + sq)
                h = forward_step(m, links, x if pos.first else None, inp,
                                 m.hidden_shape(b, sq), tag=step, cache=cache)
                tok = torch.empty(b, dtype=torch.long, device=m.device)
                if pos.last:
                    assert h is not None
                    logits = m.full_logits(h[:, -1])
                    tok = sample(logits, index, step, sp)
                # the other blocks wait here for the last block's forward and sampling
                tok = broadcast(tok, pos.pp - 1, m.groups.pp, m.rec, m.groups.pp_intra,
                                wait_peers=True)
                # the last block sent the tokens after its forward, so every block has received
                # this step's hidden states: the send of this block is done
                links.finish()
                drawn = tok
                tok = torch.where(done, torch.full_like(tok, sp.pad_token), tok)
                out[:, step] = tok
                lengths += (~done).long()
                if stops.numel():
                    done |= torch.isin(tok, stops)
                if bool(done.all()):
                    break
                # a finished row goes on with the token it drew, never with the pad token
                # (which need not be a token id, e.g. -1): its outputs are dropped anyway
                x = drawn[:, None]
                last_pos = last_pos + 1
                q_pos = last_pos[:, None]
        finally:
            m.rec.decode = False
            links.finish()
        return GenerationResult(out.cpu(), lengths.cpu())
