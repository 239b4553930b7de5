"""The metadata keys under '{arch}.' and what kiln does with each: reads it, accepts it at a value
that changes nothing, takes it as information, or refuses it by name. A template adds the keys of
what it implements (architecture.metadata_keys: granite's scalars, Gemma 2's soft-caps, RoPE
scaling), so a key is accepted only for the architectures that implement it.

`meta` is gguf_reader's typed view of a file's key/values (get, keys, number, integer, text).
"""
from __future__ import annotations

from ..core.cconst import MAX_CONV_TAPS, MAX_HEAD_DIM, MAX_STATE_DIM, MOE_MAX_EXPERTS
from ..core.errors import ModelFileError
from .architecture import METADATA_KEYS, Architecture, Scalar, Stage
from .spec import SSMParams


# Architecture keys kiln reads (gguf_reader._read_hparams) ...
_KNOWN_KEYS = frozenset({
    "block_count", "context_length", "embedding_length", "feed_forward_length", "vocab_size",
    "attention.head_count", "attention.head_count_kv", "attention.key_length", "attention.value_length",
    "attention.layer_norm_rms_epsilon", "attention.sliding_window", "rope.freq_base", "rope.dimension_count",
    "pooling_type",  # how an embedding is pooled: it changes no logit
    "classifier.output_labels",  # a reranker's class head's outputs (its cls.output rows)
    # the shapes of sentence-transformers' Dense layers after pooling (runtime/embedding.py reads
    # their tensors, dense_2 and dense_3): they change the pooled vector, never a logit
    "dense_2_feat_in", "dense_2_feat_out", "dense_3_feat_in", "dense_3_feat_out",
})
# ... and keys that change nothing at these values, which kiln accepts as written. A key outside
# both would change the model's math in a way kiln does not implement: it is refused, never ignored.
_NEUTRAL_KEYS: dict[str, tuple] = {
    "rope.scaling.type": ("none",),
    "rope.scaling.factor": (0.0, 1.0),
    "rope.scale_linear": (1.0,),
    "rope.freq_scale": (1.0,),
    "rope.scaling.attn_factor": (1.0,),
    "attention.logit_softcapping": (0.0,),
    "attn_logit_softcapping": (0.0,),
    "final_logit_softcapping": (0.0,),
    "attention.scale": (0.0,),
    "attention.clamp_kqv": (0.0,),
    "attention.max_alibi_bias": (0.0,),
    "attention.causal": (True,),
    "expert_count": (0,),
    "expert_used_count": (0,),
    "expert_shared_count": (0,),
    "expert_weights_scale": (0.0, 1.0),
    "embedding_scale": (1.0,),
    "residual_scale": (1.0,),
    "logit_scale": (1.0,),
}
# informational only: they describe how a scaling was trained, and matter only with one
_INFO_KEYS = frozenset({"rope.scaling.original_context_length", "rope.scaling.finetuned"})


def check_unimplemented(meta, t: Architecture) -> None:
    prefix = t.arch + "."
    implemented = t.metadata_keys()
    requires = dict(t.requires)
    for key in meta.keys():
        if not key.startswith(prefix):
            continue
        name = key[len(prefix):]
        value = meta.get(key)
        shown = value if isinstance(value, (int, float, str, bool)) else type(value).__name__
        if name in requires and value not in requires[name]:
            raise ModelFileError(f"{meta.path}: metadata '{key}' = {shown!r} asks for something kiln does not implement "
                                 f"for {t.arch} (it runs only {requires[name]}); use a GGUF without it")
        if name in _KNOWN_KEYS or name in _INFO_KEYS or name in implemented:
            continue
        if name in _NEUTRAL_KEYS and value in _NEUTRAL_KEYS[name]:
            continue
        raise ModelFileError(f"{meta.path}: metadata '{key}' = {shown!r} asks for something kiln does not implement "
                             f"for {t.arch} (it would run the model wrong); use a GGUF without it")


