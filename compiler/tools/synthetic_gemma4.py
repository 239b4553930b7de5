"""Tiny Gemma 4 (`gemma4`) models for `synthetic.write_tiny_model`, written from llama.cpp's loader
(src/models/gemma4.cpp, llama-model.cpp, llama-hparams.cpp) and its converter, not from a kiln template.

Layers. Layer il is full attention when (il + 1) % s.full_attention_interval == 0, sliding otherwise
(Gemma 4's "n sliding, then 1 full"; at least one sliding layer, which llama.cpp's iSWA cache asserts).
A sliding layer's heads are head_dim wide (s.head_dim or n_embd // n_head) and it has s.n_head_kv KV
heads; a full layer's are 2 * head_dim wide (Gemma 4's 512 vs 256) with max(1, n_head_kv // 2) KV heads
(31B: 16 vs 4; written as a per-layer head_count_kv array when the two differ).
Shared KV (dense only): the layers after the last full layer below the final one read the cache of an
earlier layer and have no attn_k / attn_k_norm / attn_v (E2B: the last 20 of 35). llama.cpp's rule
(llama-model.cpp, the kv cache's `reuse` for GEMMA3N/GEMMA4): with n_kv = n_layer - shared_kv_layers, a
shared layer reads layer n_kv - 2 if it slides, n_kv - 1 if full, so layer n_kv - 1 must be full and
n_kv - 2 sliding; this rule makes them so. The shared layers' FFN is twice n_ff wide (E2B's
use_double_wide_mlp: a per-layer feed_forward_length array).
K as V: full layers that own their KV have no attn_v, so llama.cpp uses K's projection as V (the
31B's and 26B-A4B's attention_k_eq_v); sliding layers have attn_v.
Per-layer embeddings (dense only): n_embd_per_layer = 32, so that blk.N.proj (rows that wide) takes
32-element quant blocks (Q8_0, Q4_0); per_layer_token_embd stays F32 unless s.types says otherwise.
MoE (26B-A4B-like): on when s.extra_meta has "expert_feed_forward_length" (the real key, the experts'
width); every layer then has the router, s.n_expert experts (s.n_expert_used a token) with their
gate and up fused as ffn_gate_up_exps (as the converter writes HF's experts.gate_up_proj), a
per-expert ffn_down_exps.scale (HF's router.per_expert_scale), and the dense FFN as a shared MLP; no
per-layer embeddings and no shared KV.

Overrides, through s.extra_meta: its real gemma4 keys are what the file says, so this module reads
them instead of its defaults and leaves them for write_tiny_model to write: attention.shared_kv_layers,
embedding_length_per_layer_input (0: none), expert_feed_forward_length (MoE), feed_forward_length (one
width, no double-wide MLP), rope.dimension_count_swa, rope.freq_base_swa, final_logit_softcapping
(0.0: none). Keys under "synthetic." are read here and never written: synthetic.fused_gate_up (False:
separate ffn_gate_exps and ffn_up_exps), synthetic.k_eq_v (False: every layer that owns KV has attn_v,
as on E2B), synthetic.partial_rotary (the full layers' rotated fraction, default 0.25).
"""
from __future__ import annotations

from dataclasses import dataclass

import gguf
import numpy as np
from gguf import GGMLQuantizationType as Q

from .tiny_spec import TinySpec

ARCH = "gemma4"
N_EMBD_PER_LAYER = 32
UNROTATED = 1e30  # a rope_freqs factor that stops a pair turning: theta / 1e30 is 0 (the converter's)


@dataclass(frozen=True)
class Gemma4Extra:
    """What a Gemma 4 model has beyond TinySpec's fields, derived from them (see the module doc)."""
    swa: tuple[bool, ...]  # a layer slides
    head_dim_swa: int
    head_dim_full: int
    n_head_kv_swa: int
    n_head_kv_full: int
    n_shared: int  # the last n_shared layers own no KV
    n_embd_per_layer: int  # 0: no per-layer embeddings
    n_ff: tuple[int, ...]  # a layer's FFN (the shared MLP's, on MoE) width
    n_ff_exp: int  # 0: dense
    n_rot_swa: int
    n_rot_pairs_full: int  # the full layers' pairs that turn (rope_freqs 1.0; the rest 1e30)
    rope_base_swa: float
    softcap: float
    k_eq_v: bool
    fused_gate_up: bool

    @property
    def n_kv(self) -> int:
        return len(self.swa) - self.n_shared

    def kv_source(self, il: int) -> int:
        """The layer whose K and V layer il attends to (llama.cpp's reuse rule)."""
        return il if il < self.n_kv else self.n_kv - (2 if self.swa[il] else 1)

    def has_v(self, il: int) -> bool:
        return il < self.n_kv and (self.swa[il] or not self.k_eq_v)


