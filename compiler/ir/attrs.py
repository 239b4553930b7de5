"""The attributes an op of the IR carries beyond its operands (graph.OP_ATTRS says which op takes
which): plain frozen records, each one op's parameters as llama.cpp derives them from the GGUF."""
from __future__ import annotations

from dataclasses import dataclass

from ..frontend.architecture import Activation, RopeLayout


@dataclass(frozen=True)
class MatmulAttrs:
    """act_from: the matmul before this one that quantized the same rows, in the same format, into
    the scratch both use (the share_act pass sets it); None: this one quantizes them itself.
    run_at, run_rows: where this matmul's output rows begin among its run's (the matmuls sharing
    one quantized copy, run without barriers between them) and how many the run has, so that the
    threads can share the run out as one matrix; run_rows 0: a matmul on its own."""
    act_from: str | None = None
    run_at: int = 0
    run_rows: int = 0


@dataclass(frozen=True)
class NormAttrs:
    eps: float
    weight_offset: float


@dataclass(frozen=True)
class EmbedAttrs:
    scale: float


@dataclass(frozen=True)
class RopeAttrs:
    """ggml_rope_ext's parameters beyond the layer's base (ir/rope.py computes them as llama.cpp does);
    the defaults rotate by position alone. A third input, where the node has one, holds the
    per-dimension frequency factors."""
    layout: RopeLayout
    n_rot: int
    freq_scale: float = 1.0  # positions times it (linear and YaRN scaling)
    ext_factor: float = 0.0  # YaRN: how far the fast dimensions keep their unscaled angle
    mscale: float = 1.0  # cos and sin times it: attn_factor, with YaRN's own correction
    beta_fast: float = 32.0  # YaRN's correction dimensions, from these and the original context
    beta_slow: float = 1.0
    n_ctx_orig: int = 0

    @property
    def scaled(self) -> bool:
        return (self.freq_scale, self.ext_factor, self.mscale) != (1.0, 0.0, 1.0)


@dataclass(frozen=True)
class RopeRotation:
    """One rotation the step's ropes share: its base, the dims it rotates, whether the frequency factors
    divide its angles, and where its n_rot values (n_rot / 2 cos, then sin) begin in a row of the table."""
    base: float
    n_rot: int
    factors: bool
    at: int


@dataclass(frozen=True)
class RopeTableAttrs:
    """The rotations of the rope table (passes/rope_table.py), the floats of one row of it, the
    scaling every rope of the model takes (RopeAttrs; its layout and n_rot are the first rope's), and
    each layer's rotation (an index into rotations; -1: its ropes rotate nothing)."""
    rotations: tuple[RopeRotation, ...]
    row: int
    scaling: RopeAttrs
    layers: tuple[int, ...]


@dataclass(frozen=True)
class AttentionAttrs:
    n_head: int
    n_head_kv: int
    head_dim: int
    scale: float
    softcap: float = 0.0  # scores -> c tanh(s / c) before the softmax; 0: none
    alibi: float = 0.0  # ALiBi's max bias: each score plus slope_h * -|i - j| (jina-bert-v2); 0: none


@dataclass(frozen=True)
class ScaleAttrs:
    scale: float


@dataclass(frozen=True)
class SoftcapAttrs:
    cap: float


@dataclass(frozen=True)
class GluAttrs:
    activation: Activation


@dataclass(frozen=True)
class RouteAttrs:
    n_expert: int
    n_used: int  # k: experts a row runs
    normalize: bool  # the k weights divided by their sum (llama.cpp's norm_w)
    softmax_weight: bool = False  # the top k by the logits, weighted by the softmax of those k (gpt-oss)


@dataclass(frozen=True)
class MoeAttrs:
    """parts: what the node's weight inputs (after x, ids, weights) are, in order: gate, up, down (or
    gate_up, one tensor of each expert's gate rows then its up rows: Gemma 4's), then, where the
    model has them, gate_b, up_b, down_b (each expert's biases: gpt-oss's) and down_scale (each
    expert's output times one number: Gemma 4's)."""
    n_expert: int
    n_used: int
    activation: Activation
    parts: tuple[str, ...] = ("gate", "up", "down")


MOE_PARTS = ("gate", "up", "gate_up", "down", "gate_b", "up_b", "down_b", "down_scale")


@dataclass(frozen=True)
class RegroupAttrs:
    """A row of x is `groups` groups of consecutive parts of these widths; output i is, for each of
    its parts in turn, that part of every group in group order (a projection that interleaves
    per head what the next ops take apart: Q and its gate, Qwen3-Next's q, k, v, z and b, a)."""
    groups: int
    parts: tuple[int, ...]
    outputs: tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class ConvAttrs:
    taps: int  # ssm.conv_kernel: this row and the taps - 1 before it in its sequence


@dataclass(frozen=True)
class DeltaNetAttrs:
    """A Gated DeltaNet's shape: value head h reads key head h % n_k_heads (llama.cpp's pairing for
    qwen35), each d_state wide; q and k are L2-normalized with eps (the file's RMS eps)."""
    n_k_heads: int
    n_v_heads: int
    d_state: int
    eps: float
    interleaved: bool = False  # value head h reads key head h // (n_v / n_k) (Qwen3-Next's repeat_interleave)


Attrs = (NormAttrs | EmbedAttrs | RopeAttrs | RopeTableAttrs | AttentionAttrs | GluAttrs | ScaleAttrs | SoftcapAttrs | RouteAttrs
         | MoeAttrs | RegroupAttrs | ConvAttrs | DeltaNetAttrs | None)
