"""Reading an architecture's template (templates/<arch>.json) into an Architecture: every field
parsed by its own rule, unknown and missing ones refused by name, the whole checked for sense."""
from __future__ import annotations

import json
from dataclasses import fields
from functools import lru_cache
from pathlib import Path

from ..core.errors import ArchitectureError
from ..core.paths import ARCH_DIR, CHAT_TEMPLATE_DIR
from .architecture import (FROM_FILE, MOE_FFN_LENGTH_KEYS, Activation, Architecture, AttentionScale, AttnVariant, EmbeddingScale,
                           KVLayout, LayerKind, LMHead, MoE, QKNormSpan, RopeFactors, RopeLayout, RopeScaling, Scalar,
                           Stage)

# How each JSON field is parsed; a field not listed here is unknown.
_PARSERS = {
    "arch": str,
    "description": str,
    "block": lambda v: tuple(Stage(s) for s in v),
    "norm": lambda v: _one_of(v, ("rms", "layer")),
    "norm_weight_offset": float,
    "rope_layout": RopeLayout,
    "rope_base_local": lambda v: None if v is None else float(v),
    "qkv_bias": lambda v: _boolean(v),
    "activation": Activation,
    "embedding_scale": EmbeddingScale,
    "lm_head": LMHead,
    "kv_layout": KVLayout,
    "attn_variant": AttnVariant,
    "layer_pattern": lambda v: None if v is None else FROM_FILE if v == "metadata" else tuple(LayerKind(k) for k in v),
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
    "moe": lambda v: _moe(v),
    "qk_norm_span": QKNormSpan,
    "recurrent_block": lambda v: None if v is None else tuple(Stage(s) for s in _list(v)),
    "attn_output_gate": lambda v: _boolean(v),
    "ffn_norm_weight": lambda v: _one_of(v, ("ffn_norm", "post_attention_norm")),
    "head_pairing": lambda v: _one_of(v, ("modulo", "interleaved")),
    "nope_layer_step": lambda v: None if v is None else _positive(v),
    "attn_sinks": lambda v: _boolean(v),
    "attn_output_bias": lambda v: _boolean(v),
    "kind_bodies": lambda v: _boolean(v),
    "shared_kv": lambda v: _boolean(v),
    "k_as_v": lambda v: _boolean(v),
    "v_norm": lambda v: _boolean(v),
    "position_embedding": lambda v: _one_of(v, ("none", "absolute")),
    "causal": lambda v: _one_of(v, ("always", "metadata", "never")),
    "alibi_max_bias": lambda v: None if v is None else float(v),
    "ffn_bias": lambda v: _boolean(v),
    "moe_block": lambda v: None if v is None else tuple(Stage(s) for s in _list(v)),
}
assert set(_PARSERS) == {f.name for f in fields(Architecture)}
# Fields a template may leave out, and what it then says: a dense FFN, per-head q/k norms
_OPTIONAL = {"moe": None, "qk_norm_span": "head", "recurrent_block": None, "attn_output_gate": False,
             "ffn_norm_weight": "ffn_norm", "head_pairing": "modulo",
             "nope_layer_step": None, "attn_sinks": False, "attn_output_bias": False,
             "kind_bodies": False, "shared_kv": False, "k_as_v": False, "v_norm": False,
             "position_embedding": "none", "causal": "always", "ffn_bias": False, "moe_block": None,
             "alibi_max_bias": None}

_REQUIRED_ORDER = (Stage.ATTN_NORM, Stage.QKV, Stage.ROPE, Stage.ATTENTION, Stage.ATTN_OUTPUT,
                   Stage.ATTN_RESIDUAL, Stage.FFN_NORM, Stage.FFN_GLU, Stage.FFN_DOWN, Stage.FFN_RESIDUAL)
