"""The persistent KV region: per sequence slot, layer-major outside and head-major inside.

    slot s, layer l, K|V, kv_head h, cache row r  ->
        s*seq_stride + (k_offset[l] | v_offset[l]) + (h*capacity[l] + r) * row_bytes

Global layers hold the whole context (row r = position). Sliding-window layers hold a ring
and write position p at row p % capacity. A prefill chunk of T tokens starting at p writes
rows for p..p+T-1 before attending, and its first query (at p) still needs keys back to
p-window+1; so window+T-1 rows are live at once and capacity = window + chunk - 1 is enough
(decode is the case T = 1).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..dtypes import DType
from ..errors import OptionError
from ..gguf_model import HParams
from ..options import CompileOptions
from ..templates import LayerKind, Template

ALIGN = 64


def align(n: int, a: int = ALIGN) -> int:
    return (n + a - 1) // a * a


@dataclass(frozen=True)
class KVLayer:
    layer: int
    kind: LayerKind
    window: int | None
    capacity: int  # cache rows per kv head
    k_offset: int  # within a sequence slot
    v_offset: int
    bytes: int  # K and V of this layer, one slot


@dataclass(frozen=True)
class KVPlan:
    dtype: DType
    n_seq: int
    ctx: int
    n_head_kv: int
    head_dim: int
    row_bytes: int  # one position of one head
    seq_stride: int  # bytes per sequence slot
    layers: tuple[KVLayer, ...]

    @property
    def total_bytes(self) -> int:
        return self.seq_stride * self.n_seq

    @property
    def full_context_bytes(self) -> int:
        """What the region would take if every layer held the whole context."""
        return self.n_seq * len(self.layers) * 2 * align(self.n_head_kv * self.ctx * self.row_bytes)

    def row(self, layer: int, pos: int) -> int:
        return pos % self.layers[layer].capacity

    def offset(self, seq: int, layer: int, kv: int, head: int, pos: int) -> int:
        """Byte offset of (slot, layer, K=0|V=1, kv_head, position) in the KV region."""
        ly = self.layers[layer]
        base = ly.v_offset if kv else ly.k_offset
        return seq * self.seq_stride + base + (head * ly.capacity + self.row(layer, pos)) * self.row_bytes


def plan_kv(hp: HParams, tmpl: Template, opts: CompileOptions) -> KVPlan:
    if hp.head_dim % opts.kv_dtype.block_elems:
        raise OptionError(
            f"kv_dtype (--kv-dtype) {opts.kv_dtype.label} stores blocks of {opts.kv_dtype.block_elems} "
            f"but head_dim is {hp.head_dim}; use f16 or f32"
        )
    row_bytes = opts.kv_dtype.nbytes(hp.head_dim)
    layers, off = [], 0
    for il in range(hp.n_layer):
        kind = tmpl.layer_kind(il)
        window = hp.sliding_window if kind is LayerKind.LOCAL else None
        capacity = opts.ctx if window is None else min(opts.ctx, window + opts.prefill_chunk - 1)
        half = align(hp.n_head_kv * capacity * row_bytes)
        layers.append(KVLayer(il, kind, window, capacity, off, off + half, 2 * half))
        off += 2 * half
    return KVPlan(opts.kv_dtype, opts.n_seq, opts.ctx, hp.n_head_kv, hp.head_dim, row_bytes, off, tuple(layers))
