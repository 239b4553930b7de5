"""Architectures: what a model family computes, as data (its template, templates/<arch>.json).

An architecture says which block stages run in which order and how each is parameterised
(norm, rope layout, activation, ...). Hyperparameters come from the GGUF and dtypes from
the weights, never from here. The loader rejects unknown or missing fields by name.

("Template" alone means this file; chat templates (text/chat.py) and the C templates of the
code generator (codegen/c_templates) are always named so.)
"""
from __future__ import annotations

import json
from dataclasses import dataclass, fields
from enum import Enum
from functools import lru_cache
from pathlib import Path

from ..core.errors import ArchitectureError
from ..core.paths import ARCH_DIR, CHAT_TEMPLATE_DIR



class Stage(Enum):
    """A step of a transformer block; the builder expands each into IR nodes."""

    ATTN_NORM = "attn_norm"
    QKV = "qkv"
    QK_NORM = "qk_norm"
    ROPE = "rope"
    ATTENTION = "attention"
    ATTN_OUTPUT = "attn_output"
    ATTN_POST_NORM = "attn_post_norm"
    ATTN_RESIDUAL = "attn_residual"
    FFN_NORM = "ffn_norm"
    FFN_GLU = "ffn_glu"
    FFN_DOWN = "ffn_down"
    FFN_POST_NORM = "ffn_post_norm"
    FFN_RESIDUAL = "ffn_residual"


class RopeLayout(Enum):
    PAIRWISE = "pairwise"  # rotate (x[2i], x[2i+1]): GGUF llama (the converter permutes Q/K for it)
    NEOX = "neox"  # rotate (x[i], x[i + d/2]): qwen2, qwen3, gemma3


class Activation(Enum):
    SWIGLU = "swiglu"  # silu(gate) * up
    GEGLU = "geglu"  # gelu_tanh(gate) * up


class EmbeddingScale(Enum):
    NONE = "none"
    SQRT_N_EMBD = "sqrt_n_embd"  # gemma: embeddings are multiplied by sqrt(n_embd)
    METADATA = "metadata"  # granite: by the GGUF's {arch}.embedding_scale (absent or 0: not scaled)


class Scalar(Enum):
    """A number the architecture applies that only the GGUF knows, or none."""
    NONE = "none"
    METADATA = "metadata"  # the GGUF's key for it (METADATA_KEYS)


class RopeFactors(Enum):
    """Per-dimension rope frequency factors, theta_i / factor_i, from a tensor of head_dim / 2."""
    NONE = "none"
    FREQS = "freqs"  # rope_freqs.weight where the file has it (Llama 3's, which its converter computes)
    LONG_SHORT = "long_short"  # Phi-3's LongRoPE: rope_factors_long.weight when the context exceeds the
    # original one (rope.scaling.original_context_length), else rope_factors_short.weight


# The tensors each kind of factors comes in (no `blk.N.` prefix: llama.cpp reads one for every layer)
ROPE_FACTOR_TENSORS: dict[RopeFactors, tuple[str, ...]] = {
    RopeFactors.NONE: (),
    RopeFactors.FREQS: ("rope_freqs.weight",),
    RopeFactors.LONG_SHORT: ("rope_factors_long.weight", "rope_factors_short.weight"),
}


class RopeScaling(Enum):
    LINEAR = "linear"  # positions divided by rope.scaling.factor
    YARN = "yarn"  # YaRN: interpolate the slow dimensions, keep the fast ones, scale the attention
    LONGROPE = "longrope"  # the rope_factors_* tensors and rope.scaling.attn_factor


@dataclass(frozen=True)
class AttentionScale:
    """The scale of q . k: 1/sqrt(head_dim); or the GGUF's {arch}.attention.scale (granite; absent or
    0: 1/sqrt(head_dim)); or Gemma's 1/sqrt(query_pre_attn_scalar), which the GGUF does not carry:
    n_embd / n_head for the model with `n_embd_per_head_at_layers` layers (the 27B), head_dim for
    the others, as llama.cpp tells them apart."""
    rule: str  # "inv_sqrt_head_dim" | "metadata" | "n_embd_per_head_at_layers"
    layers: int | None = None


class LMHead(Enum):
    TIED = "tied"  # logits use token_embd.weight
    OUTPUT_OR_TIED = "output_or_tied"  # output.weight when the file has it, else tied


class AttnVariant(Enum):
    DENSE = "dense"  # every layer attends to the whole context
    HYBRID_SLIDING = "hybrid_sliding"  # layer_pattern mixes sliding-window and global layers


class LayerKind(Enum):
    GLOBAL = "global"
    LOCAL = "local"  # sliding window


class KVLayout(Enum):
    LAYER_KV_HEAD_POS = "layer_kv_head_pos"  # [layer][K|V][kv_head][position][head_dim]


