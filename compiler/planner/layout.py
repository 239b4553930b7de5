"""The memory layout of the step: every buffer with its region, offset, size and live range.

Offsets are relative to their region: weights to the GGUF file (they are mmapped views),
kv to a page of the layer's group (kv_plan.py: pages repeat every page_bytes in the group's
pool), activations to the activation arena. Live ranges are op indices in the schedule with the
body once (Graph.nodes): a body buffer holds the same bytes in every layer's run.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

from ..frontend.spec import HParams, ModelSpec
from ..ir.graph import Graph, Op, ValueKind
from ..ir.kv import KVConfig
from ..core.options import CompileOptions
from ..frontend.architecture import Architecture, LayerKind
from .allocator import allocate, arena_bytes
from .events import events, peak_live_bytes
from .kv_plan import KVPlan, align, plan_kv
from .liveness import lifetimes
from .packed import PackedWeight, packed_bytes, plan_packed
from .state_plan import StatePlan, plan_state


@dataclass(frozen=True)
class Buffer:
    name: str
    region: str  # "weights" | "packed" | "activations" | "kv" | "state"
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
        return own + self.hparams.items()


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
    sections: tuple[tuple[str, int, int], ...] = ()  # (head | body | tail, first op, last op)
    expert_bytes: int = 0  # the mixture of experts' 3-D tensors, every layer's
    expert_bytes_per_token: int = 0  # of those, what one token's experts read (k of n_expert a layer)
    state: StatePlan | None = None  # the recurrent layers' state slots (a hybrid model), else None

    @property
    def state_bytes(self) -> int:
        return self.state.total_bytes if self.state else 0

    @property
    def packed_bytes(self) -> int:
        return packed_bytes(self.packed)

    def region(self, name: str) -> list[Buffer]:
        return [b for b in self.buffers if b.region == name]


def plan_layout(g: Graph, spec: ModelSpec, arch: Architecture, opts: CompileOptions, kv_config: KVConfig) -> Layout:
    hp = spec.hparams
    kv = plan_kv(kv_config, tuple(ly for ly in g.layers if ly.kind is not LayerKind.RECURRENT), opts,
                 lambda il: (hp.for_layer(il).n_head_kv, hp.for_layer(il).head_dim))
    state = plan_state(spec.hparams.ssm, g.layers, opts.n_seq)
    config = LayoutConfig(
        model=spec.path.name, arch=spec.arch, ctx=opts.ctx, kv_dtype=kv_config.dtype_label,
        kv_dtype_k=kv_config.k_dtype.label, kv_dtype_v=kv_config.v_dtype.label, prefill_chunk=opts.prefill_chunk,
        n_seq=opts.n_seq, page_size=kv_config.page_size, kv_pages=kv.groups[0].n_pages, batch_tokens=opts.batch_tokens,
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
        buffers=tuple(_weight_buffers(g) + _packed_buffers(packed) + activations + _kv_buffers(g, kv)
                      + _state_buffers(g, state)),
        kv=kv,
        state=state,
        weights_bytes=spec.weights_bytes,
        activation_bytes=arena_bytes(placements),
        activation_bytes_without_reuse=sum(p.size for p in placements),
        activation_peak_live_bytes=peak_live_bytes(evs, lambda lt: align(lt.value.nbytes)),
        packed=packed,
        sections=_sections(g),
        **_expert_bytes(g),
    )


def _expert_bytes(g: Graph) -> dict:
    """The experts' bytes, all and a decode token's: k of n_expert slices of each expert tensor."""
    total = active = 0
    for section, nodes in g.sections():
        for n in (n for n in nodes if n.op is Op.MOE_FFN):
            for v in n.inputs[3:]:  # each layer's experts in the body it runs
                size = sum(ly.weights[v.name].nbytes for ly in g.layers_of(section))
                total, active = total + size, active + size // n.attrs.n_expert * n.attrs.n_used
    return {"expert_bytes": total, "expert_bytes_per_token": active}


def _sections(g: Graph) -> tuple[tuple[str, int, int], ...]:
    out, first = [], 0
    for section, nodes in g.sections():
        n_layers = len(g.layers_of(section))
        name = f"{section} x {n_layers} layers" if g.is_body(section) else section
        out.append((name, first, first + len(nodes) - 1))
        first += len(nodes)
    return tuple(out)


def _weight_buffers(g: Graph) -> list[Buffer]:
    out = []
    ops = [(section, n) for section, nodes in g.sections() for n in nodes]
    for i, (section, n) in enumerate(ops):
        for v in n.inputs:
            if v.kind is not ValueKind.WEIGHT:
                continue
            # a role shared by both bodies of a hybrid (attn_norm) is each layer's tensor in its own body
            tensors = [v.tensor] if v.tensor is not None else [ly.weights[v.name] for ly in g.layers_of(section)]
            for t in tensors:
                note = f"view of {t.name}" if v.tensor is not None and t.name != v.name else ""
                if n.op is Op.MOE_FFN:
                    note = f"{t.shape[0]} experts of {t.nbytes // t.shape[0]:,} bytes, {n.attrs.n_used} read a token"
                out.append(Buffer(v.name if v.tensor is not None else t.name, "weights", t.offset, t.nbytes, t.shape,
                                  t.dtype.label, i, i, note))
    return sorted(out, key=lambda b: (b.offset, b.name))


def _packed_buffers(packed: tuple[PackedWeight, ...]) -> list[Buffer]:
    return [Buffer(f"{p.tensor}.x8", "packed", p.offset, p.size, (*((p.experts,) if p.experts else ()), p.n_out, p.n_in),
                   p.dtype.label, p.first_op, p.first_op, f"rows interleaved by 8, from GGUF offset {p.src:#x}"
                   + (f"; each expert's {p.size // p.experts:,} bytes on their own" if p.experts else ""))
            for p in packed]


def _state_buffers(g: Graph, state: StatePlan | None) -> list[Buffer]:
    """Each recurrent layer's conv window and delta-rule matrices in slot 0 (slot s: + s * slot_bytes)."""
    if state is None:
        return []
    first = {n.op: i for i, n in reversed(list(enumerate(g.nodes))) if n.op in (Op.SSM_CONV, Op.DELTA_NET)}
    ssm, out = state.ssm, []
    note = f"in each of {state.n_seq} slots of {state.slot_bytes:,} bytes, one a sequence"
    for s in state.layers:
        out.append(Buffer(f"conv_state-{s.layer}", "state", s.conv_offset, s.conv_bytes,
                          (ssm.d_conv - 1, ssm.conv_dim), "f32", first[Op.SSM_CONV], first[Op.SSM_CONV], note))
        out.append(Buffer(f"delta_state-{s.layer}", "state", s.delta_offset, s.delta_bytes,
                          (ssm.n_v_heads, ssm.d_state, ssm.d_state), "f32", first[Op.DELTA_NET], first[Op.DELTA_NET],
                          note))
    return out


def _kv_buffers(g: Graph, kv: KVPlan) -> list[Buffer]:
    write = next(i for i, n in enumerate(g.nodes) if n.op is Op.KV_STORE)
    read = next(i for i, n in enumerate(g.nodes) if n.op is Op.ATTENTION)
    c = kv.config
    out = []
    for ly in (ly for ly in kv.layers if not ly.shared):  # a layer that reads another's rows has none
        grp = kv.groups[ly.group]
        shape = (ly.n_head_kv, c.page_size, ly.head_dim)
        note = f"in each page of group {grp.index} ({grp.n_pages} pages of {grp.page_bytes:,} bytes" + (
            f"; window {ly.window})" if ly.window else ")")
        for part, offset, size, dtype in (("k", ly.offset, ly.k_bytes, c.k_dtype), ("v", ly.v_offset, ly.v_bytes, c.v_dtype)):
            out.append(Buffer(f"kv_cache-{ly.layer}.{part}", "kv", offset, size, shape, dtype.label, write, read, note))
    return out