# ... where a mixture of experts takes the FFN's place
_REQUIRED_ORDER_MOE = (*_REQUIRED_ORDER[:7], Stage.FFN_MOE, _REQUIRED_ORDER[-1])
# a recurrent block: the DeltaNet in place of attention's stages
_RECURRENT_ORDER = (Stage.ATTN_NORM, Stage.DELTA_NET, *_REQUIRED_ORDER[5:])
_RECURRENT_ORDER_MOE = (Stage.ATTN_NORM, Stage.DELTA_NET, *_REQUIRED_ORDER_MOE[5:])
# a post-norm encoder (norm "layer", BERT): no pre-norms; the residual stream is normed after each
# residual add; a plain FFN (ffn_up's projection and activation) or a GLU one (nomic-bert's); rope
# (nomic-bert's) or not
_ENCODER_ORDER = (Stage.QKV, Stage.ATTENTION, Stage.ATTN_OUTPUT, Stage.ATTN_RESIDUAL, Stage.ATTN_OUT_NORM,
                  Stage.FFN_UP, Stage.FFN_DOWN, Stage.FFN_RESIDUAL, Stage.LAYER_OUT_NORM)
_ENCODER_CHOICES = {Stage.FFN_GLU: Stage.FFN_UP, Stage.ROPE: None}  # a stage, and the one it stands for
_ATTENTION_ONLY = {Stage.QKV, Stage.QK_NORM, Stage.ROPE, Stage.ATTENTION, Stage.ATTN_OUTPUT}


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
    if v in ("inv_sqrt_head_dim", "metadata", "unit"):
        return AttentionScale(v)
    if isinstance(v, dict) and set(v) == {"n_embd_per_head_at_layers"} and isinstance(v["n_embd_per_head_at_layers"], int):
        return AttentionScale("n_embd_per_head_at_layers", v["n_embd_per_head_at_layers"])
    raise ValueError(f"{v!r} is not 'inv_sqrt_head_dim', 'metadata', 'unit' or {{\"n_embd_per_head_at_layers\": N}}")


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


def _moe(v) -> MoE | None:
    """null: a dense FFN; {"gating": "softmax" | "softmax_weight", "normalize_top_k": bool,
    "expert_ffn_length": key}, and optionally "router_bias" and "expert_biases" (bool)."""
    if v is None:
        return None
    keys, optional = {"gating", "normalize_top_k", "expert_ffn_length"}, {"router_bias", "expert_biases"}
    if not isinstance(v, dict) or not keys <= set(v) <= keys | optional:
        raise ValueError(f"{v!r} is not null or an object of {sorted(keys)} (and optionally {sorted(optional)})")
    return MoE(_boolean(v["normalize_top_k"]), _one_of(v["expert_ffn_length"], MOE_FFN_LENGTH_KEYS),
               _one_of(v["gating"], ("softmax", "softmax_weight")), _boolean(v.get("router_bias", False)),
               _boolean(v.get("expert_biases", False)))


def _positive(v):
    if not isinstance(v, int) or isinstance(v, bool) or v < 2:
        raise ValueError(f"{v!r} is not null or an integer of at least 2")
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
    missing = [k for k in _PARSERS if k not in raw and k not in _OPTIONAL]
    if missing:
        raise ArchitectureError(f"{path}: missing field '{missing[0]}'")
    values = {}
    for key, parse in _PARSERS.items():
        try:
            values[key] = parse(raw.get(key, _OPTIONAL.get(key)))
        except (ValueError, TypeError) as e:
            raise ArchitectureError(f"{path}: field '{key}': {e}") from None
    t = Architecture(**values)
    _check_consistency(path, t)
    return t