@dataclass(frozen=True)
class Architecture:
    arch: str
    description: str
    block: tuple[Stage, ...]
    norm: str
    norm_weight_offset: float
    rope_layout: RopeLayout
    rope_base_local: float | None  # sliding-window layers' rope base; None: the file's, as global layers
    qkv_bias: bool
    activation: Activation
    embedding_scale: EmbeddingScale
    lm_head: LMHead
    kv_layout: KVLayout
    attn_variant: AttnVariant
    layer_pattern: tuple[LayerKind, ...] | None
    chat_template: str | None  # templates/chat/<name>.jinja: the chat format when the GGUF carries none
    fused_qkv: bool  # one attn_qkv tensor holds Q's rows, then K's, then V's (Phi-3)
    fused_ffn_up: bool  # ffn_up holds the gate's rows, then up's, and there is no ffn_gate (Phi-3)
    rope_scaling: tuple[RopeScaling, ...]  # the rope.scaling.type values it implements, with their keys
    rope_factors: RopeFactors
    attention_scale: AttentionScale
    residual_scale: Scalar  # each residual branch times it before it is added (granite)
    logit_scale: Scalar  # logits divided by it (granite; the key is then required, as llama.cpp requires it)
    attn_softcap: float | None  # scores -> c tanh(s / c), c from the GGUF or this default; None: no cap
    final_softcap: float | None  # the same on the logits
    requires: tuple[tuple[str, tuple], ...]  # metadata a file may carry only with these values

    def metadata_keys(self) -> frozenset[str]:
        """The keys under '{arch}.' this architecture reads: any other that changes the math is refused."""
        reads = {"embedding_scale": self.embedding_scale is EmbeddingScale.METADATA,
                 "attention_scale": self.attention_scale.rule == "metadata",
                 "residual_scale": self.residual_scale is Scalar.METADATA,
                 "logit_scale": self.logit_scale is Scalar.METADATA,
                 "attn_softcap": self.attn_softcap is not None,
                 "final_softcap": self.final_softcap is not None}
        keys = {METADATA_KEYS[field] for field, read in reads.items() if read}
        if self.rope_scaling:
            keys |= {"rope.scaling.type", "rope.scaling.factor", "rope.scale_linear", "rope.scaling.attn_factor"}
        if RopeScaling.YARN in self.rope_scaling:
            keys |= {"rope.scaling.yarn_beta_fast", "rope.scaling.yarn_beta_slow"}
        return frozenset(keys)

    @property
    def qk_norm(self) -> bool:
        return Stage.QK_NORM in self.block

    @property
    def post_norms(self) -> bool:
        return Stage.ATTN_POST_NORM in self.block

    def softcap_value(self, field: str, value: float | None) -> float:
        """A soft-cap's c: the file's value, else the template's default (0: no cap)."""
        return value if value else (getattr(self, field) or 0.0)

    def layer_kind(self, il: int) -> LayerKind:
        if self.layer_pattern is None:
            return LayerKind.GLOBAL
        return self.layer_pattern[il % len(self.layer_pattern)]


# The GGUF key (under '{arch}.') of each number a template can take from the file.
METADATA_KEYS = {
    "embedding_scale": "embedding_scale",
    "attention_scale": "attention.scale",
    "residual_scale": "residual_scale",
    "logit_scale": "logit_scale",
    "attn_softcap": "attn_logit_softcapping",
    "final_softcap": "final_logit_softcapping",
}


# How each JSON field is parsed; a field not listed here is unknown.
_PARSERS = {
    "arch": str,
    "description": str,
    "block": lambda v: tuple(Stage(s) for s in v),
    "norm": lambda v: _one_of(v, ("rms",)),
    "norm_weight_offset": float,
    "rope_layout": RopeLayout,
    "rope_base_local": lambda v: None if v is None else float(v),
    "qkv_bias": lambda v: _boolean(v),
    "activation": Activation,
    "embedding_scale": EmbeddingScale,
    "lm_head": LMHead,
    "kv_layout": KVLayout,
    "attn_variant": AttnVariant,
    "layer_pattern": lambda v: None if v is None else tuple(LayerKind(k) for k in v),
    "chat_template": lambda v: None if v is None else _chat_template_name(v),
    "fused_qkv": lambda v: _boolean(v),
    "fused_ffn_up": lambda v: _boolean(v),
    "rope_scaling": lambda v: tuple(RopeScaling(t) for t in _list(v)),
    "rope_factors": RopeFactors,
    "attention_scale": lambda v: _attention_scale(v),
    "residual_scale": Scalar,
    "logit_scale": Scalar,
    "attn_softcap": lambda v: _softcap(v),
    "final_softcap": lambda v: _softcap(v),
    "requires": lambda v: _requires(v),
}
assert set(_PARSERS) == {f.name for f in fields(Architecture)}

_REQUIRED_ORDER = (Stage.ATTN_NORM, Stage.QKV, Stage.ROPE, Stage.ATTENTION, Stage.ATTN_OUTPUT,
                   Stage.ATTN_RESIDUAL, Stage.FFN_NORM, Stage.FFN_GLU, Stage.FFN_DOWN, Stage.FFN_RESIDUAL)