def read_scalars(meta, t: Architecture) -> tuple[tuple[str, float], ...]:
    """The values of the numbers the template takes from the file (architecture.METADATA_KEYS)."""
    out = []
    for key in sorted(t.metadata_keys() & set(METADATA_KEYS.values())):
        if meta.get(f"{t.arch}.{key}") is not None:
            out.append((key, meta.number(f"{t.arch}.{key}")))
    if t.logit_scale is Scalar.METADATA and not dict(out).get("logit_scale"):  # llama.cpp divides by it
        raise ModelFileError(f"{meta.path}: metadata key '{t.arch}.logit_scale' is missing or 0; the {t.arch} "
                             "architecture divides the logits by it")
    return tuple(out)


def read_rope_scaling(meta, t: Architecture) -> dict:
    """rope.scaling.* as llama.cpp reads them, for an architecture that implements them (else
    check_unimplemented has refused every value but the neutral ones)."""
    if not t.rope_scaling:
        return {}
    a = t.arch
    factor = meta.number(f"{a}.rope.scaling.factor", default=None) if meta.get(f"{a}.rope.scaling.factor") is not None \
        else meta.number(f"{a}.rope.scale_linear", default=0.0)
    factor = factor or 1.0
    kind = meta.text(f"{a}.rope.scaling.type", default=None)
    if kind is None:  # llama.cpp's default is linear, which a missing factor leaves unscaled
        kind = "linear" if factor != 1.0 else "none"
    allowed = ("none", *(r.value for r in t.rope_scaling))
    if kind not in allowed:
        raise ModelFileError(f"{meta.path}: metadata '{a}.rope.scaling.type' = {kind!r} asks for something kiln does "
                             f"not implement for {a} (it implements {', '.join(allowed)}); use a GGUF without it")
    if factor <= 0.0 or (kind == "yarn" and factor < 1.0):
        raise ModelFileError(f"{meta.path}: metadata '{a}.rope.scaling.factor' = {factor} is out of range for "
                             f"{kind} scaling")
    return dict(
        rope_scaling=kind, rope_scaling_factor=1.0 if kind == "none" else factor,
        rope_attn_factor=meta.number(f"{a}.rope.scaling.attn_factor", default=1.0),
        rope_n_ctx_orig=meta.integer(f"{a}.rope.scaling.original_context_length", default=None)
        or meta.integer(f"{a}.context_length"),
        # rope.scaling.yarn_beta_fast and _slow are accepted and, as llama.cpp does for every
        # architecture kiln has (it reads them for grok and mistral3 alone), left at 32 and 1
    )


def read_experts(meta, t: Architecture, n_layer: int) -> dict:
    """A mixture of experts' numbers, as llama.cpp reads them: expert_count and expert_used_count
    (both required), and an expert's FFN width from the template's key (qwen3moe's
    expert_feed_forward_length, absent: feed_forward_length / expert_used_count); with a moe_block,
    which layers run it: il % moe_every_n_layers == 1 (absent or 0: none, and no expert is read)."""
    a = t.arch
    beside = t.moe is None and Stage.FFN_MOE_BESIDE in t.block  # Gemma 4's: experts where the file has them
    if (t.moe is None and not beside) or (beside and meta.get(f"{a}.expert_count") is None):
        return {}
    moe = {}
    if t.moe_block is not None:
        every = meta.integer(f"{a}.moe_every_n_layers", default=0)
        if every < 0:
            raise ModelFileError(f"{meta.path}: metadata '{a}.moe_every_n_layers' = {every} must not be negative")
        moe["moe_layers"] = tuple(every > 0 and il % every == 1 for il in range(n_layer))
        if not any(moe["moe_layers"]):
            return moe
    n_expert, n_used = meta.integer(f"{a}.expert_count"), meta.integer(f"{a}.expert_used_count")
    if not 1 <= n_expert <= MOE_MAX_EXPERTS:
        raise ModelFileError(f"{meta.path}: metadata '{a}.expert_count' = {n_expert}; kiln runs 1 to "
                             f"{MOE_MAX_EXPERTS} experts a layer")
    if not 1 <= n_used <= n_expert:
        raise ModelFileError(f"{meta.path}: metadata '{a}.expert_used_count' = {n_used} must be between 1 and "
                             f"expert_count ({n_expert})")
    n_ff = meta.integer(f"{a}.{t.moe.ffn_length_key if t.moe else 'expert_feed_forward_length'}", default=None)
    if n_ff is None:  # qwen3moe without its own key
        n_ff = meta.integer(f"{a}.feed_forward_length") // n_used
    if n_ff <= 0:
        raise ModelFileError(f"{meta.path}: metadata '{a}.expert_feed_forward_length' = {n_ff} must be positive")
    return moe | dict(n_expert=n_expert, n_expert_used=n_used, n_ff_exp=n_ff)


