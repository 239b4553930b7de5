"""How the KV cache holds its rows, fixed by the options and the model before any graph is built:
the K and V element types (each its own, llama.cpp's -ctk / -ctv), whether each is held in
Hadamard blocks, and the pages' geometry. The graph's KV values have these types and shapes; the
planner (planner/kv_plan.py) lays the pages out.

A quantized K (or V) is held in Hadamard blocks of 64, as llama.cpp holds it: Q and K (V, and
attention's output) are rotated by the orthonormal 64x64 Hadamard matrix, which leaves every dot
product as it was but spreads a head's outlier channels over the block, so that a block's one
scale fits all its values (passes/kv_rotate.py).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..core.cconst import HADAMARD_BLOCK
from ..core.dtypes import DType
from ..core.errors import OptionError
from ..core.options import CompileOptions
from ..frontend.spec import HParams

FLOAT_KV = (DType.F32, DType.F16)  # cache types held as they are; the quantized ones are rotated


@dataclass(frozen=True)
class KVConfig:
    k_dtype: DType
    v_dtype: DType
    n_seq: int
    ctx: int
    page_size: int
    n_head_kv: int
    head_dim: int
    k_hadamard: bool  # K (with Q) held in Hadamard blocks
    v_hadamard: bool  # V held in Hadamard blocks (attention's output rotated back)
    causal: bool = True  # False: a bidirectional model, whose pool holds one step's inputs whole

    @property
    def dtype_label(self) -> str:
        """'f16', or 'q4_0/f16' when K and V differ."""
        k, v = self.k_dtype.label, self.v_dtype.label
        return k if k == v else f"{k}/{v}"


def kv_config(hp: HParams, opts: CompileOptions) -> KVConfig:
    head_dims = sorted({hp.for_layer(il).head_dim for il in range(hp.n_layer)})  # layer kinds may differ (Gemma 4)
    for part, dtype in (("k", opts.kv_dtype_k), ("v", opts.kv_dtype_v)):
        for hd in head_dims:
            if hd % dtype.block_elems:
                raise OptionError(f"kv_dtype_{part} (--kv-dtype-{part}) {dtype.label} stores blocks of "
                                  f"{dtype.block_elems} but head_dim is {hd}; use f16 or f32")

    def rotated(dtype: DType) -> bool:
        return opts.kv_rotation and dtype not in FLOAT_KV and all(hd % HADAMARD_BLOCK == 0 for hd in head_dims)

    return KVConfig(opts.kv_dtype_k, opts.kv_dtype_v, opts.n_seq, opts.ctx, opts.page_size, hp.n_head_kv,
                    hp.head_dim, rotated(opts.kv_dtype_k), rotated(opts.kv_dtype_v), hp.causal)