def _one_of(v, allowed):
    if v not in allowed:
        raise ValueError(f"{v!r} is not one of {allowed}")
    return v


def _chat_template_name(v):
    if not isinstance(v, str) or not (CHAT_TEMPLATE_DIR / f"{v}.jinja").is_file():
        known = sorted(q.stem for q in CHAT_TEMPLATE_DIR.glob("*.jinja"))
        raise ValueError(f"{v!r} names no file in {CHAT_TEMPLATE_DIR} (known: {', '.join(known)})")
    return v


def _list(v):
    if not isinstance(v, list):
        raise ValueError(f"{v!r} is not a list")
    return v


def _attention_scale(v) -> AttentionScale:
    if v in ("inv_sqrt_head_dim", "metadata"):
        return AttentionScale(v)
    if isinstance(v, dict) and set(v) == {"n_embd_per_head_at_layers"} and isinstance(v["n_embd_per_head_at_layers"], int):
        return AttentionScale("n_embd_per_head_at_layers", v["n_embd_per_head_at_layers"])
    raise ValueError(f"{v!r} is not 'inv_sqrt_head_dim', 'metadata' or {{\"n_embd_per_head_at_layers\": N}}")


def _softcap(v) -> float | None:
    """null: no cap; {"metadata_default": c}: the GGUF's key, or c where it has none."""
    if v is None:
        return None
    if isinstance(v, dict) and set(v) == {"metadata_default"} and isinstance(v["metadata_default"], (int, float)):
        return float(v["metadata_default"])
    raise ValueError(f"{v!r} is not null or {{\"metadata_default\": c}}")


def _requires(v) -> tuple[tuple[str, tuple], ...]:
    if not isinstance(v, dict) or not all(isinstance(a, list) for a in v.values()):
        raise ValueError(f"{v!r} is not an object of key: [allowed values]")
    return tuple(sorted((k, tuple(a)) for k, a in v.items()))


def _boolean(v):
    if not isinstance(v, bool):
        raise ValueError(f"{v!r} is not true or false")
    return v


def available_archs() -> tuple[str, ...]:
    return tuple(sorted(p.stem for p in ARCH_DIR.glob("*.json")))


def load_architecture(name: str) -> Architecture:
    path = ARCH_DIR / f"{name}.json"
    if not path.is_file():
        raise ArchitectureError(
            f"no template for architecture '{name}' ({path} does not exist); "
            f"supported: {', '.join(available_archs())}"
        )
    return parse_architecture_file(path)


@lru_cache(maxsize=None)
def parse_architecture_file(path: Path) -> Architecture:
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ArchitectureError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(raw, dict):
        raise ArchitectureError(f"{path}: a template is a JSON object")
    unknown = sorted(set(raw) - set(_PARSERS))
    if unknown:
        raise ArchitectureError(f"{path}: unknown field '{unknown[0]}' (known fields: {', '.join(_PARSERS)})")
    missing = [k for k in _PARSERS if k not in raw]
    if missing:
        raise ArchitectureError(f"{path}: missing field '{missing[0]}'")
    values = {}
    for key, parse in _PARSERS.items():
        try:
            values[key] = parse(raw[key])
        except (ValueError, TypeError) as e:
            raise ArchitectureError(f"{path}: field '{key}': {e}") from None
    t = Architecture(**values)
    _check_consistency(path, t)
    return t


def _check_consistency(path: Path, t: Architecture) -> None:
    if t.arch != path.stem:
        raise ArchitectureError(f"{path}: field 'arch' is '{t.arch}' but the file is named for '{path.stem}'")
    present = [s for s in t.block if s in _REQUIRED_ORDER]
    if tuple(present) != _REQUIRED_ORDER:
        raise ArchitectureError(
            f"{path}: field 'block' must contain, in this order, {[s.value for s in _REQUIRED_ORDER]}"
        )
    if len(set(t.block)) != len(t.block):
        raise ArchitectureError(f"{path}: field 'block' lists a stage twice")
    hybrid = t.attn_variant is AttnVariant.HYBRID_SLIDING
    if hybrid != (t.layer_pattern is not None):
        raise ArchitectureError(f"{path}: field 'layer_pattern' is required by, and only allowed with, attn_variant 'hybrid_sliding'")
    if hybrid and LayerKind.LOCAL not in t.layer_pattern:
        raise ArchitectureError(f"{path}: a hybrid_sliding template needs local layers in 'layer_pattern'")
    if t.fused_qkv and t.qkv_bias:
        raise ArchitectureError(f"{path}: 'fused_qkv' with 'qkv_bias' is not implemented")
    if (t.rope_factors is RopeFactors.LONG_SHORT) != (RopeScaling.LONGROPE in t.rope_scaling):
        raise ArchitectureError(f"{path}: 'rope_factors' long_short goes with 'rope_scaling' longrope, and only with it")
