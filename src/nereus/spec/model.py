"""Model architecture of a Llama-style decoder, from a Hugging Face ``config.json`` or a preset.

Every size the cost model, the sharding rules and the engine need derives from these few fields,
so the parameter count is computed here once and checked against the published totals in tests.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, replace
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StrictInt

from nereus.errors import InputError
from nereus.files import exists, is_dir, read_json, validate
from nereus.spec.workload import check_count


class Head(str, Enum):
    """Output head of a model: the LM head (actor, reference) or a scalar head (critic, reward)."""

    LM = "lm"
    SCALAR = "scalar"


@dataclass(frozen=True)
class _Family:
    """What ``transformers``' config class of one ``model_type`` assumes for a field that a
    config.json leaves out (None: derived, head_dim = hidden_size / num_attention_heads)."""

    tie_word_embeddings: bool = False
    head_dim: int | None = None
    rms_norm_eps: float = 1e-6
    # sliding-window attention as the family's config class reads it: "none" (the class has
    # no such field), "always" (it applies unless null) or "opt-in" (Qwen: only with
    # use_sliding_window, and only to the layers from max_window_layers on)
    window: str = "none"
    sliding_window: int | None = None   # the window when config.json leaves the key out
    max_window_layers: int = 28         # opt-in: the first sliding layer, when left out
    window_every: int = 1               # 2: every other layer slides (Gemma 2), from layer 0
    layer_types: bool = False           # the class takes config.json's layer_types as given
    # the gated MLP's activation: the key the class reads it from, and the values whose layer
    # ModelSpec counts and the engine computes (SwiGLU: silu; Gemma's GeGLU: gelu, which
    # GemmaConfig reads as gelu_pytorch_tanh)
    act_key: str = "hidden_act"
    activations: tuple[str, ...] = ("silu",)
    # the bias switches the class reads (attention_bias: q/k/v/o, mlp_bias: gate/up/down);
    # ModelSpec counts none of those biases, so each must be false (Qwen2's q/k/v biases are
    # no switch: its class always has them, and ModelSpec counts them)
    bias_keys: tuple[str, ...] = ()


# model_types whose decoder layer is the one ModelSpec counts: attention with q/k/v/o
# projections, a gated MLP of three matrices (SwiGLU or GeGLU), RMSNorms. The parameter count is
# within 0.06 % of the published total for each (tests/spec/test_hf_configs.py); what the
# count leaves out is a few vectors: Gemma 2's two extra norms per layer.
# Others (GPT-NeoX, Phi-1/2, StarCoder2, BERT, ...) have an ungated MLP or another layer and
# would be priced up to a third too large, so they are refused rather than guessed.
# A config without a model_type is read as Llama's.
_GELU = ("gelu_pytorch_tanh", "gelu")
FAMILIES: dict[str, _Family] = {
    "llama": _Family(bias_keys=("attention_bias", "mlp_bias")),
    "mistral": _Family(window="always", sliding_window=4096),
    "qwen2": _Family(window="opt-in", sliding_window=4096, layer_types=True),
    "qwen3": _Family(head_dim=128, window="opt-in", sliding_window=4096, layer_types=True,
                     bias_keys=("attention_bias",)),
    "phi3": _Family(rms_norm_eps=1e-5, window="always"),
    # Gemma ties the LM head to the embedding unless told otherwise, and its heads are 256 wide
    "gemma": _Family(tie_word_embeddings=True, head_dim=256, activations=_GELU,
                     bias_keys=("attention_bias",)),
    # Gemma 2's MLP reads hidden_activation (its config.json's hidden_act is not read)
    "gemma2": _Family(tie_word_embeddings=True, head_dim=256, window="always",
                      sliding_window=4096, window_every=2, layer_types=True,
                      act_key="hidden_activation", activations=_GELU,
                      bias_keys=("attention_bias",)),
}

# the transformers class of each model_type in FAMILIES
ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
                 "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
                 "phi3": "Phi3ForCausalLM", "gemma": "GemmaForCausalLM",
                 "gemma2": "Gemma2ForCausalLM"}
# the model_types the engine computes exactly (and ``to_hf_dict`` describes): Llama's layer,
# with Qwen2's q/k/v biases or Qwen3's q/k norms, and without a sliding window (the engine
# refuses one: Mistral v0.1). The others are planned, but their layer is not Llama's (Gemma:
# GeGLU, a scaled embedding, (1 + w) norms; Phi-3: fused projections). The runtime moves the
# state of those whose tensors are the sharding format's (Gemma) and refuses the others'
# checkpoints (Phi-3's fused projections)
COMPUTED = frozenset({"llama", "mistral", "qwen2", "qwen3"})

# RoPE variants (``rope_type``) the engine computes: the base frequencies, divided by a factor
# (linear), or by a factor that depends on each frequency's wavelength (Llama 3.1's llama3).
# Others (yarn, dynamic, longrope) are planned (only their context window matters there) and
# refused by the engine.
COMPUTED_ROPE = frozenset({"default", "linear", "llama3"})
# RoPE variants whose factor stretches the window config.json's max_position_embeddings (or,
# for YaRN, original_max_position_embeddings) gives; the others' max_position_embeddings is
# the extended window already (``_HfConfig.context_window``)
STRETCHING_ROPE = frozenset({"linear", "dynamic", "yarn"})


@dataclass(frozen=True)
class RopeScaling:
    """A scaled RoPE: config.json's ``rope_scaling`` (``rope_parameters`` in transformers 5).

    ``factor`` stretches the positions; llama3 keeps frequencies whose wavelength is under
    ``original_max_position_embeddings / high_freq_factor``, divides those over
    ``original / low_freq_factor`` by ``factor`` and blends in between (Llama 3.1 config.json:
    8, 1, 4, 8192).
    """

    kind: str                                    # rope_type: linear, llama3, yarn, ...
    factor: float | None = None
    low_freq_factor: float | None = None
    high_freq_factor: float | None = None
    original_max_position_embeddings: int | None = None

    def __post_init__(self) -> None:
        bad = _rope_problem(self.kind, self.factor, self.low_freq_factor, self.high_freq_factor,
                            self.original_max_position_embeddings)
        if bad:
            raise InputError(f"model.rope_scaling.{bad[0]}", bad[1])

    def to_hf_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"rope_type": self.kind}
        for f in ("factor", "low_freq_factor", "high_freq_factor",
                  "original_max_position_embeddings"):
            if getattr(self, f) is not None:
                out[f] = getattr(self, f)
        return out


def _rope_problem(kind: str, factor: float | None, low: float | None, high: float | None,
                  original: int | None) -> tuple[str, str] | None:
    """(field, what is wrong) where the parameters do not describe the RoPE variant."""
    if kind in ("linear", "llama3") and factor is None:
        return "factor", f"rope_type {kind!r} needs a factor"
    if kind == "llama3":
        for f, v in (("low_freq_factor", low), ("high_freq_factor", high),
                     ("original_max_position_embeddings", original)):
            if v is None:
                return f, "rope_type 'llama3' needs it"
        if high <= low:  # type: ignore[operator]
            return "high_freq_factor", f"{high} must exceed low_freq_factor={low}"
    return None


# Llama 3.1 / 3.2 / 3.3 config.json rope_scaling
LLAMA3_ROPE = RopeScaling("llama3", 8.0, 1.0, 4.0, 8192)


@dataclass(frozen=True)
class ModelSpec:
    """Architecture of a Llama-style decoder (Llama, Mistral, Qwen2/3, Phi-3, Gemma 1/2: see
    FAMILIES; and tiny CPU models)."""

    name: str
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    tie_embeddings: bool = False
    qk_norm: bool = False  # Qwen3: RMSNorm over each head's q and k
    rope_theta: float = 500_000.0
    rms_norm_eps: float = 1e-5
    # context window in tokens (prompt + response); None where no published model sets one
    # (the tiny CPU models: RoPE has no hard limit, and the engine enforces none)
    max_position_embeddings: int | None = 131_072
    # the Hugging Face model_type (FAMILIES); "": "qwen3" where qk_norm, else "llama". What the
    # planner prices is the same for every family; the engine computes the COMPUTED ones
    model_type: str = ""
    # a scaled RoPE (None: plain RoPE at rope_theta); the engine computes COMPUTED_ROPE
    rope_scaling: RopeScaling | None = None
    # tokens a sliding layer's attention looks back at most (Mistral v0.1, Phi-3, Gemma 2;
    # Qwen2/3 where use_sliding_window); None: every layer sees the whole sequence. The sliding
    # layers are window_from, window_from + window_every, ... (every layer from 0 for Mistral
    # and Phi-3, every other one for Gemma 2, those from max_window_layers on for Qwen). The
    # planner keeps their KV cache to the window; the engine refuses a window
    sliding_window: int | None = None
    window_from: int = 0
    window_every: int = 1

    def __post_init__(self) -> None:
        if not self.model_type:
            object.__setattr__(self, "model_type", "qwen3" if self.qk_norm else "llama")
        if self.model_type not in FAMILIES:
            raise InputError("model.model_type", f"unknown model_type {self.model_type!r}",
                             sorted(FAMILIES))
        if self.qk_norm != (self.model_type == "qwen3"):
            raise InputError("model.qk_norm", f"{self.qk_norm} with model_type "
                             f"{self.model_type!r}: only Qwen3 normalizes q and k per head")
        for field in ("hidden_size", "intermediate_size", "num_layers", "num_heads",
                      "num_kv_heads", "head_dim", "vocab_size"):
            if getattr(self, field) < 1:
                raise InputError(f"model.{field}", f"must be >= 1, got {getattr(self, field)}")
        if self.num_heads % self.num_kv_heads:
            raise InputError("model.num_kv_heads",
                             f"{self.num_kv_heads} does not divide num_heads={self.num_heads}")
        if self.sliding_window is not None and self.sliding_window < 1:
            raise InputError("model.sliding_window", f"must be >= 1, got {self.sliding_window}")
        if self.window_from < 0 or self.window_every not in (1, 2):
            raise InputError("model.window_every" if self.window_from >= 0 else
                             "model.window_from", f"window_from={self.window_from}, "
                             f"window_every={self.window_every}", "window_from >= 0, "
                             "window_every 1 or 2")
        if self.max_position_embeddings is not None and self.max_position_embeddings < 1:
            raise InputError("model.max_position_embeddings",
                             f"must be >= 1, got {self.max_position_embeddings}")

    # ---- sizes of the pieces (parameters, not bytes) ----
    @property
    def q_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def qkv_bias(self) -> bool:
        """Whether q, k and v projections have biases (Qwen2's layer)."""
        return self.model_type == "qwen2"

    def attention_params(self) -> int:
        qk_norm = 2 * self.head_dim if self.qk_norm else 0
        bias = self.q_dim + 2 * self.kv_dim if self.qkv_bias else 0
        return (self.hidden_size * self.q_dim          # q_proj
                + 2 * self.hidden_size * self.kv_dim   # k_proj, v_proj
                + self.q_dim * self.hidden_size        # o_proj
                + qk_norm + bias)

    def mlp_params(self) -> int:
        return 3 * self.hidden_size * self.intermediate_size  # gate, up, down

    def layer_params(self) -> int:
        return self.attention_params() + self.mlp_params() + 2 * self.hidden_size  # two norms

    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    def head_params(self, head: Head = Head.LM) -> int:
        """Parameters of the output head that are not shared with the embedding."""
        if head is Head.SCALAR:
            return self.hidden_size + 1  # value / score head: hidden -> 1, and its bias
        return 0 if self.tie_embeddings else self.vocab_size * self.hidden_size

    def param_count(self, head: Head = Head.LM) -> int:
        return (self.embedding_params() + self.num_layers * self.layer_params()
                + self.hidden_size + self.head_params(head))

    # ---- per-token quantities the cost model uses ----
    def sliding_layers(self, layers: range) -> int:
        """How many of ``layers`` attend within the sliding window (0 without one)."""
        if self.sliding_window is None:
            return 0
        first = max(layers.start, self.window_from)
        if first >= layers.stop:
            return 0
        every = self.window_every
        first += (self.window_from - first) % every  # the first sliding layer from there
        return len(range(first, layers.stop, every))

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        """KV-cache bytes one token occupies across all layers (K and V)."""
        return 2 * self.num_layers * self.kv_dim * dtype_bytes

    def with_name(self, name: str) -> ModelSpec:
        return replace(self, name=name)

    # ---- construction ----
    @classmethod
    def from_hf_config(cls, path: str | Path, name: str | None = None) -> ModelSpec:
        """Read a Hugging Face ``config.json`` (path to the file or to the model folder), named
        ``name`` or after where it was read from (:func:`name_from_path`)."""
        p = Path(path)
        if is_dir(p, "model"):
            p = p / "config.json"
        if not exists(p, "model"):
            raise InputError("model", f"no config.json at {path}",
                             "a preset name or a path to a Hugging Face config.json or its folder")
        cfg = read_json(p, "model")
        if not isinstance(cfg, dict):
            raise InputError("model", f"{p} must hold a JSON object",
                             "a Hugging Face config.json: a JSON object of the model's fields")
        return cls.from_hf_dict(cfg, name or name_from_path(p))

    @classmethod
    def from_hf_dict(cls, cfg: dict[str, Any], name: str) -> ModelSpec:
        required = ("hidden_size", "intermediate_size", "num_hidden_layers",
                    "num_attention_heads", "vocab_size")
        missing = [k for k in required if k not in cfg]
        if missing:
            where = (" (a multimodal model: its decoder's fields sit under text_config)"
                     if isinstance(cfg.get("text_config"), dict) else "")
            raise InputError("model", f"config.json lacks {', '.join(missing)}{where}",
                             "a Llama-style decoder config "
                             "(LlamaForCausalLM, Qwen3ForCausalLM, ...)")
        model_type = cfg.get("model_type")
        experts = [k for k in MOE_KEYS if cfg.get(k)]
        if experts or (isinstance(model_type, str) and "moe" in model_type.lower()):
            what = f"{experts[0]}: {cfg[experts[0]]!r}" if experts else f"model_type {model_type!r}"
            raise InputError("model", f"config.json describes a mixture-of-experts model ({what}); "
                             "only dense decoders are supported",
                             "dense Llama-style decoders: LlamaForCausalLM, Qwen3ForCausalLM, ...")
        c = validate(_HfConfig, cfg, "model", prefix="model.config.")
        c.check_bounds()
        family = FAMILIES.get(c.model_type or "llama")
        if family is None:
            raise InputError("model.config.model_type",
                             f"{c.model_type!r} is not a Llama-style decoder Nereus can price",
                             sorted(FAMILIES))
        c.check_layer(c.model_type or "llama", family)
        head_dim = c.head_dim or family.head_dim
        if c.hidden_size % c.num_attention_heads and head_dim is None:
            raise InputError("model.config.num_attention_heads",
                             f"{c.num_attention_heads} does not divide hidden_size "
                             f"{c.hidden_size} and no head_dim is given",
                             f"a divisor of {c.hidden_size}, or a head_dim")
        kv = c.num_key_value_heads or c.num_attention_heads
        if c.num_attention_heads % kv:
            heads = c.num_attention_heads
            raise InputError("model.config.num_key_value_heads",
                             f"{kv} does not divide num_attention_heads {heads}",
                             [d for d in range(1, heads + 1) if heads % d == 0])
        tie = c.tie_word_embeddings
        return cls(
            name=name,
            hidden_size=c.hidden_size,
            intermediate_size=c.intermediate_size,
            num_layers=c.num_hidden_layers,
            num_heads=c.num_attention_heads,
            num_kv_heads=kv,
            head_dim=head_dim or c.hidden_size // c.num_attention_heads,
            vocab_size=c.vocab_size,
            tie_embeddings=family.tie_word_embeddings if tie is None else tie,
            # Qwen3 (dense) normalizes q and k per head; "qwen3_moe" and the like are refused above
            qk_norm=c.model_type == "qwen3",
            rope_theta=c.theta(),
            rms_norm_eps=family.rms_norm_eps if c.rms_norm_eps is None else c.rms_norm_eps,
            max_position_embeddings=c.context_window(),
            model_type=c.model_type or "llama",
            rope_scaling=c.scaling(),
            **c.window(family),
        )

    @property
    def hf_class(self) -> str:
        """The ``transformers`` class of this model_type (its parameter names are the sharding
        format's)."""
        return ARCHITECTURES[self.model_type]

    def to_hf_dict(self) -> dict[str, Any]:
        """The ``config.json`` fields ``transformers`` needs to build the same architecture:
        the COMPUTED families only (another family's activation, norms and embedding scale are
        no fields of a ModelSpec)."""
        if self.model_type not in COMPUTED:
            raise InputError("model.model_type", f"{self.model_type!r}: no config.json is "
                             "written for it (its layer differs from Llama's beyond the sizes "
                             "Nereus keeps)", sorted(COMPUTED))
        return {
            "architectures": [self.hf_class],
            "model_type": self.model_type,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "vocab_size": self.vocab_size,
            "tie_word_embeddings": self.tie_embeddings,
            "rope_theta": self.rope_theta,
            "rms_norm_eps": self.rms_norm_eps,
            "hidden_act": "silu",
            "attention_bias": False,
            "mlp_bias": False,
        } | ({} if self.max_position_embeddings is None
             else {"max_position_embeddings": self.max_position_embeddings}) \
          | ({} if self.rope_scaling is None
             else {"rope_scaling": self.rope_scaling.to_hf_dict()}) \
          | self._window_fields()

    def _window_fields(self) -> dict[str, Any]:
        """The sliding window as the family's config class reads it (Mistral's applies unless
        null to every layer; Qwen's only with use_sliding_window, from max_window_layers on)."""
        family = FAMILIES[self.model_type]
        if family.window == "opt-in":
            if self.sliding_window is None:
                return {"use_sliding_window": False}
            if self.window_every != 1 or self.window_from >= self.num_layers:
                raise InputError("model.window_every" if self.window_every != 1 else
                                 "model.window_from", f"window_from={self.window_from}, "
                                 f"window_every={self.window_every}: a Qwen config slides every "
                                 "layer from max_window_layers to the last")
            return {"use_sliding_window": True, "sliding_window": self.sliding_window,
                    "max_window_layers": self.window_from}
        if family.window == "always":
            if self.sliding_window is not None and (self.window_from, self.window_every) != \
                    (0, family.window_every):
                raise InputError("model.window_from", f"{self.model_type} slides every "
                                 f"{family.window_every} layer(s) from the first; window_from="
                                 f"{self.window_from}, window_every={self.window_every} has no "
                                 "config.json")
            return {"sliding_window": self.sliding_window}
        return {}


# Presets: the fields of each model's published config.json on the Hugging Face hub.
MODEL_PRESETS: dict[str, ModelSpec] = {
    # meta-llama/Llama-3.1-8B config.json; 8.03 B parameters (model card)
    "llama-3.1-8b": ModelSpec("llama-3.1-8b", 4096, 14336, 32, 32, 8, 128, 128256,
                              rope_theta=500_000.0, rms_norm_eps=1e-5, rope_scaling=LLAMA3_ROPE),
    # Qwen/Qwen3-14B config.json; 14.8 B parameters (model card)
    "qwen3-14b": ModelSpec("qwen3-14b", 5120, 17408, 40, 40, 8, 128, 151936, qk_norm=True,
                           rope_theta=1_000_000.0, rms_norm_eps=1e-6,
                           max_position_embeddings=40960),
    # Qwen/Qwen3-32B config.json; 32.8 B parameters (model card)
    "qwen3-32b": ModelSpec("qwen3-32b", 5120, 25600, 64, 64, 8, 128, 151936, qk_norm=True,
                           rope_theta=1_000_000.0, rms_norm_eps=1e-6,
                           max_position_embeddings=40960),
    # Qwen/Qwen2.5-7B-Instruct config.json (q/k/v biases; 32,768 tokens without YaRN);
    # 7.62 B parameters (model card)
    "qwen2.5-7b-instruct": ModelSpec("qwen2.5-7b-instruct", 3584, 18944, 28, 28, 4, 128, 152064,
                                     rope_theta=1_000_000.0, rms_norm_eps=1e-6,
                                     max_position_embeddings=32768, model_type="qwen2"),
    # meta-llama/Llama-3.3-70B-Instruct config.json; 70.6 B parameters (model card)
    "llama-3.3-70b": ModelSpec("llama-3.3-70b", 8192, 28672, 80, 64, 8, 128, 128256,
                               rope_theta=500_000.0, rms_norm_eps=1e-5,
                               rope_scaling=LLAMA3_ROPE),
    # Tiny models for CPU runs and tests (not published models).
    # No context window: planning tests price them at the big models' lengths.
    "tiny-llama": ModelSpec("tiny-llama", 64, 160, 4, 4, 2, 16, 256, rope_theta=10_000.0,
                            max_position_embeddings=None),
    "tiny-qwen3": ModelSpec("tiny-qwen3", 64, 128, 4, 8, 4, 8, 250, tie_embeddings=True,
                            qk_norm=True, rope_theta=10_000.0, rms_norm_eps=1e-6,
                            max_position_embeddings=None),
    "tiny-qwen2": ModelSpec("tiny-qwen2", 64, 160, 4, 4, 2, 16, 256, tie_embeddings=True,
                            rope_theta=10_000.0, rms_norm_eps=1e-6, max_position_embeddings=None,
                            model_type="qwen2"),
    "small-llama": ModelSpec("small-llama", 256, 688, 8, 8, 4, 32, 2048, rope_theta=10_000.0,
                             max_position_embeddings=None),
}


def get_model(name_or_path: str) -> ModelSpec:
    """A preset by name, a model read from a ``config.json`` path, or a Hugging Face id
    (``Qwen/Qwen2.5-7B-Instruct``, as verl's ``model.path`` names one) whose config.json is in
    the local Hugging Face cache. Nothing is downloaded: planning makes no network calls."""
    key = name_or_path.lower()
    if key in MODEL_PRESETS:
        return MODEL_PRESETS[key]
    if not name_or_path.strip():  # Path("") is the working directory
        raise InputError("model", "empty", [*MODEL_PRESETS, "a path to a Hugging Face config.json",
                                            "a Hugging Face id (ORG/NAME)"])
    if key.endswith((".yaml", ".yml")):
        # a job or layout YAML given as the model: it was read as JSON ("not valid JSON"),
        # or, where there is no such file, taken for a hub id to `hf download`
        raise InputError("model", f"{name_or_path} is a YAML file, not a model's config.json "
                         "(a job YAML is what --config reads)",
                         f"a preset ({', '.join(MODEL_PRESETS)}), a path to a Hugging Face "
                         "config.json or its folder, or a Hugging Face id (ORG/NAME)")
    if exists(name_or_path, "model"):
        return ModelSpec.from_hf_config(name_or_path)
    if _looks_like_path(name_or_path):  # no preset or id has a .json suffix or a ./ in it
        raise InputError("model", f"no file or folder at {name_or_path}",
                         "a path to a Hugging Face config.json or its folder, a preset "
                         f"({', '.join(MODEL_PRESETS)}), or a Hugging Face id (ORG/NAME)")
    cached = hub_cached_config(name_or_path)
    if cached is not None:
        return ModelSpec.from_hf_config(cached, name_or_path.rsplit("/", 1)[-1])
    hint = (f"; to read it from the hub, `hf download {name_or_path} config.json` first"
            if _HUB_ID.fullmatch(name_or_path) else "")
    raise InputError("model", f"unknown model {name_or_path!r}{hint}",
                     [*MODEL_PRESETS, "a path to a Hugging Face config.json",
                      "a Hugging Face id whose config.json is in the local cache"])


def name_from_path(config: Path) -> str:
    """A model read from ``config`` is named after the file (``llama-8b.json``: llama-8b), or
    after its folder where the file is a model folder's ``config.json``, as Hugging Face
    lays one out: two configs side by side in one folder are two models, not one name."""
    if config.name.lower() == "config.json":
        return config.absolute().parent.name or config.stem
    return config.stem


def _looks_like_path(value: str) -> bool:
    """Whether a ``model`` that names nothing here was meant as a file: it ends in .json, or
    has a / and is no Hugging Face id (``./llama.json``, ``/models/llama``, ``../x``)."""
    return (value.lower().endswith(".json")
            or any(sep in value for sep in ("/", os.sep)) and not _HUB_ID.fullmatch(value))


# a Hugging Face model id: ORG/NAME of letters, digits and - _ . (huggingface_hub's rule)
_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*")


def hub_cached_config(repo_id: str) -> Path | None:
    """The cached ``config.json`` of Hugging Face model ``repo_id`` (the newest snapshot the
    cache's ``main`` ref names; ``HF_HUB_CACHE`` or ``HF_HOME`` move the cache), or None: not
    an id (huggingface_hub's own rules included), or not cached."""
    if not _HUB_ID.fullmatch(repo_id):
        return None
    from huggingface_hub import try_to_load_from_cache  # imported here: planning rarely needs it

    try:
        got = try_to_load_from_cache(repo_id, "config.json")
    except ValueError:  # HFValidationError: "a--b", "a..b", over 96 characters, ...
        return None
    return Path(got) if isinstance(got, str) else None


# Upper bounds on a config's sizes, far past every published dense decoder (Llama-3.1-405B:
# 126 layers, hidden 16,384, MLP 53,248, 128 heads; Gemma: 262,144-token vocabulary): past them
# a size is a typo, and the planner, which works per layer, would run for minutes, or the cost
# model's float sums would overflow, instead of saying so.
MAX_LAYERS = 1 << 10            # 1,024
MAX_WIDTH = 1 << 20             # hidden_size, intermediate_size, head_dim: 1,048,576
MAX_HEADS = 1 << 12             # 4,096
MAX_VOCAB = 1 << 24             # 16,777,216
MAX_CONTEXT = 1 << 30           # max_position_embeddings, before a rope_scaling factor
MAX_ROPE_FACTOR = 1 << 10       # published ones: 4 (Qwen YaRN) to 32 (Llama 3.2)
_BOUNDS = {"hidden_size": MAX_WIDTH, "intermediate_size": MAX_WIDTH, "head_dim": MAX_WIDTH,
           "num_hidden_layers": MAX_LAYERS, "num_attention_heads": MAX_HEADS,
           "num_key_value_heads": MAX_HEADS, "vocab_size": MAX_VOCAB,
           "max_position_embeddings": MAX_CONTEXT, "sliding_window": MAX_CONTEXT}


# keys of a mixture-of-experts config (Qwen-MoE, Mixtral, DeepSeek): priced as dense, such a
# model would look like a small dense one
MOE_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")

_Finite = Annotated[float, Field(gt=0, allow_inf_nan=False)]


class _RopeScaling(BaseModel):
    """``rope_scaling`` (transformers 4) or ``rope_parameters`` (transformers 5, which also
    holds ``rope_theta``): the RoPE variant and its parameters (other keys ignored)."""

    model_config = ConfigDict(extra="ignore", strict=True)

    rope_type: str | None = None
    type: str | None = None  # the older spelling of rope_type
    rope_theta: _Finite | None = None
    factor: _Finite | None = Field(None, le=MAX_ROPE_FACTOR)
    low_freq_factor: _Finite | None = None
    high_freq_factor: _Finite | None = None
    original_max_position_embeddings: StrictInt | None = None

    @property
    def kind(self) -> str:
        return self.rope_type or self.type or "default"


class _HfConfig(BaseModel):
    """The fields of a Hugging Face ``config.json`` that Nereus reads (others are ignored).
    A field left out, or null, takes the default of the model_type's config class (FAMILIES)."""

    model_config = ConfigDict(extra="ignore", strict=True)

    model_type: str | None = None
    # sizes: integers, in 1.._BOUNDS[field] (check_bounds)
    hidden_size: StrictInt
    intermediate_size: StrictInt
    num_hidden_layers: StrictInt
    num_attention_heads: StrictInt
    num_key_value_heads: StrictInt | None = None
    head_dim: StrictInt | None = None
    vocab_size: StrictInt
    tie_word_embeddings: bool | None = None
    rope_theta: _Finite | None = None  # 10,000 in every family when left out
    rms_norm_eps: _Finite | None = None
    max_position_embeddings: StrictInt | None = None
    rope_scaling: _RopeScaling | None = None
    # transformers 5's name; where a config has both, transformers takes rope_scaling
    rope_parameters: _RopeScaling | None = None
    sliding_window: StrictInt | None = None
    use_sliding_window: bool | None = None
    max_window_layers: StrictInt | None = Field(None, ge=0)
    layer_types: list[str] | None = None  # per layer: "sliding_attention" or another kind
    # the layer's activation and bias switches (``layer``: the family's values only)
    hidden_act: str | None = None
    hidden_activation: str | None = None
    attention_bias: bool | None = None
    mlp_bias: bool | None = None

    def check_layer(self, model_type: str, family: _Family) -> None:
        """The activation and biases are those of the layer ModelSpec counts, or an
        InputError naming the field: a Llama config with biases or another activation was
        read as a plain Llama (and written back without them)."""
        act = getattr(self, family.act_key)
        if act is not None and act not in family.activations:
            raise InputError(f"model.config.{family.act_key}",
                             f"{act!r} is not the activation of a {model_type!r} layer as "
                             "Nereus counts and computes it", family.activations)
        for key in family.bias_keys:
            if getattr(self, key):
                raise InputError(f"model.config.{key}", f"true: Nereus counts and computes a "
                                 f"{model_type!r} layer without these biases",
                                 "false, or left out")

    def window(self, family: _Family) -> dict[str, Any]:
        """ModelSpec's sliding_window, window_from and window_every as the family's config
        class reads them: no window where the class has no such field (Llama, Gemma); a key
        left out takes the family's default (Mistral's 4,096), null means none; Qwen's applies
        only with use_sliding_window, to the layers from max_window_layers on (none if that is
        past the last); Gemma 2's to every other layer from the first."""
        if family.window == "none":
            return {}
        if family.window == "opt-in" and not self.use_sliding_window:
            return {}
        size = (self.sliding_window if "sliding_window" in self.model_fields_set
                else family.sliding_window)
        if size is None:
            return {}
        layers = self.num_hidden_layers
        if family.layer_types and self.layer_types is not None:  # as given, as the class does
            if len(self.layer_types) != layers:
                raise InputError("model.config.layer_types", f"{len(self.layer_types)} entries "
                                 f"for {layers} layers", "one per layer")
            sliding = [i for i, t in enumerate(self.layer_types) if t == "sliding_attention"]
        elif family.window == "opt-in":
            first = (family.max_window_layers if self.max_window_layers is None
                     else self.max_window_layers)
            sliding = list(range(first, layers))
        else:
            sliding = list(range(0, layers, family.window_every))
        if not sliding:
            return {}
        for every in (1, 2):
            if sliding == list(range(sliding[0], layers, every)):
                return {"sliding_window": size, "window_from": sliding[0], "window_every": every}
        raise InputError("model.config.layer_types", f"sliding layers {sliding[:6]}"
                         f"{' ...' if len(sliding) > 6 else ''} are not a pattern Nereus keeps",
                         "every layer, or every other one, from some layer to the last")

    def rope(self) -> _RopeScaling | None:
        return self.rope_scaling or self.rope_parameters

    def theta(self) -> float:
        r = self.rope()
        return (r.rope_theta if r is not None and r.rope_theta is not None else
                self.rope_theta or 10_000.0)

    def scaling(self) -> RopeScaling | None:
        """The scaled RoPE, or None for plain RoPE (no scaling, or rope_type "default")."""
        r = self.rope()
        if r is None or r.kind == "default":
            return None
        fields = (r.kind, r.factor, r.low_freq_factor, r.high_freq_factor,
                  r.original_max_position_embeddings)
        bad = _rope_problem(*fields)
        if bad:  # named by the key the file used
            key = "rope_scaling" if self.rope_scaling is not None else "rope_parameters"
            raise InputError(f"model.config.{key}.{bad[0]}", bad[1])
        return RopeScaling(*fields)

    def check_bounds(self) -> None:
        """Every size in 1..its bound (_BOUNDS), or an InputError naming the field."""
        for f, most in _BOUNDS.items():
            v = getattr(self, f)
            if v is not None:
                check_count(f"model.config.{f}", v, most)
        for key in ("rope_scaling", "rope_parameters"):
            r = getattr(self, key)
            if r is not None and r.original_max_position_embeddings is not None:
                check_count(f"model.config.{key}.original_max_position_embeddings",
                            r.original_max_position_embeddings, MAX_CONTEXT)

    def context_window(self) -> int | None:
        """Tokens a sequence may hold: ``max_position_embeddings``, or the longer window a
        ``rope_scaling`` factor stretches it to (YaRN on Qwen3: 32,768 x 4); None if unknown.

        Only the variants whose config keeps the window it was trained at stretch it (vLLM's
        ``_get_and_verify_max_len`` reads them so): linear and dynamic from
        max_position_embeddings, YaRN from original_max_position_embeddings where given. The
        others' max_position_embeddings already is the extended window (llama3: Llama 3.2-1B's
        131,072, with factor 32 over 8,192; longrope and su: Phi-3's 131,072)."""
        n = self.max_position_embeddings
        r = self.rope()
        if r is None or r.factor is None or r.kind not in STRETCHING_ROPE:
            return n
        base = (r.original_max_position_embeddings if r.kind == "yarn" else None) or n
        if base is None:
            return n
        return max(n or 0, int(base * r.factor))
