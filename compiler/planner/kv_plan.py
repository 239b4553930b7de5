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

Layer kinds may differ in head width and KV heads (Gemma 4): each layer's rows have its own
bytes. A layer that keeps no KV of its own (Gemma 4's last attention.shared_kv_layers) owns no
bytes of a page: it reads the rows of the layer it shares them with (KVLayer.source), at that
layer's offsets.

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
    n_head_kv: int = 0
    head_dim: int = 0
    k_row: int = 0  # bytes of one position of one head
    v_row: int = 0
    source: int | None = None  # the layer whose rows it reads, where it keeps none of its own

    @property
    def v_offset(self) -> int:
        return self.offset + self.k_bytes

    @property
    def page_bytes(self) -> int:
        """What it adds to each page of its group (nothing, where it reads another layer's rows)."""
        return 0 if self.shared else self.k_bytes + self.v_bytes

    @property
    def shared(self) -> bool:
        return self.source is not None and self.source != self.layer


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
        """n_seq x ctx positions in every layer: what the cache would take without pages, windows or
        shared layers."""
        return self.config.n_seq * self.config.ctx * sum(ly.n_head_kv * (ly.k_row + ly.v_row) for ly in self.layers)

    @property
    def page_tokens_bytes(self) -> int:
        """Bytes one position takes across every layer that keeps KV (all groups)."""
        return sum(ly.n_head_kv * (ly.k_row + ly.v_row) for ly in self.layers if not ly.shared)

    @property
    def shared_saved_bytes(self) -> int:
        """The pool bytes the layers that read another's KV would have taken with their own."""
        return sum(self.groups[ly.group].n_pages * (ly.k_bytes + ly.v_bytes) for ly in self.layers if ly.shared)

    @property
    def k_transposed(self) -> bool:
        """K is held transposed in its pages (an f16 or f32 K; runtime_c/constants.h says which)."""
        return bool(K_TRANSPOSED_TYPES >> int(self.config.k_dtype.value) & 1)

    def offset(self, page: int, layer: int, kv: int, head: int, row: int, d: int = 0) -> int:
        """Byte offset of (page, layer, K=0|V=1, kv_head, row in page) in the KV region: of its row, or,
        in a transposed K, of its value d."""
        ly = self.of(layer)
        g = self.groups[ly.group]
        ps, row_bytes = self.config.page_size, ly.v_row if kv else ly.k_row
        head_at = g.pool_offset + page * g.page_bytes + (ly.v_offset if kv else ly.offset) + head * ps * row_bytes
        if not kv and self.k_transposed:
            return head_at + (d * ps + row) * (row_bytes // ly.head_dim)
        return head_at + row * row_bytes


def plan_kv(config: KVConfig, layers: tuple[Layer, ...], opts: CompileOptions,
            geometry=lambda il: None) -> KVPlan:
    """The pools of the layers given: the attention layers (a hybrid's recurrent ones keep a state
    slot instead, state_plan.py). geometry(il): layer il's (n_head_kv, head_dim), where the layers
    differ (else the config's)."""
    ps = config.page_size
    max_blocks = ceil_div(config.ctx, ps)
    # full-context group first, then sliding groups by window: a fixed order for a fixed layout. A
    # bidirectional model's pool lives for one step, which reads each input whole: one group, and a
    # sliding layer's window is attention's mask (symmetric, kiln_layer_desc.symmetric_window)
    pool_window = (lambda ly: ly.window) if config.causal else (lambda ly: None)
    keys = sorted({pool_window(ly) for ly in layers}, key=lambda w: (w is not None, w or 0))
    kv_layers: dict[int, KVLayer] = {}
    groups: list[KVGroup] = []
    pool_offset = 0
    for gi, window in enumerate(keys):
        members = tuple(ly for ly in layers if pool_window(ly) == window and ly.kv_source in (None, ly.index))
        if window is None:
            seq_pages = max_blocks
            n_pages = config.n_seq * max_blocks if opts.kv_pages is None else opts.kv_pages
        else:
            seq_pages = window_pages(window, opts.batch_tokens, ps, max_blocks)
            n_pages = config.n_seq * seq_pages
        at = 0
        for ly in members:
            n_kv, hd = geometry(ly.index) or (config.n_head_kv, config.head_dim)
            k_row, v_row = config.k_dtype.nbytes(hd), config.v_dtype.nbytes(hd)
            k_bytes, v_bytes = align(n_kv * ps * k_row), align(n_kv * ps * v_row)
            kv_layers[ly.index] = KVLayer(ly.index, ly.kind, window, gi, at, k_bytes, v_bytes, n_kv, hd, k_row, v_row)
            at += k_bytes + v_bytes
        groups.append(KVGroup(gi, window, tuple(ly.index for ly in members), at, n_pages, seq_pages, pool_offset))
        pool_offset += align(n_pages * at)
    for ly in layers:  # the layers that read another's rows: its place, and the layer they read
        if ly.index not in kv_layers:
            src = kv_layers[ly.kv_source]
            kv_layers[ly.index] = KVLayer(ly.index, ly.kind, src.window, src.group, src.offset, src.k_bytes,
                                          src.v_bytes, src.n_head_kv, src.head_dim, src.k_row, src.v_row, src.layer)
    out = tuple(sorted(kv_layers.values(), key=lambda ly: ly.layer))
    first = out[0]
    return KVPlan(config, first.k_row, first.v_row, max_blocks, tuple(groups), out)
