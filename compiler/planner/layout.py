"""The memory layout of one mode: every buffer with its region, offset, size and live range.

Offsets are relative to their region: weights to the GGUF file (they are mmapped views),
kv to a page of the layer's group (kv_plan.py: pages repeat every page_bytes in the group's
pool), activations to the activation arena.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from ..frontend.spec import HParams, ModelSpec
from ..ir.graph import Graph, Op, ValueKind
from ..core.options import CompileOptions
from ..frontend.architecture import Architecture
from .allocator import allocate, arena_bytes
from .events import events, peak_live_bytes
from .kv_plan import KVPlan, align
from .liveness import lifetimes
from .packed import PackedWeight, packed_bytes, plan_packed


@dataclass(frozen=True)
class Buffer:
    name: str
    region: str  # "weights" | "packed" | "activations" | "kv"
    offset: int
    size: int
    shape: tuple[int, ...]
    dtype: str
    first_op: int
    last_op: int
    note: str = ""


@dataclass(frozen=True)
class LayoutConfig:
    model: str
    arch: str
    mode: str
    n_tokens: int
    ctx: int
    kv_dtype: str  # both parts' type, or "k/v" when they differ
    kv_dtype_k: str
    kv_dtype_v: str
    prefill_chunk: int
    n_seq: int
    page_size: int
    kv_pages: int  # pages of the full-context pool (the sliding pools hold n_seq x their bound)
    batch_tokens: int
    rope_base_local: float | None
    hparams: HParams

    def items(self) -> list[tuple[str, object]]:
        """Flat (key, value) pairs: the options, then the model's hyperparameters."""
        own = [(f.name, getattr(self, f.name)) for f in fields(self) if f.name != "hparams"]
        return own + list(asdict(self.hparams).items())


@dataclass(frozen=True)
class Layout:
    config: LayoutConfig
    n_ops: int
    buffers: tuple[Buffer, ...]
    kv: KVPlan
    weights_bytes: int
    activation_bytes: int
    activation_bytes_without_reuse: int
    activation_peak_live_bytes: int
    packed: tuple[PackedWeight, ...] = ()

    @property
    def packed_bytes(self) -> int:
        return packed_bytes(self.packed)

    def region(self, name: str) -> list[Buffer]:
        return [b for b in self.buffers if b.region == name]


def plan_layout(g: Graph, spec: ModelSpec, arch: Architecture, opts: CompileOptions, kv: KVPlan) -> Layout:
    config = LayoutConfig(
        model=spec.path.name, arch=spec.arch, mode=g.mode.value, n_tokens=g.n_tokens, ctx=opts.ctx,
        kv_dtype=kv.dtype_label, kv_dtype_k=kv.k_dtype.label, kv_dtype_v=kv.v_dtype.label, prefill_chunk=opts.prefill_chunk, n_seq=opts.n_seq,
        page_size=kv.page_size, kv_pages=kv.groups[0].n_pages, batch_tokens=opts.batch_tokens,
        rope_base_local=arch.rope_base_local, hparams=spec.hparams,
    )
    lts = lifetimes(g)
    evs = events(lts)
    placements = allocate(evs)
    packed = plan_packed(g)
    activations = [
        Buffer(p.lifetime.value.name, "activations", p.offset, p.size, p.lifetime.value.shape,
               p.lifetime.value.dtype.label, p.lifetime.first, p.lifetime.last)
        for p in placements
    ]
    return Layout(
        config=config,
        n_ops=len(g.nodes),
        buffers=tuple(_weight_buffers(g) + _packed_buffers(packed) + activations + _kv_buffers(g, kv)),
        kv=kv,
        weights_bytes=spec.weights_bytes,
        activation_bytes=arena_bytes(placements),
        activation_bytes_without_reuse=sum(p.size for p in placements),
        activation_peak_live_bytes=peak_live_bytes(evs, lambda lt: align(lt.value.nbytes)),
        packed=packed,
    )


def _weight_buffers(g: Graph) -> list[Buffer]:
    out = []
    for i, n in enumerate(g.nodes):
        for v in n.inputs:
            if v.kind is ValueKind.WEIGHT:
                t = v.tensor
                note = "" if t.name == v.name else f"view of {t.name}"
                out.append(Buffer(v.name, "weights", t.offset, t.nbytes, t.shape, t.dtype.label, i, i, note))
    return sorted(out, key=lambda b: (b.offset, b.name))


def _packed_buffers(packed: tuple[PackedWeight, ...]) -> list[Buffer]:
    return [Buffer(f"{p.tensor}.x8", "packed", p.offset, p.size, (p.n_out, p.n_in), p.dtype.label, p.first_op,
                   p.first_op, f"rows interleaved by 8, from GGUF offset {p.src:#x}") for p in packed]


def _kv_buffers(g: Graph, kv: KVPlan) -> list[Buffer]:
    writes = {n.layer: i for i, n in enumerate(g.nodes) if n.op in (Op.KV_STORE, Op.KV_BATCH_COPY)}
    reads = {n.layer: i for i, n in enumerate(g.nodes) if n.op is Op.ATTENTION}
    out = []
    for ly in kv.layers:
        g = kv.groups[ly.group]
        shape = (kv.n_head_kv, kv.page_size, kv.head_dim)
        note = f"in each page of group {g.index} ({g.n_pages} pages of {g.page_bytes:,} bytes" + (
            f"; window {ly.window})" if ly.window else ")")
        for part, offset, size, dtype in (("k", ly.offset, ly.k_bytes, kv.k_dtype), ("v", ly.v_offset, ly.v_bytes, kv.v_dtype)):
            out.append(Buffer(f"kv_cache-{ly.layer}.{part}", "kv", offset, size, shape, dtype.label,
                              writes.get(ly.layer, 0), reads.get(ly.layer, 0), note))
    return out
