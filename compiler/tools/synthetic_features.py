"""The feature models: one tiny synthetic model for each architecture feature kiln implements
beyond the plain blocks, as TinySpec fields (synthetic.py) on a shape they share, and each with
its feature switched off for the negative controls."""
from __future__ import annotations

import math

import numpy as np


def llama3_rope_freqs(head_dim: int, base: float, factor: float = 8.0, low_freq_factor: float = 1.0,
                      high_freq_factor: float = 4.0, original_context: int = 8192) -> tuple[float, ...]:
    """Llama 3's rope_freqs.weight, as llama.cpp's converter computes it from a config's rope_scaling
    (rope_type llama3): 1 for the fast dimensions, `factor` for the slow ones, a blend between."""
    freqs = 1.0 / (base ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim))
    low_wavelen, high_wavelen = original_context / low_freq_factor, original_context / high_freq_factor
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            out.append(1.0)
        elif wavelen > low_wavelen:
            out.append(factor)
        else:
            smooth = (original_context / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return tuple(out)


# One tiny model for each architecture feature kiln implements beyond the plain blocks (rope scaling
# and factors, granite's scalars, Phi-3's fused tensors and LongRoPE, Gemma 2's soft-caps, SmolLM3's NoPE layers): TinySpec
# fields on top of the shape they share. The tests compare each with llama.cpp, check its batch
# invariance and its bits on every target. Rope bases are low and contexts short so that scaling
# moves angles within 70 positions.
FEATURE_SHAPE = dict(n_embd=128, n_head=4, n_head_kv=2, n_ff=256, untied=True)
FEATURE_MODELS: dict[str, dict] = {
    "llama-rope-freqs": dict(arch="llama", extra_tensors={
        "rope_freqs.weight": llama3_rope_freqs(32, 10000.0, factor=8.0, original_context=64)}),
    "llama-linear": dict(arch="llama", extra_meta={"rope.scaling.type": "linear", "rope.scaling.factor": 4.0}),
    "qwen2-yarn": dict(arch="qwen2", rope_base=10000.0, extra_meta={
        "rope.scaling.type": "yarn", "rope.scaling.factor": 4.0, "rope.scaling.original_context_length": 32}),
    "qwen3-yarn": dict(arch="qwen3", rope_base=10000.0, extra_meta={
        "rope.scaling.type": "yarn", "rope.scaling.factor": 8.0, "rope.scaling.original_context_length": 16}),
    "granite": dict(arch="granite", extra_meta={
        "embedding_scale": 0.25, "residual_scale": 0.8, "attention.scale": 1.0, "logit_scale": 1.5}),
    # LongRoPE: long factors past the original context (64 < ctx), short ones within it (512)
    "phi3-long": dict(arch="phi3", rope_base=10000.0, extra_meta={
        "rope.scaling.attn_factor": 1.19, "rope.scaling.original_context_length": 64}, extra_tensors={
        "rope_factors_long.weight": tuple(np.linspace(1.0, 8.0, 16)),
        "rope_factors_short.weight": tuple(np.linspace(1.0, 1.5, 16))}),
    "phi3-short": dict(arch="phi3", rope_base=10000.0, extra_meta={
        "rope.scaling.attn_factor": 1.19, "rope.scaling.original_context_length": 512}, extra_tensors={
        "rope_factors_long.weight": tuple(np.linspace(1.0, 8.0, 16)),
        "rope_factors_short.weight": tuple(np.linspace(1.0, 1.5, 16))}),
    "gemma2": dict(arch="gemma2", n_layer=4, n_head_kv=1, head_dim=64, sliding_window=8, extra_meta={
        "attn_logit_softcapping": 5.0, "final_logit_softcapping": 20.0}),
    # mixtures of experts: 8 experts a layer, 2 (qwen3moe, renormalized) or 3 (olmoe, as they are) a
    # token; OLMoE's q/k norms span a whole row, so its K has as many heads as Q (llama.cpp's shapes)
    "qwen3moe": dict(arch="qwen3moe", n_expert=8, n_expert_used=2),
    "olmoe": dict(arch="olmoe", n_head_kv=4, n_expert=8, n_expert_used=3),
    # gpt-oss: windows of 8 and full layers alternating, sinks, biases, YaRN, 4 of 8 experts a token
    "gpt-oss": dict(arch="gpt-oss", n_layer=4, n_ff=128, n_expert=8, n_expert_used=4, sliding_window=8,
                    rope_base=10000.0, extra_meta={"rope.scaling.type": "yarn", "rope.scaling.factor": 4.0,
                                                   "rope.scaling.original_context_length": 32}),
    # SmolLM3: layer 3 of 4 has no rope (NoPE)
    "smollm3": dict(arch="smollm3", n_layer=4),
}


# The same models with the feature switched off, for the tests' negative controls: RoPE's scaling
# and factors left out, Gemma 2's caps at the template's defaults, granite's scalars at 1 (it needs
# its logit scale; its attention scale falls to the default 1/sqrt(head_dim)), SmolLM3 read as llama. A mixture of
# experts' feature is its template's routing, which tests/test_moe.py switches there.
def _switched_off(name: str, spec: dict) -> dict:
    off = {k: v for k, v in spec.items() if k not in ("extra_meta", "extra_tensors")}
    if name == "granite":
        off["extra_meta"] = {"embedding_scale": 1.0, "residual_scale": 1.0, "logit_scale": 1.0}
    if name == "smollm3":  # the same file read as llama: every layer rotates
        off["metadata_arch"] = "llama"
    return off


FEATURE_OFF: dict[str, dict] = {name: _switched_off(name, spec) for name, spec in FEATURE_MODELS.items()
                                if "n_expert" not in spec}
