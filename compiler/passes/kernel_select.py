"""Pick the runtime function of every node from one table keyed by (op, variant), and check that
the function takes the node's operand types.

The variant distinguishes ops whose math differs by an attribute (the GLU's activation; an
attention with soft-capped scores or sinks), so that each function
does one thing and the plain ones stay as they were. A
kernel takes its weights' and the cache's element types as arguments and dispatches through the
runtime's one type table (runtime_c/types.c), so one function serves every type it lists here;
a layer whose tensor has another type is refused by name. The codegen table of arguments
(codegen/emit.py) is keyed by the same functions.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from ..core.dtypes import KV_DTYPES, RUNTIME_DTYPES, DType
from ..core.errors import GraphError
from ..ir.graph import Graph, Node, Op, ValueKind

F32 = (DType.F32,)


@dataclass(frozen=True)
class Kernel:
    function: str  # the runtime function; all threads call its _mt twin (kernels_mt.h)
    weights: tuple[DType, ...] = ()  # the element types of its weight operands it takes
    cache: tuple[DType, ...] = ()  # of its KV cache operands


KERNELS: dict[tuple[Op, str], Kernel] = {
    (Op.EMBED, ""): Kernel("kiln_embed", RUNTIME_DTYPES),
    (Op.RMS_NORM, ""): Kernel("kiln_rms_norm", F32),
    (Op.MATMUL, ""): Kernel("kiln_matmul", RUNTIME_DTYPES),
    (Op.MATMUL, "quantized"): Kernel("kiln_matmul_quantized", RUNTIME_DTYPES),  # reads another's quantized rows
    (Op.LOGITS, ""): Kernel("kiln_matmul", RUNTIME_DTYPES),
    (Op.ROPE, ""): Kernel("kiln_rope_rotate"),  # by its layer's rotations in the step's rope table
    (Op.ROPE_TABLE, ""): Kernel("kiln_rope_table", F32),  # each row's rotations, once a step (frequency factors f32)
    (Op.HADAMARD, ""): Kernel("kiln_hadamard"),
    (Op.KV_STORE, ""): Kernel("kiln_kv_store", cache=tuple(KV_DTYPES.values())),
    (Op.ATTENTION, ""): Kernel("kiln_attention", cache=tuple(KV_DTYPES.values())),
    (Op.ATTENTION, "ext"): Kernel("kiln_attention_ext", F32, tuple(KV_DTYPES.values())),  # soft-cap, sinks, ALiBi
    (Op.ADD, ""): Kernel("kiln_add"),
    (Op.SELECT_ROWS, ""): Kernel("kiln_select_rows"),
    (Op.GLU, "swiglu"): Kernel("kiln_swiglu"),
    (Op.GLU, "geglu"): Kernel("kiln_geglu"),
    (Op.GLU, "geglu_erf"): Kernel("kiln_geglu_erf"),
    (Op.SCALE, ""): Kernel("kiln_scale", F32),  # by a number, or a weight's one value
    (Op.SCALE, "row"): Kernel("kiln_scale_row", F32),  # each column by its weight (Gemma 4's router input)
    (Op.SOFTCAP, ""): Kernel("kiln_softcap"),
    (Op.MOE_ROUTE, ""): Kernel("kiln_moe_route"),
    (Op.MOE_FFN, "swiglu"): Kernel("kiln_moe_ffn", RUNTIME_DTYPES),
    (Op.MOE_FFN, "swiglu_oai"): Kernel("kiln_moe_ffn", RUNTIME_DTYPES),
    (Op.MOE_FFN, "geglu"): Kernel("kiln_moe_ffn", RUNTIME_DTYPES),
    (Op.MOE_FFN, "gelu"): Kernel("kiln_moe_ffn", RUNTIME_DTYPES),  # experts without a gate (nomic-bert-moe)
    (Op.GLU, "sigmoid"): Kernel("kiln_sigmoid_gate"),
    (Op.GLU, "sigmoid_row"): Kernel("kiln_sigmoid_row_gate"),  # one gate a row
    (Op.REGROUP, ""): Kernel("kiln_regroup"),
    (Op.SSM_CONV, ""): Kernel("kiln_ssm_conv", F32),
    (Op.DELTA_NET, ""): Kernel("kiln_delta_net", F32),
    (Op.LAYER_SLICE, ""): Kernel("kiln_layer_slice"),
    (Op.LAYER_NORM, ""): Kernel("kiln_layer_norm", F32),
    (Op.ACTIVATE, "gelu"): Kernel("kiln_gelu"),
    (Op.ADD, "row"): Kernel("kiln_add_row", F32),  # a weight's row added to every row (BERT's token type)
}

# Ops whose kernel depends on an attribute, and which.
VARIANT: dict[Op, Callable[[Node], str]] = {
    Op.MATMUL: lambda n: "quantized" if n.attrs.act_from else "",
    Op.ROPE: lambda n: "" if n.inputs[1].kind is ValueKind.STATE else "positions (run the rope_table pass first)",
    Op.GLU: lambda n: n.attrs.activation.value + ("_row" if n.inputs[0].shape[1:] == (1,) != n.inputs[1].shape[1:]
                                                    else ""),
    Op.ATTENTION: lambda n: "ext" if n.attrs.softcap or n.attrs.alibi or any(v.kind is ValueKind.WEIGHT for v in n.inputs) else "",
    Op.MOE_FFN: lambda n: n.attrs.activation.value,
    Op.SCALE: lambda n: "row" if n.inputs[1:] and n.inputs[1].shape != (1,) else "",
    Op.ADD: lambda n: "row" if n.inputs[1].kind is ValueKind.WEIGHT else "",
    Op.ACTIVATE: lambda n: n.attrs.activation.value,
}

BY_FUNCTION: dict[str, Kernel] = {k.function: k for k in KERNELS.values()}


def kernel_key(node: Node) -> tuple[Op, str]:
    return node.op, VARIANT[node.op](node) if node.op in VARIANT else ""


def _check_types(g: Graph, n: Node, kernel: Kernel) -> None:
    for v in n.inputs:
        allowed = kernel.weights if v.kind is ValueKind.WEIGHT else kernel.cache if v.kind is ValueKind.KV else None
        if allowed is None:
            continue
        for t in (g.tensors(v) if v.kind is ValueKind.WEIGHT else ()):
            if t.dtype not in allowed:
                raise GraphError(f"no kernel for {n.op.value} on {t.dtype.name} data: tensor '{t.name}' "
                                 f"(node {n.name}; {kernel.function} takes {', '.join(d.name for d in allowed)})")
        if v.kind is ValueKind.KV and v.dtype not in allowed:
            raise GraphError(f"no kernel for {n.op.value} on a {v.dtype.name} cache (node {n.name})")


def select_kernels(g: Graph) -> Graph:
    for section, nodes in g.sections():
        chosen = []
        for n in nodes:
            kernel = KERNELS.get(kernel_key(n))
            if kernel is None:
                raise GraphError(f"no kernel for {n.op.value} ({kernel_key(n)[1] or 'default'}) at node {n.name}")
            _check_types(g, n, kernel)
            chosen.append(replace(n, kernel=kernel.function))
        g = g.with_nodes(section, chosen)
    return g
