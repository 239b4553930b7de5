"""The packed-weights region: matmuls whose kernel can read weights interleaved by eight rows
(x8, runtime_c/x8_pack.c) read a copy at an offset fixed here, in a file the compiler writes
(build/packing.py). A build without the x8 kernels reads the GGUF rows instead; the values are the
same bits either way.

An x8 copy has the bytes of the GGUF rows it replaces (Q4_K and Q5_K a few more: dtypes.x8_bytes);
a tensor two matmuls share is packed once. A mixture of experts' 3-D tensor is packed expert by
expert, each slice an x8 matrix of its own, one after another (runtime_c/moe.c reads slice e at e
times a slice's bytes). Offsets are 64-byte aligned, in the order a step reads them: the head's,
then each layer's in turn, then the tail's.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..core.cconst import X8_MAX_IN
from ..core.dtypes import X8_DTYPES, DType, x8_bytes
from ..frontend.spec import TensorInfo
from ..ir.graph import Graph, Op, Section, ValueKind
from .kv_plan import align

PACKED_OPS = (Op.MATMUL, Op.LOGITS, Op.MOE_FFN)


@dataclass(frozen=True)
class PackedWeight:
    tensor: str  # the GGUF tensor it is a copy of
    dtype: DType
    n_out: int
    n_in: int
    src: int  # offset of the tensor in the GGUF file
    offset: int  # offset in the packed region
    size: int  # of the x8 copy
    first_op: int
    src_size: int = 0  # of the GGUF rows it is made from
    experts: int = 0  # a 3-D tensor's experts, each packed as an n_out x n_in matrix; 0: one matrix

    @property
    def matrices(self) -> int:
        return max(1, self.experts)


def packs(t: TensorInfo) -> bool:
    """Whether a matmul's weight (or each expert's) has an x8 copy: an x8 type, whole groups of 8
    rows, rows the x8 kernels take (kiln_x8_packs)."""
    return t.dtype in X8_DTYPES and len(t.shape) in (2, 3) and t.shape[-2] % 8 == 0 and t.shape[-1] <= X8_MAX_IN


def _reads(g: Graph):
    """(op index, tensor) of every matmul weight, in the order a step reads them."""
    first = {section: sum(len(nodes) for _, nodes in g.sections()[:k]) for k, (section, _) in enumerate(g.sections())}
    for i, n in enumerate(g.head):
        yield from ((i, v.tensor) for v in n.inputs if n.op in PACKED_OPS and v.kind is ValueKind.WEIGHT)
    nodes = dict(g.sections())
    for ly in g.layers:  # each layer runs its body
        for i, n in enumerate(nodes[ly.body], first[ly.body]):
            yield from ((i, ly.weights[v.name]) for v in n.inputs if n.op in PACKED_OPS and v.kind is ValueKind.WEIGHT)
    for i, n in enumerate(g.tail, first[Section.TAIL]):
        yield from ((i, v.tensor) for v in n.inputs if n.op in PACKED_OPS and v.kind is ValueKind.WEIGHT)


def plan_packed(g: Graph) -> tuple[PackedWeight, ...]:
    out: dict[str, PackedWeight] = {}
    end = 0
    for i, t in _reads(g):
        if t.name in out or not packs(t):
            continue
        experts = t.shape[0] if len(t.shape) == 3 else 0
        size = max(1, experts) * x8_bytes(t.dtype, t.shape[-2], t.shape[-1])
        out[t.name] = PackedWeight(t.name, t.dtype, t.shape[-2], t.shape[-1], t.offset, end, size, i, t.nbytes, experts)
        end = align(end + size)
    return tuple(out.values())


def packed_bytes(packed: tuple[PackedWeight, ...]) -> int:
    return align(packed[-1].offset + packed[-1].size) if packed else 0
