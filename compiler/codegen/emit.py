"""One C statement per IR node, from one table: the arguments each runtime function takes, keyed
by the function the kernel-selection pass chose. Nothing here knows a particular model.

Inside the layer loop a weight is `&L->attn_q` (layer_weights, named by role), outside it
`&w->output` (named after its tensor); the layer's own numbers come from LAYERS[l].
"""
from __future__ import annotations

from math import prod
from typing import Callable

from ..core.cconst import ATTN_SPAN_STATE
from ..core.errors import KilnError
from ..frontend.architecture import RopeLayout
from ..ir.graph import Node, Op, Value, ValueKind, moe_weights


class CodegenError(KilnError):
    """The graph needs a runtime function the code generator has no arguments for, or the layout
    would let two ops without a barrier between them race."""


def c_float(x: float) -> str:
    """A float literal that reads back as the same float32."""
    text = f"{x:.9g}"
    return text + ("f" if any(ch in text for ch in ".e") else ".0f")


def c_name(v: Value) -> str:
    return v.name.replace("-", "_").replace(".", "_")


def weight_field(v: Value) -> str:
    """A weight's field in the weights structs: its role in a layer, or its tensor's name."""
    return v.name if v.tensor is None else v.name.removesuffix(".weight").replace(".", "_")


def weight(v: Value) -> str:
    """A weight as the kernels take it: the struct (type, rows, packed copy)."""
    return f"&L->{weight_field(v)}" if v.tensor is None else f"&w->{weight_field(v)}"


def floats(v: Value) -> str:
    """An f32 weight vector (a norm's scale, a bias) as a plain pointer."""
    return f"(const float *){weight(v)[1:]}.data"


def row(v: Value) -> int:
    """Elements per row of an activation [rows, ...]."""
    return prod(v.shape[1:])


def _embed(n: Node) -> list[str]:
    ids, table = n.inputs
    return [c_name(n.outputs[0]), weight(table), c_name(ids), "n", str(table.shape[1]), c_float(n.attrs.scale)]


def _rms_norm(n: Node) -> list[str]:
    """Runs of the weight's length: each head, or (OLMoE's q/k norms) a whole row; without a weight,
    of the last axis (each head)."""
    x, *w = n.inputs
    span = w[0].shape[0] if w else x.shape[-1]
    runs = row(x) // span
    return [c_name(n.outputs[0]), c_name(x), floats(w[0]) if w else "NULL", c_float(n.attrs.weight_offset),
            c_float(n.attrs.eps), str(span), f"n * {runs}" if len(x.shape) > 2 else "n"]


def _layer_norm(n: Node) -> list[str]:
    x, w, b = n.inputs
    return [c_name(n.outputs[0]), c_name(x), floats(w), floats(b), c_float(n.attrs.eps), str(x.shape[-1]), "n"]


def _matmul(n: Node) -> list[str]:
    x, w, *bias = n.inputs
    rows = "n_logits" if n.outputs[0].kind is ValueKind.OUTPUT else "n"
    run_at, run_rows = (n.attrs.run_at, n.attrs.run_rows) if n.op is Op.MATMUL and n.attrs.run_rows else (0, w.shape[0])
    return [weight(w), floats(bias[0]) if bias else "NULL", str(w.shape[0]), str(w.shape[1]), c_name(x), rows,
            c_name(n.outputs[0]), c_name(n.scratch), str(run_at), str(run_rows)]


def _select_rows(n: Node) -> list[str]:
    x, rows = n.inputs
    return [c_name(n.outputs[0]), c_name(x), c_name(rows), "n_logits", str(row(x))]


def _rope(n: Node) -> list[str]:
    """Rotated by its layer's part of the step's rope table (passes/rope_table.py)."""
    x, table = n.inputs
    neox = "1" if n.attrs.layout is RopeLayout.NEOX else "0"
    return [c_name(n.outputs[0]), c_name(x), f"kiln_rope_cs({c_name(table)}, ROPE_TABLES, LAYERS[l].rope_table)",
            str(table.shape[1]), "n", str(x.shape[1]), str(x.shape[2]), str(n.attrs.n_rot), neox]


