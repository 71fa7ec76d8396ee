"""Model architectures from Hugging-Face-style ``config.json`` files, and what follows from them.

Shipped configs live in ``analyzer/models/`` (architecture fields of the public configs, see the
README there). A user's model is loaded from the path of its ``config.json``. Nothing is fetched.

Parameter counting (all weights, biases and norms ignored — they are < 0.1 % of any model here):
  1. Embeddings ``vocab × hidden``, plus the same again for the LM head unless tied.
  2. GQA attention per layer: ``hidden × (heads + 2·kv_heads) × head_dim + heads × head_dim × hidden``.
  3. MLA attention per layer (DeepSeek): q down/up projections (or a plain q projection),
     ``hidden × (kv_lora + rope)`` down, ``kv_lora × heads × (nope + v)`` up, ``heads × v × hidden`` out.
  4. Gated MLP (SwiGLU): ``3 × hidden × intermediate`` per dense layer or per expert.
  5. MoE layer: routed experts + shared experts + router ``hidden × experts``; a token activates
     ``top_k`` routed experts and all shared ones.
Llama-3.1-70B comes out at 70.55 B (REFERENCE §5).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MODELS_DIR = Path(__file__).resolve().parent / "models"


class ModelConfigError(ValueError):
    """A config.json that cannot be used; the message names the file and the field."""


@dataclass(frozen=True)
class ModelConfig:
    """The architecture fields IOE needs, normalized across model families."""

    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied_embeddings: bool = False
    experts: int = 0  # routed experts per MoE layer (0 = dense model)
    top_k: int = 0
    moe_intermediate: int = 0
    shared_experts: int = 0
    dense_layers: int = 0  # leading layers with a dense MLP in an MoE model
    kv_lora_rank: int = 0  # > 0 means MLA (latent KV cache)
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0
    q_lora_rank: int = 0
    sliding_window: int = 0
    sliding_layers: int = 0  # layers whose KV is capped at sliding_window tokens

    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def moe_layers(self) -> int:
        return self.layers - self.dense_layers if self.is_moe else 0

    def attention_params(self) -> int:
        """Weights of one attention block (notes 2-3)."""
        h = self.hidden
        if not self.is_mla:
            return h * (self.heads + 2 * self.kv_heads) * self.head_dim + self.heads * self.head_dim * h
        qk = self.qk_nope_head_dim + self.qk_rope_head_dim
        if self.q_lora_rank:
            q = h * self.q_lora_rank + self.q_lora_rank * self.heads * qk
        else:
            q = h * self.heads * qk
        kv = h * (self.kv_lora_rank + self.qk_rope_head_dim)
        kv += self.kv_lora_rank * self.heads * (self.qk_nope_head_dim + self.v_head_dim)
        return q + kv + self.heads * self.v_head_dim * h

    def expert_params(self) -> int:
        """Weights of one routed expert (note 4)."""
        return 3 * self.hidden * self.moe_intermediate

    def mlp_params(self, *, active: bool) -> int:
        """All MLP weights over all layers; ``active`` counts only what one token touches (note 5)."""
        dense = 3 * self.hidden * self.intermediate
        if not self.is_moe:
            return self.layers * dense
        routed = self.top_k if active else self.experts
        per_moe = (routed + self.shared_experts) * self.expert_params() + self.hidden * self.experts
        return self.dense_layers * dense + self.moe_layers * per_moe

    def embedding_params(self) -> int:
        return self.vocab * self.hidden * (1 if self.tied_embeddings else 2)

    def params(self) -> int:
        """Total parameters (notes 1-5)."""
        return self.embedding_params() + self.layers * self.attention_params() + self.mlp_params(active=False)

    def active_params(self) -> int:
        """Parameters one token's forward pass multiplies through (excluding the input embedding)."""
        lm_head = self.vocab * self.hidden
        return lm_head + self.layers * self.attention_params() + self.mlp_params(active=True)

    def kv_elems_per_token_layer(self) -> int:
        """KV-cache elements one token stores in one layer: ``2·kv_heads·head_dim`` (GQA) or
        ``kv_lora_rank + qk_rope_head_dim`` (MLA latent, shared by all heads)."""
        if self.is_mla:
            return self.kv_lora_rank + self.qk_rope_head_dim
        return 2 * self.kv_heads * self.head_dim


def _get(cfg: dict[str, Any], where: str, *names: str, default: Any = None) -> Any:
    for n in names:
        if cfg.get(n) is not None:
            return cfg[n]
    if default is not None:
        return default
    raise ModelConfigError(f"{where}: missing field {' / '.join(repr(n) for n in names)}")