def read_recurrent(meta, t: Architecture, n_layer: int, head_dim: int) -> dict:
    """A recurrent template's numbers, as llama.cpp's qwen35 loader reads them: the DeltaNet's sizes
    (ssm.*, required), which layers are recurrent (attention.recurrent_layers, else every layer but
    each full_attention_interval-th, default 4), and the rope sections of the attention layers."""
    if t.recurrent_block is None:
        return {}
    a = t.arch
    d_conv, d_state = meta.integer(f"{a}.ssm.conv_kernel"), meta.integer(f"{a}.ssm.state_size")
    n_k, n_v, d_inner = (meta.integer(f"{a}.ssm.{k}") for k in ("group_count", "time_step_rank", "inner_size"))
    for key, v in (("conv_kernel", d_conv), ("state_size", d_state), ("group_count", n_k), ("time_step_rank", n_v)):
        if v <= 0:
            raise ModelFileError(f"{meta.path}: metadata '{a}.ssm.{key}' = {v} must be positive")
    if d_inner != n_v * d_state:
        raise ModelFileError(f"{meta.path}: metadata '{a}.ssm.inner_size' = {d_inner} but time_step_rank x "
                             f"state_size = {n_v * d_state}; llama.cpp's value heads are state_size wide")
    if n_v % n_k:
        raise ModelFileError(f"{meta.path}: metadata '{a}.ssm.time_step_rank' = {n_v} value heads is not a multiple "
                             f"of ssm.group_count = {n_k} key heads")
    if d_state > MAX_STATE_DIM or d_conv > MAX_CONV_TAPS:
        raise ModelFileError(f"{meta.path}: ssm.state_size {d_state} / ssm.conv_kernel {d_conv} are above "
                             f"{MAX_STATE_DIM} / {MAX_CONV_TAPS}, the most kiln's DeltaNet kernels hold")
    mask = meta.array(f"{a}.attention.recurrent_layers")
    if mask is not None:
        if len(mask) < n_layer:
            raise ModelFileError(f"{meta.path}: metadata '{a}.attention.recurrent_layers' has {len(mask)} entries "
                                 f"for {n_layer} blocks")
        recurrent = tuple(bool(x) for x in mask[:n_layer])
    else:
        interval = meta.integer(f"{a}.full_attention_interval", default=4)
        if interval <= 0:
            raise ModelFileError(f"{meta.path}: metadata '{a}.full_attention_interval' = {interval} must be positive")
        recurrent = tuple((il + 1) % interval != 0 for il in range(n_layer))
    _check_sections(meta, a, meta.integer(f"{a}.rope.dimension_count", default=head_dim))
    return dict(recurrent_layers=recurrent, ssm=SSMParams(d_conv, d_state, n_k, n_v))


