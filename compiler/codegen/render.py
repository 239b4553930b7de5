"""Render the planned step graph into model.c with jinja2 (c_templates/model.c.j2).

model.c holds what is particular to one model: its numbers, where each weight lies, its layer
table, and the step (head, a loop over the layers running the body, tail). The API it serves is
the runtime's (runtime_c/model.h, instance.c).
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import jinja2

from ..core.dtypes import DType
from ..core.version import __version__
from ..planner.plan import Planned
from ..ir.graph import Node, Value, ValueKind, scratch_from
from ..passes.kernel_select import BY_FUNCTION
from ..passes.rope_table import table_node
from .emit import ARGS, CodegenError, c_float, c_name, rope_scaled, statement, weight_field

assert set(ARGS) == set(BY_FUNCTION), "every runtime function the kernel table names has its arguments"

_ENV = jinja2.Environment(loader=jinja2.FileSystemLoader(Path(__file__).parent / "c_templates"),
                          keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True,
                          undefined=jinja2.StrictUndefined)

_C_TYPE = {DType.F32: "float", DType.I32: "int32_t", DType.I8: "void"}


def _shape(v: Value) -> str:
    if len(v.shape) == 1 and v.dtype is DType.I8:
        return f"[{v.shape[0]} bytes]"
    return "[" + " x ".join(["n", *map(str, v.shape[1:])]) + "]"


def _node_lines(n: Node, index: int, offsets: dict[str, int], indent: str, then: Node | None) -> list[str]:
    lines = [f"{indent}/* {n.name}: {n.op.value} */"]
    own_scratch = [n.scratch] if n.scratch and scratch_from(n) is None else []  # a shared one is declared once
    for v in [v for v in n.outputs if v.kind is ValueKind.ACTIVATION] + own_scratch:
        ctype = _C_TYPE[v.dtype]
        cast = "" if ctype == "void" else f"({ctype} *)"
        lines.append(f"{indent}{ctype} *{c_name(v)} = {cast}A({offsets[v.name]:#x}); /* {_shape(v)} */")
    lines.append(f"{indent}{statement(n)}")
    # a matmul sharing this one's quantized rows (or its run's) may start before this one ends
    lines.append(f"{indent}{'OP_NEXT' if then is not None and scratch_from(then) else 'OP_DONE'}({index});")
    return lines


def _arena_values(n: Node) -> tuple[list[Value], list[Value]]:
    """The arena values n reads and those it writes."""
    reads = [v for v in n.inputs if v.kind is ValueKind.ACTIVATION] + ([n.scratch] if scratch_from(n) else [])
    writes = [v for v in n.outputs if v.kind is ValueKind.ACTIVATION] + ([n.scratch] if n.scratch and not
                                                                          scratch_from(n) else [])
    return reads, writes


def _check_unfenced(n: Node, then: Node, spans: dict[str, range]) -> None:
    """Two ops with no barrier between them run at once on different threads: neither may write
    arena bytes the other reads or writes."""
    (r1, w1), (r2, w2) = _arena_values(n), _arena_values(then)
    for a, b in [(x, y) for x in w1 for y in r2 + w2] + [(x, y) for x in w2 for y in r1]:
        sa, sb = spans[a.name], spans[b.name]
        if a.name != b.name and sa.start < sb.stop and sb.start < sa.stop:
            raise CodegenError(f"{n.name} and {then.name} run without a barrier, but {a.name} and {b.name} share "
                               f"arena bytes [{max(sa.start, sb.start):#x}, {min(sa.stop, sb.stop):#x})")


def _weight_at(t, packed: dict[str, int]) -> tuple[str, str, str]:
    at = packed.get(t.name)
    return f"KILN_{t.dtype.name}", f"{t.offset:#x}", "KILN_NOT_PACKED" if at is None else f"{at:#x}"


def generate(p: Planned) -> str:
    g, spec, opts, lay, kv = p.graph, p.spec, p.options, p.layout, p.layout.kv
    offsets = {b.name: b.offset for b in lay.region("activations")}
    spans = {b.name: range(b.offset, b.offset + b.size) for b in lay.region("activations")}
    for _, nodes in g.sections():  # a run of ops without barriers between them: each pair at once
        run: list[Node] = []
        for n in nodes:
            run = [*run, n] if scratch_from(n) else [n]
            for other in run[:-1]:
                _check_unfenced(other, n, spans)
    packed = {pw.tensor: pw.offset for pw in lay.packed}
    schedule = iter(range(len(g.nodes)))
    # a body's lines sit in the layer loop, and in a switch on the layer's body where there are several
    indent = {s: " " * (4 if not g.is_body(s) else 8 if len(g.bodies) == 1 else 12) for s, _ in g.sections()}
    sections = {s: [line for n, then in zip(nodes, (*nodes[1:], None))
                    for line in _node_lines(n, next(schedule), offsets, indent[s], then)]
                for s, nodes in g.sections()}
    # the layer struct's fields: every role of every body (a layer of another body leaves its own empty)
    roles = list({v.name: v for n in g.body_nodes for v in n.inputs if v.kind is ValueKind.WEIGHT}.values())
    outer = [v for n in g.head + g.tail for v in n.inputs if v.kind is ValueKind.WEIGHT]
    layer_at = [[(weight_field(v), *(_weight_at(ly.weights[v.name], packed) if v.name in ly.weights else _ABSENT))
                 for v in roles] for ly in g.layers]
    model_at = [(weight_field(v), *_weight_at(v.tensor, packed)) for v in outer]
    ctx = {
        "model": spec.path.name, "arch": spec.arch, "version": __version__,
        "ctx": opts.ctx, "kv_dtype": kv.config.dtype_label, "chunk": opts.prefill_chunk, "n_seq": opts.n_seq,
        "page_size": kv.config.page_size, "batch_tokens": opts.batch_tokens, "n_layer": len(g.layers),
        "n_vocab": spec.hparams.n_vocab, "n_out": g.outputs[0].shape[1],
        "seen": any(v.name == "inp_seen" for v in g.inputs), "n_head_kv": kv.config.n_head_kv, "head_dim": kv.config.head_dim,
        "file_size": spec.file_size, "header_bytes": spec.data_offset,
        "header_crc32": spec.header_crc32,
        "packed_bytes": lay.packed_bytes, "arena_bytes": lay.activation_bytes, "n_ops": len(g.nodes),
        "kv_type_k": f"KILN_{kv.config.k_dtype.name}", "kv_type_v": f"KILN_{kv.config.v_dtype.name}",
        "k_hadamard": int(kv.config.k_hadamard), "rope_neox": int(p.arch.rope_layout.value == "neox"),
        "groups": [{"window": grp.window or 0, "n_pages": grp.n_pages, "page_bytes": grp.page_bytes}
                   for grp in kv.groups],
        "layers": [_layer_desc(g, ly, kv, lay.state) for ly in g.layers],
        "bodies": [{"name": b.name, "lines": sections[b.name],
                    "layers": ", ".join(str(ly.index) for ly in g.layers_of(b.name))} for b in g.bodies],
        "state_slot_bytes": lay.state.slot_bytes if lay.state else 0,
        "roles": [(weight_field(v), " x ".join(map(str, v.shape))) for v in roles],
        "outer": [(weight_field(v), " x ".join(map(str, v.shape)), _view_note(v)) for v in outer],
        "layer_at": layer_at, "model_at": model_at,
        "state": [(c_name(v), f"{offsets[v.name]:#x}", _shape(v), _STATE_NOTE.get(v.name, _STATE_NOTE["x"]))
                  for v in g.state],
        "head": sections["head"], "tail": sections["tail"], "recurrent": bool(g.recurrent),
        **_rope_scaling(g),
    }
    return _ENV.get_template("model.c.j2").render(ctx)


# what each state value is, beside its declaration in the step
_STATE_NOTE = {"x": "the residual stream, which every layer adds into",
               "inp_per_layer": "each row's per-layer embeddings, which the head writes and each layer reads its part of",
               "rope_table": "each row's rope rotations (cos, sin), which the head writes and each layer's ropes read"}

_ABSENT = ("KILN_F32", "0x0", "KILN_NOT_PACKED")  # a role of the other kind's body: never read


def _layer_desc(g, ly, kv, state) -> dict:
    """A layer's row of LAYERS: its place in its group's KV pages, or (recurrent) in a state slot."""
    st = state.of(ly.index) if state else None
    body = [b.name for b in g.bodies].index(ly.body) if len(g.bodies) > 1 else None
    if st is not None:
        return {"group": -1, "k": "0", "v": "0", "rope_base": c_float(0.0), "recurrent": 1, "body": body, "extra": "",
                "conv": f"{st.conv_offset:#x}", "delta": f"{st.delta_offset:#x}", "kind": ly.kind.value, "window": None}
    kl = kv.of(ly.index)
    return {"group": kl.group, "k": f"{kl.offset:#x}", "v": f"{kl.v_offset:#x}", "recurrent": 0, "conv": "0",
            "delta": "0", "rope_base": c_float(ly.rope_base if _rotates_keys(g) else 0.0), "kind": ly.kind.value,
            "window": ly.window, "body": body, "extra": _layer_extra(g, ly, kl, kv)}


def _layer_extra(g, ly, kl, kv) -> str:
    """What a layer's row says where layer kinds differ (Gemma 4): its heads, its rope's rotated dims
    and factors, its part of the rope table, whether it reads another layer's rows (designated
    fields; 0: the model's)."""
    rope = next((n for n in dict(g.sections())[ly.body] if n.op.value == "rope"), None)
    table = table_node(g)
    rotation = table.attrs.layers[ly.index] if table is not None else -1
    out = []
    if (kl.n_head_kv, kl.head_dim) != (kv.config.n_head_kv, kv.config.head_dim):
        out += [f".n_head_kv = {kl.n_head_kv}", f".head_dim = {kl.head_dim}"]
    if rope is not None and rope.attrs.n_rot != kl.head_dim:
        out.append(f".n_rot = {rope.attrs.n_rot}")
    if rotation >= 0 and not table.attrs.rotations[rotation].factors and _factors(g):
        out.append(".no_factors = 1")
    if rope is not None and rotation != 0:
        out.append(f".rope_table = {rotation}")
    if kl.shared:
        out.append(f".shared = 1 /* reads layer {kl.source}'s rows */")
    if ly.window and not kv.config.causal:
        out.append(f".symmetric_window = {ly.window}")
    return "".join(", " + x for x in out)


