"""The KV pool: pages of `page_size` positions, shared by up to n_seq sequences.

Layers form groups by how much history they keep: the full-context layers, and the
sliding-window layers (Gemma 3's local layers). Each group has a pool of its own, because
its pages live for different times: a sliding layer's page goes back to the pool once it
has left the window. A page of a group holds page_size positions of every layer in it,
head-major inside so that attention streams one head's rows of a page contiguously:

    group g, page p, layer l, kv_head h, row r (= position % page_size) ->
        K: pool_offset[g] + p*page_bytes[g] + k_offset[l] + (h*page_size + r)*k_row_bytes
        V: pool_offset[g] + p*page_bytes[g] + v_offset[l] + (h*page_size + r)*v_row_bytes

K and V may have different element types (ir/kv.py), so their rows may differ in size. An f16
or f32 K is held transposed in the bytes of its head's rows, [head_dim][page_size], because
attention reads one value of d from many keys at once (runtime_c/kv_view.h):

        K value d: pool_offset[g] + p*page_bytes[g] + k_offset[l] + h*page_size*k_row_bytes
                   + (d*page_size + r)*k_value_bytes

A sequence maps positions to pages through one block table per group (block b holds
positions b*page_size ..). A sliding group needs at most the pages that cover the window
plus one step's tokens: a step of T tokens from position P attends from P - window + 1 to
P + T - 1, window + T - 1 positions, which touch at most ceil((window + T - 2) / page_size) + 1
pages. So its pool holds that bound for every sequence, and the full-context pool is the one
`--kv-pages` sizes.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..core.cconst import K_TRANSPOSED_TYPES
from ..core.options import CompileOptions
from ..frontend.architecture import LayerKind
from ..ir.graph import Layer
from ..ir.kv import KVConfig

ALIGN = 64


def align(n: int, a: int = ALIGN) -> int:
    return (n + a - 1) // a * a


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def window_pages(window: int, batch_tokens: int, page_size: int, max_blocks: int) -> int:
    """The most pages of a sliding group one sequence holds at once (the module's proof)."""
    return min(max_blocks, ceil_div(window + batch_tokens - 2, page_size) + 1)


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
    config: KVConfig
    k_row_bytes: int  # one position of one head
    v_row_bytes: int
    max_blocks: int  # block-table entries per sequence and group: ceil(ctx / page_size)
    groups: tuple[KVGroup, ...]
    layers: tuple[KVLayer, ...]

    @property
    def total_bytes(self) -> int:
        return sum(g.pool_bytes for g in self.groups)

    def of(self, layer: int) -> KVLayer:
        """The KV layer of model layer `layer` (a hybrid's recurrent layers have none)."""
        return next(ly for ly in self.layers if ly.layer == layer)

    @property
    def full_context_bytes(self) -> int:
        """n_seq x ctx positions in every layer: what the cache would take without pages or windows."""
        return self.config.n_seq * self.config.ctx * self.page_tokens_bytes

    @property
    def page_tokens_bytes(self) -> int:
        """Bytes one position takes across every layer (all groups)."""
        return len(self.layers) * self.config.n_head_kv * (self.k_row_bytes + self.v_row_bytes)

    @property
    def k_transposed(self) -> bool:
        """K is held transposed in its pages (an f16 or f32 K; runtime_c/constants.h says which)."""
        return bool(K_TRANSPOSED_TYPES >> int(self.config.k_dtype.value) & 1)

    def offset(self, page: int, layer: int, kv: int, head: int, row: int, d: int = 0) -> int:
        """Byte offset of (page, layer, K=0|V=1, kv_head, row in page) in the KV region: of its row, or,
        in a transposed K, of its value d."""
        ly = self.of(layer)
        g = self.groups[ly.group]
        ps, row_bytes = self.config.page_size, self.v_row_bytes if kv else self.k_row_bytes
        head_at = g.pool_offset + page * g.page_bytes + (ly.v_offset if kv else ly.offset) + head * ps * row_bytes
        if not kv and self.k_transposed:
            return head_at + (d * ps + row) * (row_bytes // self.config.head_dim)
        return head_at + row * row_bytes


def plan_kv(config: KVConfig, layers: tuple[Layer, ...], opts: CompileOptions) -> KVPlan:
    """The pools of the layers given: the attention layers (a hybrid's recurrent ones keep a state
    slot instead, state_plan.py)."""
    ps = config.page_size
    k_row, v_row = config.k_dtype.nbytes(config.head_dim), config.v_dtype.nbytes(config.head_dim)
    max_blocks = ceil_div(config.ctx, ps)
    # full-context group first, then sliding groups by window: a fixed order for a fixed layout
    keys = sorted({ly.window for ly in layers}, key=lambda w: (w is not None, w or 0))
    k_bytes, v_bytes = align(config.n_head_kv * ps * k_row), align(config.n_head_kv * ps * v_row)
    kv_layers: list[KVLayer] = []
    groups: list[KVGroup] = []
    pool_offset = 0
    for gi, window in enumerate(keys):
        members = tuple(ly.index for ly in layers if ly.window == window)
        if window is None:
            seq_pages = max_blocks
            n_pages = config.n_seq * max_blocks if opts.kv_pages is None else opts.kv_pages
        else:
            seq_pages = window_pages(window, opts.batch_tokens, ps, max_blocks)
            n_pages = config.n_seq * seq_pages
        kinds = {ly.index: ly.kind for ly in layers}
        for i, il in enumerate(members):
            kv_layers.append(KVLayer(il, kinds[il], window, gi, i * (k_bytes + v_bytes), k_bytes, v_bytes))
        page_bytes = (k_bytes + v_bytes) * len(members)
        groups.append(KVGroup(gi, window, members, page_bytes, n_pages, seq_pages, pool_offset))
        pool_offset += align(n_pages * page_bytes)
    kv_layers.sort(key=lambda ly: ly.layer)
    return KVPlan(config, k_row, v_row, max_blocks, tuple(groups), tuple(kv_layers))