def _rope_table(n: Node) -> list[str]:
    pos, *factors = n.inputs
    (table,), a = n.outputs, n.attrs
    scaling = "&ROPE_SCALING" if rope_scaled(a) else "NULL"
    return [c_name(table), str(table.shape[1]), c_name(pos), "n", "ROPE_TABLES", str(len(a.rotations)), scaling,
            floats(factors[0]) if factors else "NULL"]


def rope_scaled(a) -> bool:
    """Whether the ropes take ROPE_SCALING (their scaling, or frequency factors), or none (unscaled)."""
    return a.scaling.scaled or any(r.factors for r in a.rotations)


def _kv_store(n: Node) -> list[str]:
    k, v, seq, pos, _, _ = n.inputs
    return ["&s->kv_view[l]", c_name(k), c_name(v), c_name(seq), c_name(pos), "n", str(k.shape[1]), str(k.shape[2])]


def _attention(n: Node) -> list[str]:
    q, seq, row, seen = n.inputs[:4]
    a = n.attrs
    spans = n.scratch.shape[0] // (4 * a.n_head * (a.head_dim + ATTN_SPAN_STATE)) if n.scratch else 0
    return [c_name(n.outputs[0]), c_name(q), c_name(seq), c_name(row), c_name(seen), "n", "&s->kv_view[l]",
            str(a.n_head),
            str(a.n_head_kv), str(a.head_dim), c_float(a.scale), c_name(n.scratch) if n.scratch else "NULL",
            str(spans)]


def _attention_ext(n: Node) -> list[str]:
    sinks = floats(n.inputs[6]) if len(n.inputs) > 6 else "NULL"
    args = _attention(n)
    return args[:11] + [c_float(n.attrs.softcap), sinks, c_float(n.attrs.alibi)] + args[11:]


def _moe_route(n: Node) -> list[str]:
    (logits,), (ids, weights) = n.inputs, n.outputs
    a = n.attrs
    return [c_name(ids), c_name(weights), c_name(logits), "n", str(a.n_expert), str(a.n_used), str(int(a.normalize)),
            str(int(a.softmax_weight))]


def _moe_ffn(n: Node) -> list[str]:
    x, ids, weights = n.inputs[:3]
    a, w = n.attrs, moe_weights(n)
    fused = "gate_up" in w
    gate, up = (w["gate_up"],) * 2 if fused else (w.get("gate"), w["up"])  # no gate: a plain GELU expert
    extra = [floats(w[p]) if p in w else "NULL" for p in ("gate_b", "up_b", "down_b", "down_scale")]
    return [c_name(n.outputs[0]), c_name(x), c_name(ids), c_name(weights), weight(gate) if gate else "NULL", weight(up),
            weight(w["down"]),
            f"&(kiln_moe_extra){{{', '.join(extra)}, KILN_ACT_{a.activation.name}, {int(fused)}}}", "n",
            str(a.n_expert), str(a.n_used), str(w["down"].shape[2]), str(x.shape[1]), c_name(n.scratch)]


def _state(part: str) -> str:
    """The layer's part of slot 0 of the recurrent state pool (sequence s's: + s * slot_floats)."""
    return f"(float *)(s->state + LAYERS[l].{part}_off)"


def _ssm_conv(n: Node) -> list[str]:
    x, w, seq, row, _ = n.inputs
    return [c_name(n.outputs[0]), c_name(x), floats(w), c_name(seq), c_name(row), "n", str(x.shape[1]),
            str(n.attrs.taps), _state("conv"), "s->slot_floats"]


def _delta_net(n: Node) -> list[str]:
    x, alpha, beta, dt, decay, seq, row, _ = n.inputs
    a = n.attrs
    return [c_name(n.outputs[0]), c_name(x), c_name(alpha), c_name(beta), floats(dt), floats(decay), c_name(seq),
            c_name(row), "n", str(a.n_k_heads), str(a.n_v_heads), str(int(a.interleaved)), str(a.d_state),
            c_float(a.eps), _state("delta"), "s->slot_floats"]


