"""Pick the C kernel of every node from one table keyed by (op, variant, operand dtype).

The operand dtype is that of the node's weight or KV input when it has one (that is what
the kernel must decode), else that of its first input. The variant distinguishes ops whose
math differs by an attribute (rope layout, GLU activation) or by mode (attention).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Callable

from ..core.dtypes import KV_DTYPES, WEIGHT_DTYPES, X8_DTYPES, DType
from ..core.errors import GraphError
from ..ir.graph import Graph, Mode, Node, Op, ValueKind

KernelKey = tuple[Op, str, DType]

_KV = tuple(KV_DTYPES.values())

KERNELS: dict[KernelKey, str] = {
    **{(Op.EMBED, "", t): f"embed_{t.label}" for t in WEIGHT_DTYPES},
    **{(Op.MATMUL, "", t): f"matmul_{t.label}" for t in WEIGHT_DTYPES},
    **{(Op.LOGITS, "", t): f"logits_{t.label}" for t in WEIGHT_DTYPES},
    **{(op, "x8", t): f"{op.value}_x8_{t.label}" for op in (Op.MATMUL, Op.LOGITS) for t in X8_DTYPES},
    (Op.RMS_NORM, "", DType.F32): "rms_norm_f32",
    (Op.ROPE, "pairwise", DType.F32): "rope_pairwise_f32",
    (Op.ROPE, "neox", DType.F32): "rope_neox_f32",
    (Op.HADAMARD, "", DType.F32): "hadamard_f32",
    **{(Op.KV_STORE, "", t): f"kv_store_{t.label}" for t in _KV},
    **{(Op.KV_BATCH_COPY, "", t): f"kv_batch_copy_{t.label}" for t in _KV},
    **{(Op.ATTENTION, "decode", t): f"attention_decode_{t.label}" for t in _KV},
    **{(Op.ATTENTION, "prefill", t): f"attention_prefill_{t.label}" for t in _KV},
    (Op.ADD, "", DType.F32): "add_f32",
    (Op.SELECT_ROWS, "", DType.F32): "select_rows_f32",
    (Op.GLU, "swiglu", DType.F32): "swiglu_f32",
    (Op.GLU, "geglu", DType.F32): "geglu_f32",
}


def _matmul_variant(n: Node, mode: Mode) -> str:
    """Matmuls whose weights can be interleaved by eight rows read a packed copy (x8)."""
    w = n.inputs[1]
    return "x8" if w.dtype in X8_DTYPES and w.shape[0] % 8 == 0 else ""


# Ops whose kernel depends on more than the operand dtype, and what it depends on.
VARIANT: dict[Op, Callable[[Node, Mode], str]] = {
    Op.MATMUL: _matmul_variant,
    Op.LOGITS: _matmul_variant,
    Op.ROPE: lambda n, mode: n.attrs.layout.value,
    Op.GLU: lambda n, mode: n.attrs.activation.value,
    Op.ATTENTION: lambda n, mode: mode.value,
}


X8_KERNELS = frozenset(k for (op, variant, _), k in KERNELS.items() if variant == "x8")


def kernel_key(node: Node, mode: Mode) -> KernelKey:
    typed = [v for v in node.inputs if v.kind in (ValueKind.WEIGHT, ValueKind.KV)]
    dtype = (typed or list(node.inputs))[0].dtype
    variant = VARIANT[node.op](node, mode) if node.op in VARIANT else ""
    return node.op, variant, dtype


def select_kernels(g: Graph) -> Graph:
    nodes = []
    for n in g.nodes:
        key = kernel_key(n, g.mode)
        kernel = KERNELS.get(key)
        if kernel is None:
            operand = next((v.name for v in n.inputs if v.kind is ValueKind.WEIGHT), n.inputs[0].name)
            raise GraphError(
                f"no kernel for {n.op.value} ({key[1] or 'default'}) on {key[2].name} data "
                f"at node {n.label} (operand '{operand}')"
            )
        nodes.append(replace(n, kernel=kernel))
    return replace(g, nodes=tuple(nodes))
