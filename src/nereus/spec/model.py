"""Model architecture of a Llama-style decoder, from a Hugging Face ``config.json`` or a preset.

Every size the cost model, the sharding rules and the engine need derives from these few fields,
so the parameter count is computed here once and checked against the published totals in tests.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StrictInt

from nereus.errors import InputError
from nereus.files import read_json, validate


class Head(str, Enum):
    """Output head of a model: the LM head (actor, reference) or a scalar head (critic, reward)."""

    LM = "lm"
    SCALAR = "scalar"


@dataclass(frozen=True)
class ModelSpec:
    """Architecture of a Llama-style decoder (Llama 3, Qwen3 and tiny CPU models)."""

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

    def __post_init__(self) -> None:
        for field in ("hidden_size", "intermediate_size", "num_layers", "num_heads",
                      "num_kv_heads", "head_dim", "vocab_size"):
            if getattr(self, field) < 1:
                raise InputError(f"model.{field}", f"must be >= 1, got {getattr(self, field)}")
        if self.num_heads % self.num_kv_heads:
            raise InputError("model.num_kv_heads",
                             f"{self.num_kv_heads} does not divide num_heads={self.num_heads}")
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

    def attention_params(self) -> int:
        qk_norm = 2 * self.head_dim if self.qk_norm else 0
        return (self.hidden_size * self.q_dim          # q_proj
                + 2 * self.hidden_size * self.kv_dim   # k_proj, v_proj
                + self.q_dim * self.hidden_size        # o_proj
                + qk_norm)

    def mlp_params(self) -> int:
        return 3 * self.hidden_size * self.intermediate_size  # gate, up, down

    def layer_params(self) -> int:
        return self.attention_params() + self.mlp_params() + 2 * self.hidden_size  # two norms

    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    def head_params(self, head: Head = Head.LM) -> int:
        """Parameters of the output head that are not shared with the embedding."""
        if head is Head.SCALAR:
            return self.hidden_size  # value / score head: hidden -> 1
        return 0 if self.tie_embeddings else self.vocab_size * self.hidden_size

    def param_count(self, head: Head = Head.LM) -> int:
        return (self.embedding_params() + self.num_layers * self.layer_params()
                + self.hidden_size + self.head_params(head))

    # ---- per-token quantities the cost model uses ----
    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        """KV-cache bytes one token occupies across all layers (K and V)."""
        return 2 * self.num_layers * self.kv_dim * dtype_bytes

    def with_name(self, name: str) -> ModelSpec:
        return replace(self, name=name)

    # ---- construction ----
    @classmethod
    def from_hf_config(cls, path: str | Path, name: str | None = None) -> ModelSpec:
        """Read a Hugging Face ``config.json`` (path to the file or to the model folder)."""
        p = Path(path)
        if p.is_dir():
            p = p / "config.json"
        if not p.is_file():
            raise InputError("model", f"no config.json at {path}",
                             "a preset name or a path to a Hugging Face config.json or its folder")
        cfg = read_json(p, "model")
        if not isinstance(cfg, dict):
            raise InputError("model", f"{p} must hold a JSON object")
        return cls.from_hf_dict(cfg, name or p.parent.name or p.stem)

    @classmethod
    def from_hf_dict(cls, cfg: dict[str, Any], name: str) -> ModelSpec:
        required = ("hidden_size", "intermediate_size", "num_hidden_layers",
                    "num_attention_heads", "vocab_size")
        missing = [k for k in required if k not in cfg]
        if missing:
            raise InputError("model", f"config.json lacks {', '.join(missing)}",
                             "a Llama-style decoder config (LlamaForCausalLM, Qwen3ForCausalLM, ...)")
        model_type = cfg.get("model_type")
        experts = [k for k in MOE_KEYS if cfg.get(k)]
        if experts or (isinstance(model_type, str) and "moe" in model_type.lower()):
            what = f"{experts[0]}: {cfg[experts[0]]!r}" if experts else f"model_type {model_type!r}"
            raise InputError("model", f"config.json describes a mixture-of-experts model ({what}); "
                             "only dense decoders are supported",
                             "dense Llama-style decoders: LlamaForCausalLM, Qwen3ForCausalLM, ...")
        c = validate(_HfConfig, cfg, "model", prefix="model.config.")
        if c.hidden_size % c.num_attention_heads and c.head_dim is None:
            raise InputError("model.config.num_attention_heads",
                             f"{c.num_attention_heads} does not divide hidden_size "
                             f"{c.hidden_size} and no head_dim is given")
        kv = c.num_key_value_heads or c.num_attention_heads
        if c.num_attention_heads % kv:
            raise InputError("model.config.num_key_value_heads",
                             f"{kv} does not divide num_attention_heads {c.num_attention_heads}")
        return cls(
            name=name,
            hidden_size=c.hidden_size,
            intermediate_size=c.intermediate_size,
            num_layers=c.num_hidden_layers,
            num_heads=c.num_attention_heads,
            num_kv_heads=kv,
            head_dim=c.head_dim or c.hidden_size // c.num_attention_heads,
            vocab_size=c.vocab_size,
            tie_embeddings=c.tie_word_embeddings,
            # Qwen3 (dense) normalizes q and k per head; "qwen3_moe" and the like are refused above
            qk_norm=c.model_type == "qwen3",
            rope_theta=c.rope_theta,
            rms_norm_eps=c.rms_norm_eps,
            max_position_embeddings=c.context_window(),
        )

    def to_hf_dict(self) -> dict[str, Any]:
        """The ``config.json`` fields ``transformers`` needs to build the same architecture."""
        return {
            "architectures": ["Qwen3ForCausalLM" if self.qk_norm else "LlamaForCausalLM"],
            "model_type": "qwen3" if self.qk_norm else "llama",
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
             else {"max_position_embeddings": self.max_position_embeddings})


# Presets: the fields of each model's published config.json on the Hugging Face hub.
MODEL_PRESETS: dict[str, ModelSpec] = {
    # meta-llama/Llama-3.1-8B config.json; 8.03 B parameters (model card)
    "llama-3.1-8b": ModelSpec("llama-3.1-8b", 4096, 14336, 32, 32, 8, 128, 128256,
                              rope_theta=500_000.0, rms_norm_eps=1e-5),
    # Qwen/Qwen3-14B config.json; 14.8 B parameters (model card)
    "qwen3-14b": ModelSpec("qwen3-14b", 5120, 17408, 40, 40, 8, 128, 151936, qk_norm=True,
                           rope_theta=1_000_000.0, rms_norm_eps=1e-6, max_position_embeddings=40960),
    # Qwen/Qwen3-32B config.json; 32.8 B parameters (model card)
    "qwen3-32b": ModelSpec("qwen3-32b", 5120, 25600, 64, 64, 8, 128, 151936, qk_norm=True,
                           rope_theta=1_000_000.0, rms_norm_eps=1e-6, max_position_embeddings=40960),
    # meta-llama/Llama-3.3-70B-Instruct config.json; 70.6 B parameters (model card)
    "llama-3.3-70b": ModelSpec("llama-3.3-70b", 8192, 28672, 80, 64, 8, 128, 128256,
                               rope_theta=500_000.0, rms_norm_eps=1e-5),
    # Tiny models for CPU runs and tests (not published models).
    # No context window: planning tests price them at the big models' lengths.
    "tiny-llama": ModelSpec("tiny-llama", 64, 160, 4, 4, 2, 16, 256, rope_theta=10_000.0,
                            max_position_embeddings=None),
    "tiny-qwen3": ModelSpec("tiny-qwen3", 64, 128, 4, 8, 4, 8, 250, tie_embeddings=True,
                            qk_norm=True, rope_theta=10_000.0, rms_norm_eps=1e-6,
                            max_position_embeddings=None),
    "small-llama": ModelSpec("small-llama", 256, 688, 8, 8, 4, 32, 2048, rope_theta=10_000.0,
                             max_position_embeddings=None),
}


def get_model(name_or_path: str) -> ModelSpec:
    """A preset by name, or a model read from a ``config.json`` path."""
    key = name_or_path.lower()
    if key in MODEL_PRESETS:
        return MODEL_PRESETS[key]
    if Path(name_or_path).exists():
        return ModelSpec.from_hf_config(name_or_path)
    raise InputError("model", f"unknown model {name_or_path!r}",
                     [*MODEL_PRESETS, "a path to a Hugging Face config.json"])


# keys of a mixture-of-experts config (Qwen-MoE, Mixtral, DeepSeek): priced as dense, such a
# model would look like a small dense one
MOE_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")

_Finite = Annotated[float, Field(gt=0, allow_inf_nan=False)]


class _RopeScaling(BaseModel):
    """``rope_scaling``: how far a scaled RoPE stretches the window (other keys ignored)."""

    model_config = ConfigDict(extra="ignore", strict=True)

    factor: _Finite | None = None
    original_max_position_embeddings: StrictInt | None = Field(None, ge=1)


class _HfConfig(BaseModel):
    """The fields of a Hugging Face ``config.json`` that Nereus reads (others are ignored)."""

    model_config = ConfigDict(extra="ignore", strict=True)

    model_type: str | None = None
    hidden_size: StrictInt = Field(ge=1)
    intermediate_size: StrictInt = Field(ge=1)
    num_hidden_layers: StrictInt = Field(ge=1)
    num_attention_heads: StrictInt = Field(ge=1)
    num_key_value_heads: StrictInt | None = Field(None, ge=1)
    head_dim: StrictInt | None = Field(None, ge=1)
    vocab_size: StrictInt = Field(ge=1)
    tie_word_embeddings: bool = False
    rope_theta: _Finite = 10_000.0
    rms_norm_eps: _Finite = 1e-6
    max_position_embeddings: StrictInt | None = Field(None, ge=1)
    rope_scaling: _RopeScaling | None = None

    def context_window(self) -> int | None:
        """Tokens a sequence may hold: ``max_position_embeddings``, or the longer window a
        ``rope_scaling`` factor stretches it to (YaRN on Qwen3: 32,768 x 4); None if unknown."""
        n = self.max_position_embeddings
        r = self.rope_scaling
        if r is None or r.factor is None:
            return n
        base = r.original_max_position_embeddings or n
        if base is None:
            return n
        return max(n or 0, int(base * r.factor))
