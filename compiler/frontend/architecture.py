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
    rope_base_local: float | None
    qkv_bias: bool
    activation: Activation
    embedding_scale: EmbeddingScale
    lm_head: LMHead
    kv_layout: KVLayout
    attn_variant: AttnVariant
    layer_pattern: tuple[LayerKind, ...] | None
    chat_template: str | None  # templates/chat/<name>.jinja: the chat format when the GGUF carries none

    @property
    def qk_norm(self) -> bool:
        return Stage.QK_NORM in self.block

    @property
    def post_norms(self) -> bool:
        return Stage.ATTN_POST_NORM in self.block

    def layer_kind(self, il: int) -> LayerKind:
        if self.layer_pattern is None:
            return LayerKind.GLOBAL
        return self.layer_pattern[il % len(self.layer_pattern)]


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
    if hybrid and (LayerKind.LOCAL not in t.layer_pattern or t.rope_base_local is None):
        raise ArchitectureError(f"{path}: a hybrid_sliding template needs local layers in 'layer_pattern' and 'rope_base_local'")