def _regroup(n: Node) -> list[list[str]]:
    """One copy per (output, part): the part of every group to its columns of the output."""
    a, (x,) = n.attrs, n.inputs
    starts = [sum(a.parts[:p]) for p in range(len(a.parts))]
    calls = []
    for out, parts in zip(n.outputs, a.outputs):
        at = 0
        for p in parts:
            calls.append([c_name(out), str(row(out)), str(at), c_name(x), "n", str(a.groups), str(sum(a.parts)),
                          str(starts[p]), str(a.parts[p])])
            at += a.groups * a.parts[p]
    return calls


def _count(v: Value) -> str:
    """Elements of an activation, or of the logits rows asked for."""
    return f"{'n_logits' if v.kind is ValueKind.OUTPUT else 'n'} * {row(v)}"


def _unary(n: Node) -> list[str]:
    (x,) = n.inputs
    return [c_name(n.outputs[0]), c_name(x), f"n * {row(x)}"]


def _scaled(n: Node) -> list[str]:
    x, *w = n.inputs
    by = f"*{floats(w[0])}" if w else c_float(n.attrs.scale if n.op is Op.SCALE else n.attrs.cap)
    return [c_name(n.outputs[0]), c_name(x), _count(x), by]


def _binary(n: Node) -> list[str]:
    a, b = n.inputs
    return [c_name(n.outputs[0]), c_name(a), c_name(b), f"n * {row(a)}"]


# runtime function -> its arguments after the thread (its _mt twin in kernels_mt.h)
ARGS: dict[str, Callable[[Node], list[str]]] = {
    "kiln_embed": _embed,
    "kiln_rms_norm": _rms_norm,
    "kiln_matmul": _matmul,
    "kiln_matmul_quantized": _matmul,
    "kiln_select_rows": _select_rows,
    "kiln_rope_rotate": _rope,
    "kiln_rope_table": _rope_table,
    "kiln_hadamard": _unary,
    "kiln_kv_store": _kv_store,
    "kiln_attention": _attention,
    "kiln_attention_ext": _attention_ext,
    "kiln_add": _binary,
    "kiln_swiglu": _binary,
    "kiln_geglu": _binary,
    "kiln_geglu_erf": _binary,
    "kiln_scale": _scaled,
    "kiln_scale_row": lambda n: [c_name(n.outputs[0]), c_name(n.inputs[0]), "n", str(n.inputs[0].shape[-1]),
                                 floats(n.inputs[1])],
    "kiln_softcap": _scaled,
    "kiln_moe_route": _moe_route,
    "kiln_moe_ffn": _moe_ffn,
    "kiln_sigmoid_gate": _binary,
    "kiln_sigmoid_row_gate": lambda n: [c_name(n.outputs[0]), c_name(n.inputs[0]), c_name(n.inputs[1]), "n",
                                        str(row(n.inputs[1]))],
    "kiln_regroup": _regroup,
    "kiln_ssm_conv": _ssm_conv,
    "kiln_delta_net": _delta_net,
    "kiln_layer_norm": _layer_norm,
    "kiln_gelu": _unary,
    "kiln_add_row": lambda n: [c_name(n.outputs[0]), c_name(n.inputs[0]), "n", str(n.inputs[0].shape[-1]),
                               floats(n.inputs[1])],
    # the running layer's [rows, width] part of a [rows, n_layer, width] state
    "kiln_layer_slice": lambda n: [c_name(n.outputs[0]), c_name(n.inputs[0]), "n", str(n.inputs[0].shape[2]),
                                   str(n.inputs[0].shape[1]), "l"],
}


def statement(n: Node) -> str:
    args = ARGS.get(n.kernel)
    if args is None:
        raise CodegenError(f"node {n.name} runs '{n.kernel}', which the code generator has no arguments for")
    calls = args(n)  # one call, or several that write apart (a regroup's parts)
    return " ".join(f"{n.kernel}_mt(t, {', '.join(c)});" for c in (calls if isinstance(calls[0], list) else [calls]))