def _factors(g) -> list:
    """The rope factors' tensor, where the rope table reads it."""
    table = table_node(g)
    return [v.tensor for v in table.inputs[1:]] if table is not None else []


def _rope_scaling(g) -> dict:
    """The ropes' one set of parameters (ROPE_SCALING, where they are scaled or take frequency factors),
    their table's rotations (ROPE_TABLES), and where their factors lie for a shift."""
    table = table_node(g)
    if table is None:
        return {"rope_scaling": None, "rope_factors_at": "0", "rope_tables": []}
    a, factors = table.attrs, _factors(g)
    tables = [{"base": c_float(r.base), "n_rot": r.n_rot, "factors": int(r.factors), "at": r.at} for r in a.rotations]
    if not rope_scaled(a):
        return {"rope_scaling": None, "rope_factors_at": "0", "rope_tables": tables}
    s = a.scaling
    return {"rope_scaling": {"freq_scale": c_float(s.freq_scale), "ext_factor": c_float(s.ext_factor),
                             "mscale": c_float(s.mscale), "beta_fast": c_float(s.beta_fast),
                             "beta_slow": c_float(s.beta_slow), "n_ctx_orig": s.n_ctx_orig,
                             "factors": factors[0].name if factors else None},
            "rope_factors_at": f"{factors[0].offset:#x}" if factors else "0", "rope_tables": tables}


def _rotates_keys(g) -> bool:
    return any(n.op.value == "rope" for n in g.body_nodes)


def _view_note(v: Value) -> str:
    return f": {v.tensor.name}'s rows (tied)" if v.tensor.name != v.name else ""
