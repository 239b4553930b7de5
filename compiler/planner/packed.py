"""The packed-weights region: matmuls whose kernel reads weights interleaved by eight rows
(x8, runtime_c/x8_pack.c) read a copy at an offset fixed here, in a file the compiler
writes (compiler/packing.py).

An x8 copy has the bytes of the GGUF rows it replaces (Q4_K and Q5_K a few more: dtypes.x8_bytes);
a weight used by several x8 matmuls (none today) is packed once. Offsets are 64-byte aligned, in
order of first use.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..core.dtypes import DType, x8_bytes
from ..ir.graph import Graph, ValueKind
from ..passes.kernel_select import X8_KERNELS
from .kv_plan import align


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


def plan_packed(g: Graph) -> tuple[PackedWeight, ...]:
    out: dict[str, PackedWeight] = {}
    end = 0
    for i, n in enumerate(g.nodes):
        if n.kernel not in X8_KERNELS:
            continue
        w = next(v for v in n.inputs if v.kind is ValueKind.WEIGHT)
        t = w.tensor
        if t.name in out:
            continue
        size = x8_bytes(w.dtype, w.shape[0], w.shape[1])
        out[t.name] = PackedWeight(t.name, w.dtype, w.shape[0], w.shape[1], t.offset, end, size, i, t.nbytes)
        end = align(end + size)
    return tuple(out.values())


def packed_bytes(packed: tuple[PackedWeight, ...]) -> int:
    return align(packed[-1].offset + packed[-1].size) if packed else 0