def _check_sections(meta, a: str, n_rot: int) -> None:
    """IMRoPE (ggml_rope_multi) gives each rotated pair i the position of its section: time, height
    or width by i % 3 within the sections' sizes, else the fourth, extra one. A text token's first
    three are its position and the fourth is 0 (llama-graph.cpp), so where every pair falls in the
    first three it is the NEOX rope kiln runs; a pair left to the fourth would not rotate at all."""
    sections = meta.array(f"{a}.rope.dimension_sections")
    if sections is None:
        return
    s = [int(x) for x in sections] + [0] * 4
    total = sum(s[:4])
    for i in range(n_rot // 2):
        sector = i % total if total else i
        if not any(sector % 3 == k and sector < 3 * s[k] for k in range(3)):
            raise ModelFileError(f"{meta.path}: metadata '{a}.rope.dimension_sections' = {s[:4]} leaves rotated pair "
                                 f"{i} of {n_rot // 2} to the extra section, which kiln does not implement for text")


def per_layer(meta, key: str, n_layer: int, default=None) -> tuple[int | None, tuple[int, ...]]:
    """A key that may hold one value or one per layer (llama.cpp's get_key_or_arr): the first
    layer's value, and every layer's where the file gives an array (else ())."""
    values = meta.get(key)
    if values is None:
        if default is None:
            meta.integer(key)  # names the missing key
        return default, ()
    if not isinstance(values, list):
        return int(values), ()
    if len(values) != n_layer:
        raise ModelFileError(f"{meta.path}: metadata '{key}' has {len(values)} values for {n_layer} blocks")
    return int(values[0]), tuple(int(v) for v in values)


def read_layers(meta, t: Architecture, n_layer: int, n_head: int, head_dim: int, n_rot: int) -> dict:
    """The per-layer hyperparameters of a template whose layer kinds differ in shape, as llama.cpp's
    gemma4 loader reads them: which layers slide (attention.sliding_window_pattern, required), the
    sliding layers' head width (key_length_swa = value_length_swa), rotated dims (rope.dimension_count_swa,
    default their head width) and rope base (rope.freq_base_swa, default 10000), the per-layer
    embeddings' width, and how many of the last layers keep no KV."""
    a, out = t.arch, {}
    if t.shared_kv:
        shared = meta.integer(f"{a}.attention.shared_kv_layers", default=0)
        if not 0 <= shared < n_layer:
            raise ModelFileError(f"{meta.path}: metadata '{a}.attention.shared_kv_layers' = {shared} must be "
                                 f"between 0 and block_count - 1 ({n_layer - 1})")
        out["shared_kv_layers"] = shared
    if not t.kind_bodies:
        return out
    pattern = meta.array(f"{a}.attention.sliding_window_pattern")
    if pattern is None or len(pattern) != n_layer:
        raise ModelFileError(f"{meta.path}: metadata '{a}.attention.sliding_window_pattern' must hold one flag per "
                             f"block ({n_layer}); the {a} architecture reads which layers slide from it")
    hd_swa = meta.integer(f"{a}.attention.key_length_swa")
    if meta.integer(f"{a}.attention.value_length_swa") != hd_swa:
        raise ModelFileError(f"{meta.path}: key_length_swa {hd_swa} != value_length_swa; kiln needs them equal")
    n_rot_swa = meta.integer(f"{a}.rope.dimension_count_swa", default=hd_swa)
    for name, dim, rot in (("key_length_swa", hd_swa, n_rot_swa), ("key_length", head_dim, n_rot)):
        if not (0 < dim <= MAX_HEAD_DIM and 0 < rot <= dim and rot % 2 == 0):
            raise ModelFileError(f"{meta.path}: attention.{name} {dim} with {rot} rotated dims: a head is 1 to "
                                 f"{MAX_HEAD_DIM} wide and rotates an even number of its dims")
    return out | dict(swa_layers=tuple(bool(x) for x in pattern), head_dim_swa=hd_swa, n_rot_swa=n_rot_swa,
                      rope_base_swa=meta.number(f"{a}.rope.freq_base_swa", default=10000.0),
                      n_embd_per_layer=meta.integer(f"{a}.embedding_length_per_layer_input", default=0))