def _check_consistency(path: Path, t: Architecture) -> None:
    if t.arch != path.stem:
        raise ArchitectureError(f"{path}: field 'arch' is '{t.arch}' but the file is named for '{path.stem}'")
    dense = t.moe is None or t.moe_block is not None  # `block` has no experts (moe_block's layers do)
    required = _ENCODER_ORDER if t.norm == "layer" else _REQUIRED_ORDER if dense else _REQUIRED_ORDER_MOE
    present = [s for s in t.block if s in (*_REQUIRED_ORDER, *_ENCODER_ORDER, Stage.FFN_MOE)]
    if t.norm == "layer":
        present = [_ENCODER_CHOICES.get(s, s) for s in present if _ENCODER_CHOICES.get(s, s) is not None]
        if Stage.ROPE in t.block and t.block[t.block.index(Stage.ROPE) - 1] is not Stage.QKV:
            raise ArchitectureError(f"{path}: an encoder's 'rope' must follow 'qkv' directly")
    if tuple(present) != required:
        raise ArchitectureError(f"{path}: field 'block' must contain, in this order, {[s.value for s in required]}"
                                + (" (a template with 'moe' has ffn_moe in place of ffn_glu and ffn_down)"
                                   if t.moe is not None or Stage.FFN_MOE in t.block else ""))
    if len(set(t.block)) != len(t.block):
        raise ArchitectureError(f"{path}: field 'block' lists a stage twice")
    for block in (t.block, t.recurrent_block or ()):
        if Stage.FFN_SHARED_EXPERT in block and block[block.index(Stage.FFN_SHARED_EXPERT) - 1] is not Stage.FFN_MOE:
            raise ArchitectureError(f"{path}: 'ffn_shared_expert' must follow 'ffn_moe' directly")
    if t.moe_block is not None:
        _check_moe_block(path, t)
    if Stage.DELTA_NET in t.block:
        raise ArchitectureError(f"{path}: field 'block' lists delta_net, which belongs in 'recurrent_block'")
    if t.recurrent_block is not None:
        order = _RECURRENT_ORDER if t.moe is None else _RECURRENT_ORDER_MOE
        present = [s for s in t.recurrent_block if s in (*order, Stage.FFN_GLU, Stage.FFN_DOWN, Stage.FFN_MOE)]
        if tuple(present) != order or _ATTENTION_ONLY & set(t.recurrent_block):
            raise ArchitectureError(f"{path}: field 'recurrent_block' must contain, in this order, "
                                    f"{[s.value for s in order]}, and no attention stage")
    hybrid = t.attn_variant is AttnVariant.HYBRID_SLIDING
    if hybrid != (t.layer_pattern is not None):
        raise ArchitectureError(f"{path}: field 'layer_pattern' is required by, and only allowed with, attn_variant 'hybrid_sliding'")
    if hybrid and t.layer_pattern != FROM_FILE and LayerKind.LOCAL not in t.layer_pattern:
        raise ArchitectureError(f"{path}: a hybrid_sliding template needs local layers in 'layer_pattern'")
    if (t.rope_factors is RopeFactors.LONG_SHORT) != (RopeScaling.LONGROPE in t.rope_scaling):
        raise ArchitectureError(f"{path}: 'rope_factors' long_short goes with 'rope_scaling' longrope, and only with it")


def _check_moe_block(path: Path, t: Architecture) -> None:
    """moe_block is block with ffn_moe in place of the dense FFN's stages, in a template with `moe`
    whose layers are of no other kind."""
    if t.moe is None:
        raise ArchitectureError(f"{path}: field 'moe_block' needs 'moe' (its experts)")
    if t.recurrent_block is not None or t.layer_pattern is not None or t.kind_bodies:
        raise ArchitectureError(f"{path}: 'moe_block' with other kinds of layer (recurrent_block, layer_pattern, "
                                "kind_bodies) is not implemented")
    ffn = (Stage.FFN_UP, Stage.FFN_GLU, Stage.FFN_DOWN)
    at = next(i for i, s in enumerate(t.block) if s in ffn)
    want = (*t.block[:at], Stage.FFN_MOE, *(s for s in t.block[at:] if s not in ffn))
    if t.moe_block != want:
        raise ArchitectureError(f"{path}: field 'moe_block' must be 'block' with ffn_moe in place of its FFN's "
                                f"stages: {[s.value for s in want]}")