def gemma4_extra(s: TinySpec) -> Gemma4Extra:
    m = s.extra_meta
    n = s.n_layer
    swa = tuple((il + 1) % s.full_attention_interval != 0 for il in range(n))
    hd = s.head_dim or s.n_embd // s.n_head
    moe = "expert_feed_forward_length" in m
    below = [il for il in range(n - 1) if not swa[il]]  # full layers below the final one
    shared = m.get("attention.shared_kv_layers", n - 1 - below[-1] if below and below[-1] >= 1 and not moe else 0)
    n_kv = n - shared
    if not any(swa) or n_kv < 2 or (any(not swa[il] for il in range(n_kv, n)) and swa[n_kv - 1]) \
            or (any(swa[n_kv:]) and not swa[n_kv - 2]):
        raise ValueError(f"gemma4: llama.cpp cannot run sliding pattern {swa} with {shared} shared KV layers")
    n_ff = (m["feed_forward_length"],) * n if "feed_forward_length" in m else \
        tuple(s.n_ff * (2 if il >= n_kv else 1) for il in range(n))
    hd_full = 2 * hd
    return Gemma4Extra(
        swa=swa, head_dim_swa=hd, head_dim_full=hd_full, n_head_kv_swa=s.n_head_kv,
        n_head_kv_full=max(1, s.n_head_kv // 2), n_shared=shared,
        n_embd_per_layer=m.get("embedding_length_per_layer_input", 0 if moe else N_EMBD_PER_LAYER), n_ff=n_ff,
        n_ff_exp=m.get("expert_feed_forward_length", 0), n_rot_swa=m.get("rope.dimension_count_swa", hd),
        n_rot_pairs_full=int(hd_full * m.get("synthetic.partial_rotary", 0.25) / 2),
        rope_base_swa=m.get("rope.freq_base_swa", 10000.0), softcap=m.get("final_logit_softcapping", 30.0),
        k_eq_v=m.get("synthetic.k_eq_v", True), fused_gate_up=m.get("synthetic.fused_gate_up", True))


def gemma4_shapes(s: TinySpec, n_vocab: int) -> dict[str, tuple[int, ...]]:
    """llama.cpp's gemma4 loader's tensors, numpy order (ggml's {ne0, ne1} reversed). Own output.weight
    unless `untied` is False (real files tie it to token_embd): a tied head makes the next token nearly
    always the current one on random weights."""
    x, e = gemma4_extra(s), s.n_embd
    p, n = x.n_embd_per_layer, s.n_layer
    shapes: dict[str, tuple[int, ...]] = {"token_embd.weight": (n_vocab, e)}
    if s.untied is not False:
        shapes["output.weight"] = (n_vocab, e)
    if not all(x.swa):  # read by every full layer: loaded at the first, TENSOR_DUPLICATED after
        shapes["rope_freqs.weight"] = (x.head_dim_full // 2,)
    if p:
        shapes |= {"per_layer_token_embd.weight": (n_vocab, n * p), "per_layer_model_proj.weight": (n * p, e),
                   "per_layer_proj_norm.weight": (p,)}
    shapes["output_norm.weight"] = (e,)
    for il in range(n):
        b = f"blk.{il}."
        hd, kv = (x.head_dim_swa, x.n_head_kv_swa) if x.swa[il] else (x.head_dim_full, x.n_head_kv_full)
        shapes |= {b + "attn_norm.weight": (e,), b + "attn_q.weight": (s.n_head * hd, e)}
        if il < x.n_kv:
            shapes[b + "attn_k.weight"] = (kv * hd, e)
        if x.has_v(il):
            shapes[b + "attn_v.weight"] = (kv * hd, e)
        shapes[b + "attn_output.weight"] = (e, s.n_head * hd)
        shapes[b + "attn_q_norm.weight"] = (hd,)
        if il < x.n_kv:
            shapes[b + "attn_k_norm.weight"] = (hd,)
        shapes |= {b + "post_attention_norm.weight": (e,), b + "layer_output_scale.weight": (1,),
                   b + "ffn_norm.weight": (e,), b + "ffn_gate.weight": (x.n_ff[il], e),
                   b + "ffn_up.weight": (x.n_ff[il], e), b + "ffn_down.weight": (e, x.n_ff[il]),
                   b + "post_ffw_norm.weight": (e,)}
        if x.n_ff_exp:
            k, f = s.n_expert, x.n_ff_exp
            shapes |= {b + "ffn_gate_inp.weight": (k, e), b + "ffn_gate_inp.scale": (e,),
                       b + "pre_ffw_norm_2.weight": (e,), b + "post_ffw_norm_1.weight": (e,),
                       b + "post_ffw_norm_2.weight": (e,)}
            shapes |= {b + "ffn_gate_up_exps.weight": (k, 2 * f, e)} if x.fused_gate_up else \
                {b + "ffn_gate_exps.weight": (k, f, e), b + "ffn_up_exps.weight": (k, f, e)}
            shapes |= {b + "ffn_down_exps.weight": (k, e, f), b + "ffn_down_exps.scale": (k,)}
        if p:
            shapes |= {b + "inp_gate.weight": (p, e), b + "proj.weight": (e, p), b + "post_norm.weight": (e,)}
    return shapes


def gemma4_qtype(s: TinySpec, name: str, shape: tuple[int, ...]) -> Q:
    """Matrices take s.wtype, except the router and the per-layer embedding table (F32, as the 1-D
    tensors: norms, scales, rope_freqs); s.types overrides. A matrix whose rows don't split into the
    type's blocks (blk.N.proj's n_embd_per_layer under a K-quant) stays F32."""
    matrix = len(shape) >= 2 and name.endswith(".weight") and "gate_inp" not in name \
        and name != "per_layer_token_embd.weight"
    qtype = s.types.get(name, s.wtype if matrix else Q.F32)
    return qtype if shape[-1] % gguf.GGML_QUANT_SIZES[qtype][0] == 0 else Q.F32


def _key(w: gguf.GGUFWriter, key: str) -> str:
    """The full key, cleared of write_tiny_model's common value so that it is rewritten without a warning."""
    full = f"{ARCH}.{key}"
    for kv in w.kv_data:
        kv.pop(full, None)
    return full


def add_gemma4_meta(w: gguf.GGUFWriter, s: TinySpec) -> None:
    """Every key llama.cpp's gemma4 loader reads beyond write_tiny_model's common ones, and the common
    ones Gemma 4 writes differently (key/value length: the full layers'; per-layer n_ff and KV heads).
    Keys s.extra_meta holds are left to write_tiny_model, which writes them after these."""
    x, m = gemma4_extra(s), s.extra_meta
    for key in m:  # write_tiny_model's common value of a key extra_meta rewrites
        _key(w, key)
    if "feed_forward_length" not in m and len(set(x.n_ff)) > 1:
        _key(w, "feed_forward_length")
        w.add_feed_forward_length(list(x.n_ff))
    kv = [x.n_head_kv_swa if a else x.n_head_kv_full for a in x.swa]
    if len(set(kv)) > 1:
        _key(w, "attention.head_count_kv")
        w.add_head_count_kv(kv)
    u32 = {"attention.key_length": x.head_dim_full, "attention.value_length": x.head_dim_full,
           "attention.key_length_swa": x.head_dim_swa, "attention.value_length_swa": x.head_dim_swa,
           "rope.dimension_count": x.head_dim_full, "rope.dimension_count_swa": x.n_rot_swa,
           "attention.sliding_window": s.sliding_window or 8, "attention.shared_kv_layers": x.n_shared,
           "embedding_length_per_layer_input": x.n_embd_per_layer}
    if x.n_ff_exp:
        u32 |= {"expert_count": s.n_expert, "expert_used_count": s.n_expert_used}
    for key, value in u32.items():
        if key not in m:
            w.add_uint32(_key(w, key), value)
    for key, value in {"rope.freq_base_swa": x.rope_base_swa, "final_logit_softcapping": x.softcap}.items():
        if key not in m:
            w.add_float32(_key(w, key), value)
    w.add_sliding_window_pattern(list(x.swa))


def gemma4_values(s: TinySpec, name: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Weights under which each of Gemma 4's features moves the logits and nothing overflows: norms near 1
    (Gemma 4's converter stores the multiplier itself, no 1 + w; norm_mean shifts them), but q and k norms
    near head_dim^-1/4, so that with Gemma 4's attention scale of 1 the scores are O(1), not one-hot;
    layer_output_scale, the router's input scale and the per-expert scales U(0.5, 1.5); rope_freqs as the
    converter writes it (1.0 for the turning pairs, 1e30 for the rest); the router O(1), so that its
    logits are O(1); the embedding tables and the LM head O(1); every other projection O(0.1)."""
    last = name.rsplit(".", 2)[-2] if name.count(".") else name
    if name == "rope_freqs.weight":
        r = gemma4_extra(s).n_rot_pairs_full
        return np.array([1.0] * r + [UNROTATED] * (shape[0] - r), dtype=np.float32)
    if name.endswith(("layer_output_scale.weight", "ffn_gate_inp.scale", "ffn_down_exps.scale")):
        return rng.uniform(0.5, 1.5, shape).astype(np.float32)
    if "norm" in last:
        w = rng.standard_normal(shape).astype(np.float32) * np.float32(0.1) + np.float32(1 + s.norm_mean)
        return w * np.float32(shape[0] ** -0.25) if last in ("attn_q_norm", "attn_k_norm") else w
    big = name in ("token_embd.weight", "output.weight", "per_layer_token_embd.weight") \
        or name.endswith("ffn_gate_inp.weight")
    return rng.standard_normal(shape).astype(np.float32) * np.float32(1.0 if big else 0.1)
