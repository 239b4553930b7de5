"""One C statement per IR node, from two tables: the C function of each kernel, and the
arguments each op passes. Nothing here knows about a particular model."""
from __future__ import annotations

from dataclasses import dataclass, field
from math import prod
from typing import Callable, Mapping

from ..core.errors import KilnError
from ..ir.graph import Node, Op, Value, ValueKind
from ..passes.kernel_select import X8_KERNELS
from ..frontend.architecture import RopeLayout


class CodegenError(KilnError):
    """The graph needs a kernel the C runtime does not have yet."""


def c_float(x: float) -> str:
    """A float literal that reads back as the same float32."""
    text = f"{x:.9g}"
    return text + ("f" if any(ch in text for ch in ".e") else ".0f")


def c_name(v: Value) -> str:
    return v.name.replace("-", "_").replace(".", "_")


def c_type(v: Value) -> str:
    return f"KILN_{v.dtype.name}"


@dataclass(frozen=True)
class EmitContext:
    """What statements need from the plan beyond their node."""
    packed: Mapping[str, int] = field(default_factory=dict)  # GGUF tensor -> offset of its x8 copy


def weight(v: Value) -> str:
    return f"W({v.tensor.offset:#x})"


def row(v: Value) -> int:
    """Elements per token of an activation [tokens, ...]."""
    return prod(v.shape[1:])


# kernel name (from the kernel-selection pass) -> the runtime function that implements it
def _c_symbols() -> dict[str, str]:
    from ..core.dtypes import KV_DTYPES, RUNTIME_DTYPES

    table = {f"{kind}_{t.label}": fn for t in RUNTIME_DTYPES
             for kind, fn in (("embed", "kiln_embed"), ("matmul", "kiln_matmul"), ("logits", "kiln_matmul"))}
    table |= {k: "kiln_matmul_x8" for k in X8_KERNELS}
    table |= {f"{kind}_{t.label}": fn for t in KV_DTYPES.values()
              for kind, fn in (("kv_store", "kiln_kv_store"), ("kv_batch_copy", "kiln_kv_store"),
                               ("attention_decode", "kiln_attention"), ("attention_prefill", "kiln_attention"))}
    table |= {
        "rms_norm_f32": "kiln_rms_norm",
        "rope_pairwise_f32": "kiln_rope",
        "rope_neox_f32": "kiln_rope",
        "add_f32": "kiln_add",
        "hadamard_f32": "kiln_hadamard",
        "select_rows_f32": "kiln_select_rows",
        "swiglu_f32": "kiln_swiglu",
        "geglu_f32": "kiln_geglu",
    }
    return table


C_SYMBOLS = _c_symbols()


def _embed(n: Node, ctx: EmitContext) -> list[str]:
    ids, table = n.inputs
    return [c_type(table), c_name(n.outputs[0]), weight(table), c_name(ids), "n", str(table.shape[1]),
            c_float(n.attrs.scale)]


def _rms_norm(n: Node, ctx: EmitContext) -> list[str]:
    x, w = n.inputs
    rows = f"n * {row(x) // x.shape[-1]}" if len(x.shape) > 2 else "n"
    return [c_name(n.outputs[0]), c_name(x), f"(const float *){weight(w)}", c_float(n.attrs.weight_offset),
            c_float(n.attrs.eps), str(x.shape[-1]), rows]


def _matmul(n: Node, ctx: EmitContext, rows: str = "n") -> list[str]:
    x, w, *bias = n.inputs
    b = f"(const float *){weight(bias[0])}" if bias else "NULL"
    weights = [f"P({ctx.packed[w.tensor.name]:#x})", weight(w)] if n.kernel in X8_KERNELS else [weight(w)]
    return [c_type(w), *weights, b, str(w.shape[0]), str(w.shape[1]), c_name(x), rows,
            c_name(n.outputs[0]), c_name(n.scratch)]


def _logits(n: Node, ctx: EmitContext) -> list[str]:
    # the selected rows of the normed hidden state, straight into the caller's buffer
    return _matmul(n, ctx, rows="n_logits")


def _select_rows(n: Node, ctx: EmitContext) -> list[str]:
    x, rows = n.inputs
    return [c_name(n.outputs[0]), c_name(x), c_name(rows), "n_logits", str(row(x))]


def _rope(n: Node, ctx: EmitContext) -> list[str]:
    x, pos = n.inputs
    a = n.attrs
    return [c_name(n.outputs[0]), c_name(x), c_name(pos), "n", str(x.shape[1]), str(x.shape[2]), c_float(a.base),
            "1" if a.layout is RopeLayout.NEOX else "0"]


def kv_view(kv: Value) -> str:
    """The layer's view of its pool; it carries the K and V element types."""
    return f"&m->kv_view[{kv.layer}]"


def _kv_store(n: Node, ctx: EmitContext) -> list[str]:
    k, v, seq, pos, kc, _ = n.inputs
    return [kv_view(kc), c_name(k), c_name(v), c_name(seq), c_name(pos), "n", str(k.shape[1]), str(k.shape[2])]


def _attention(n: Node, ctx: EmitContext) -> list[str]:
    q, seq, pos, kc, _ = n.inputs
    a = n.attrs
    spans = n.scratch.shape[0] // (4 * a.n_head * (a.head_dim + 2)) if n.scratch else 0
    return [c_name(n.outputs[0]), c_name(q), c_name(seq), c_name(pos), "n", kv_view(kc), str(a.n_head),
            str(a.n_head_kv), str(a.head_dim), c_float(a.scale), c_name(n.scratch) if n.scratch else "NULL",
            str(spans)]


def _unary(n: Node, ctx: EmitContext) -> list[str]:
    (x,) = n.inputs
    return [c_name(n.outputs[0]), c_name(x), f"n * {row(x)}"]


def _binary(n: Node, ctx: EmitContext) -> list[str]:
    a, b = n.inputs
    return [c_name(n.outputs[0]), c_name(a), c_name(b), f"n * {row(a)}"]


ARGS: dict[Op, Callable[[Node, EmitContext], list[str]]] = {
    Op.EMBED: _embed,
    Op.RMS_NORM: _rms_norm,
    Op.MATMUL: _matmul,
    Op.SELECT_ROWS: _select_rows,
    Op.LOGITS: _logits,
    Op.ROPE: _rope,
    Op.HADAMARD: _unary,
    Op.KV_STORE: _kv_store,
    Op.KV_BATCH_COPY: _kv_store,
    Op.ATTENTION: _attention,
    Op.ADD: _binary,
    Op.GLU: _binary,
}
assert set(ARGS) == set(Op)


# Every runtime function has a threaded twin (`<name>_mt`, kernels_mt.h) that all threads
# call with the same arguments, each doing its share; a barrier follows every op.


def statement(n: Node, ctx: EmitContext = EmitContext()) -> str:
    symbol = C_SYMBOLS.get(n.kernel)
    if symbol is None:
        raise CodegenError(f"kernel '{n.kernel}' (node {n.label}) has no C implementation yet")
    return f"{symbol}_mt(t, {', '.join(ARGS[n.op](n, ctx))});"


def is_arena_value(v: Value) -> bool:
    return v.kind in (ValueKind.ACTIVATION, ValueKind.INPUT)
