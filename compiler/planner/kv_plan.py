"""The KV pool: pages of `page_size` positions, shared by up to n_seq sequences.

Layers form groups by how much history they keep: the full-context layers, and the
sliding-window layers (Gemma 3's local layers). Each group has a pool of its own, because
its pages live for different times: a sliding layer's page goes back to the pool once it
has left the window. A page of a group holds page_size positions of every layer in it,
head-major inside so that attention streams one head's rows of a page contiguously:

    group g, page p, layer l, kv_head h, row r (= position % page_size) ->
        K: pool_offset[g] + p*page_bytes[g] + k_offset[l] + (h*page_size + r)*k_row_bytes
        V: pool_offset[g] + p*page_bytes[g] + v_offset[l] + (h*page_size + r)*v_row_bytes

K and V may have different element types (llama.cpp's -ctk / -ctv), so their rows may differ
in size. A quantized K (or V) is held in Hadamard blocks of 64, as llama.cpp holds it: Q and K
(V, and attention's output) are rotated by the orthonormal 64x64 Hadamard matrix, which leaves
every dot product as it was but spreads a head's outlier channels over the block, so that a
block's one scale fits all its values (passes/kv_rotate.py).

A sequence maps positions to pages through one block table per group (block b holds
positions b*page_size ..). A sliding group needs at most the pages that cover the window
plus one step's tokens: a step of T tokens from position P attends from P - window + 1 to
P + T - 1, window + T - 1 positions, which touch at most ceil((window + T - 2) / page_size) + 1
pages. So its pool holds that bound for every sequence, and the full-context pool is the one
`--kv-pages` sizes.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..core.dtypes import DType
from ..core.errors import OptionError
from ..frontend.spec import HParams
from ..core.options import CompileOptions
from ..frontend.architecture import LayerKind, Architecture

ALIGN = 64
HADAMARD_BLOCK = 64  # runtime_c/kernels.h KILN_HADAMARD_BLOCK
FLOAT_KV = (DType.F32, DType.F16)  # cache types held as they are; the quantized ones are rotated


def align(n: int, a: int = ALIGN) -> int:
    return (n + a - 1) // a * a


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class KVLayer:
    layer: int
    kind: LayerKind
    window: int | None
    group: int
    offset: int  # of this layer's K within a page of its group
    k_bytes: int  # K of one page: n_head_kv x page_size rows, padded to ALIGN
    v_bytes: int  # V of one page, right after K

    @property
    def v_offset(self) -> int:
        return self.offset + self.k_bytes

    @property
    def page_bytes(self) -> int:
        return self.k_bytes + self.v_bytes


@dataclass(frozen=True)
class KVGroup:
    index: int
    window: int | None  # None: the group holds the whole context
    layers: tuple[int, ...]
    page_bytes: int
    n_pages: int
    seq_pages: int  # the most pages one sequence holds at once
    pool_offset: int  # of this group's pool in the KV region

    @property
    def pool_bytes(self) -> int:
        return self.n_pages * self.page_bytes


@dataclass(frozen=True)
class KVPlan:
    k_dtype: DType
    v_dtype: DType
    n_seq: int
    ctx: int
    page_size: int
    n_head_kv: int
    head_dim: int
    k_row_bytes: int  # one position of one head
    v_row_bytes: int
    max_blocks: int  # block-table entries per sequence and group: ceil(ctx / page_size)
    groups: tuple[KVGroup, ...]
    layers: tuple[KVLayer, ...]
    k_hadamard: bool = False  # K (with Q) held in Hadamard blocks
    v_hadamard: bool = False  # V held in Hadamard blocks (attention's output rotated back)

    @property
    def total_bytes(self) -> int:
        return sum(g.pool_bytes for g in self.groups)

    @property
    def full_context_bytes(self) -> int:
        """n_seq x ctx positions in every layer: what the cache would take without pages or windows."""
        return self.n_seq * self.ctx * self.page_tokens_bytes

    @property
    def page_tokens_bytes(self) -> int:
        """Bytes one position takes across every layer (all groups)."""
        return len(self.layers) * self.n_head_kv * (self.k_row_bytes + self.v_row_bytes)

    @property
    def dtype_label(self) -> str:
        """'f16', or 'q4_0/f16' when K and V differ."""
        k, v = self.k_dtype.label, self.v_dtype.label
        return k if k == v else f"{k}/{v}"

    def offset(self, page: int, layer: int, kv: int, head: int, row: int) -> int:
        """Byte offset of (page, layer, K=0|V=1, kv_head, row in page) in the KV region."""
        ly = self.layers[layer]
        g = self.groups[ly.group]
        row_bytes = self.v_row_bytes if kv else self.k_row_bytes
        return (g.pool_offset + page * g.page_bytes + (ly.v_offset if kv else ly.offset)
                + (head * self.page_size + row) * row_bytes)


def _group_key(kind: LayerKind, hp: HParams) -> int | None:
    return hp.sliding_window if kind is LayerKind.LOCAL else None


def plan_kv(hp: HParams, arch: Architecture, opts: CompileOptions) -> KVPlan:
    for part, dtype in (("k", opts.kv_dtype_k), ("v", opts.kv_dtype_v)):
        if hp.head_dim % dtype.block_elems:
            raise OptionError(
                f"kv_dtype_{part} (--kv-dtype-{part}) {dtype.label} stores blocks of {dtype.block_elems} "
                f"but head_dim is {hp.head_dim}; use f16 or f32"
            )
    ps = opts.page_size
    k_row, v_row = opts.kv_dtype_k.nbytes(hp.head_dim), opts.kv_dtype_v.nbytes(hp.head_dim)
    max_blocks = ceil_div(opts.ctx, ps)
    windows = [_group_key(arch.layer_kind(il), hp) for il in range(hp.n_layer)]
    # full-context group first, then sliding groups by window: a fixed order for a fixed layout
    keys = sorted(set(windows), key=lambda w: (w is not None, w or 0))
    k_bytes, v_bytes = align(hp.n_head_kv * ps * k_row), align(hp.n_head_kv * ps * v_row)
    layers: list[KVLayer] = []
    groups: list[KVGroup] = []
    pool_offset = 0
    for gi, window in enumerate(keys):
        members = tuple(il for il in range(hp.n_layer) if windows[il] == window)
        if window is None:
            seq_pages = max_blocks
            n_pages = opts.n_seq * max_blocks if opts.kv_pages is None else opts.kv_pages
        else:
            seq_pages = min(max_blocks, ceil_div(window + opts.batch_tokens - 2, ps) + 1)
            n_pages = opts.n_seq * seq_pages
        for i, il in enumerate(members):
            layers.append(KVLayer(il, arch.layer_kind(il), window, gi, i * (k_bytes + v_bytes), k_bytes, v_bytes))
        page_bytes = (k_bytes + v_bytes) * len(members)
        groups.append(KVGroup(gi, window, members, page_bytes, n_pages, seq_pages, pool_offset))
        pool_offset += align(n_pages * page_bytes)
    layers.sort(key=lambda ly: ly.layer)
    def rotated(dtype: DType) -> bool:
        return opts.kv_rotation and dtype not in FLOAT_KV and hp.head_dim % HADAMARD_BLOCK == 0

    return KVPlan(opts.kv_dtype_k, opts.kv_dtype_v, opts.n_seq, opts.ctx, ps, hp.n_head_kv, hp.head_dim, k_row, v_row,
                  max_blocks, tuple(groups), tuple(layers), rotated(opts.kv_dtype_k), rotated(opts.kv_dtype_v))