def _int(cfg: dict[str, Any], where: str, *names: str, default: int | None = None) -> int:
    value = _get(cfg, where, *names, default=default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ModelConfigError(f"{where}: field {names[0]!r} must be a non-negative integer (got {value!r})")
    return value


def _moe_fields(cfg: dict[str, Any], where: str) -> dict[str, int]:
    experts = _int(cfg, where, "num_experts", "num_local_experts", "n_routed_experts", default=0)
    if not experts:
        return {}
    return {
        "experts": experts,
        "top_k": _int(cfg, where, "num_experts_per_tok"),
        "moe_intermediate": _int(cfg, where, "moe_intermediate_size", "intermediate_size"),
        "shared_experts": _int(cfg, where, "n_shared_experts", default=0),
        "dense_layers": _int(cfg, where, "first_k_dense_replace", default=0),
    }


def _mla_fields(cfg: dict[str, Any], where: str) -> dict[str, int]:
    if not cfg.get("kv_lora_rank"):
        return {}
    names = ("kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")
    out = {n: _int(cfg, where, n) for n in names}
    out["q_lora_rank"] = _int(cfg, where, "q_lora_rank", default=0)
    return out


def _sliding_fields(cfg: dict[str, Any], where: str) -> dict[str, int]:
    window = cfg.get("sliding_window")
    kinds = cfg.get("layer_types") or []
    n_sliding = sum(1 for k in kinds if k == "sliding_attention")
    if not window or not n_sliding:
        return {}
    return {"sliding_window": _int(cfg, where, "sliding_window"), "sliding_layers": n_sliding}


def from_dict(cfg: dict[str, Any], name: str, where: str = "") -> ModelConfig:
    """A :class:`ModelConfig` from a parsed config.json (``where`` names it in errors)."""
    where = where or name
    hidden = _int(cfg, where, "hidden_size")
    heads = _int(cfg, where, "num_attention_heads")
    return ModelConfig(
        name=name,
        hidden=hidden,
        layers=_int(cfg, where, "num_hidden_layers"),
        heads=heads,
        kv_heads=_int(cfg, where, "num_key_value_heads", default=heads),
        head_dim=_int(cfg, where, "head_dim", default=hidden // max(heads, 1)),
        intermediate=_int(cfg, where, "intermediate_size"),
        vocab=_int(cfg, where, "vocab_size"),
        tied_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        **_moe_fields(cfg, where),
        **_mla_fields(cfg, where),
        **_sliding_fields(cfg, where),
    )


def load_path(path: Path) -> ModelConfig:
    """Load a user's config.json; errors name the file."""
    try:
        cfg = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelConfigError(f"{path}: cannot read config.json ({exc})") from exc
    if not isinstance(cfg, dict):
        raise ModelConfigError(f"{path}: config.json must be a JSON object")
    return from_dict(cfg, path.parent.name if path.name == "config.json" else path.stem, str(path))


def shipped() -> list[str]:
    """Names of the shipped model configs."""
    return sorted(p.stem for p in MODELS_DIR.glob("*.json"))


_SUFFIXES = re.compile(r"(-(instruct|chat|base|hf|fp8|fp4|nvfp4|mxfp4|awq|gptq|bf16|fp16|v\d+\.\d+))+$")


def canonical_name(name: str) -> str:
    """``"meta-llama/Llama-3.1-8B-Instruct"`` → ``"llama-3.1-8b"``; ``"Llama-3-70B"`` → ``"llama-3.1-70b"``.

    1. Drop the organisation prefix and lower-case. 2. Drop serving suffixes (-Instruct, -FP8, -NVFP4, -v0.1).
    3. Llama 3, 3.1 and 3.3 of one size share an architecture: map them to the 3.1 config.
    """
    base = name.strip().split("/")[-1].lower().replace("_", "-")
    base = _SUFFIXES.sub("", base)
    return re.sub(r"^(meta-)?llama-?3(\.\d)?-(\d+b)$", r"llama-3.1-\3", base)


def load(name_or_path: str) -> ModelConfig:
    """A shipped model by (flexible) name, or a user's config.json by path."""
    path = Path(name_or_path)
    if name_or_path.endswith(".json") or path.is_dir():
        return load_path(path / "config.json" if path.is_dir() else path)
    key = canonical_name(name_or_path)
    file = MODELS_DIR / f"{key}.json"
    if not file.exists():
        raise ModelConfigError(f"unknown model {name_or_path!r}; shipped: {', '.join(shipped())}")
    return from_dict(json.loads(file.read_text()), key, str(file))
