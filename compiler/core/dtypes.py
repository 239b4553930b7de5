"""Element types kiln knows, with their GGML block geometry, and what the runtime does with each.

Sizes come from `gguf.GGML_QUANT_SIZES` (the reference tables of the format), never from
numbers of our own. The C runtime has its own table (runtime_c/types.c); check_against_runtime
holds this one to it whenever the runtime is loaded, so the two cannot drift apart.
"""
from __future__ import annotations

from enum import Enum

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from .errors import OptionError


class DType(Enum):
    """A tensor element type; the value is its GGML type."""

    F32 = GGMLQuantizationType.F32
    F16 = GGMLQuantizationType.F16
    BF16 = GGMLQuantizationType.BF16
    Q8_0 = GGMLQuantizationType.Q8_0
    Q4_0 = GGMLQuantizationType.Q4_0
    Q4_1 = GGMLQuantizationType.Q4_1
    Q5_0 = GGMLQuantizationType.Q5_0
    Q5_1 = GGMLQuantizationType.Q5_1
    Q4_K = GGMLQuantizationType.Q4_K
    Q5_K = GGMLQuantizationType.Q5_K
    Q6_K = GGMLQuantizationType.Q6_K
    Q2_K = GGMLQuantizationType.Q2_K
    Q3_K = GGMLQuantizationType.Q3_K
    IQ4_NL = GGMLQuantizationType.IQ4_NL
    IQ4_XS = GGMLQuantizationType.IQ4_XS
    IQ3_S = GGMLQuantizationType.IQ3_S
    IQ3_XXS = GGMLQuantizationType.IQ3_XXS
    IQ2_S = GGMLQuantizationType.IQ2_S
    IQ2_XS = GGMLQuantizationType.IQ2_XS
    IQ2_XXS = GGMLQuantizationType.IQ2_XXS
    IQ1_M = GGMLQuantizationType.IQ1_M
    IQ1_S = GGMLQuantizationType.IQ1_S
    TQ2_0 = GGMLQuantizationType.TQ2_0
    TQ1_0 = GGMLQuantizationType.TQ1_0
    MXFP4 = GGMLQuantizationType.MXFP4
    I32 = GGMLQuantizationType.I32
    I8 = GGMLQuantizationType.I8  # raw bytes: kernel scratch

    @property
    def label(self) -> str:
        return self.name.lower()

    @property
    def block_elems(self) -> int:
        return GGML_QUANT_SIZES[self.value][0]

    @property
    def block_bytes(self) -> int:
        return GGML_QUANT_SIZES[self.value][1]

    def nbytes(self, n_elems: int) -> int:
        """Bytes for `n_elems` elements; `n_elems` must be a whole number of blocks."""
        if n_elems % self.block_elems:
            raise ValueError(f"{n_elems} elements is not a whole number of {self.name} blocks")
        return n_elems // self.block_elems * self.block_bytes


# Types a GGUF weight may have. Everything else is refused by name when the model is read.
WEIGHT_DTYPES: tuple[DType, ...] = tuple(d for d in DType if d not in (DType.I32, DType.I8))


# Weight types runtime_c has kernels for (its type table; a test holds the two together): all of them.
RUNTIME_DTYPES: tuple[DType, ...] = WEIGHT_DTYPES


# Weight types the runtime can interleave by eight rows (runtime_c/x8_pack.c): a matmul on
# one of these, with a multiple of 8 output rows, reads a packed copy the compiler writes.
X8_DTYPES: tuple[DType, ...] = (DType.Q4_0, DType.Q4_1, DType.Q5_0, DType.Q5_1, DType.Q8_0, DType.IQ4_NL,
                                DType.MXFP4, DType.Q4_K, DType.Q5_K, DType.Q6_K, DType.IQ4_XS, DType.Q3_K,
                                DType.Q2_K)
# The K-quants', IQ4_XS's, Q3_K's and Q2_K's x8 blocks hold a super-block of 8 rows; Q4_K, Q5_K, Q3_K and
# IQ4_XS keep their 6-bit scales as bytes, 32 (16) bytes a block more than the GGUF rows (x8_pack.c's
# kx8_bytes).
X8_EXTRA_BYTES: dict[DType, int] = {DType.Q4_K: 32, DType.Q5_K: 32, DType.IQ4_XS: 16, DType.Q3_K: 32}


# Types whose prefill takes AMX tile multiplies where the build has them and Linux allows them
# (kiln_amx_prefill): the 32-weight x8 types (x8_amx.c) and the super-block types' interleaved
# tiles (rows_sb_avx2.c) but Q2_K's, whose minimums stay with VNNI; not the K-quants' kx8 blocks.
AMX_DTYPES: tuple[DType, ...] = (DType.Q4_0, DType.Q4_1, DType.Q5_0, DType.Q5_1, DType.Q8_0, DType.IQ4_NL,
                                 DType.MXFP4, DType.Q3_K, DType.IQ4_XS, DType.IQ3_S, DType.IQ3_XXS, DType.IQ2_S,
                                 DType.IQ2_XS, DType.IQ2_XXS, DType.IQ1_M, DType.IQ1_S, DType.TQ2_0, DType.TQ1_0)


def x8_bytes(dtype: DType, n_out: int, n_in: int) -> int:
    """Bytes of a matrix in the x8 layout (kiln_x8_bytes in x8_pack.c)."""
    extra = X8_EXTRA_BYTES.get(dtype, 0) * (n_out // 8) * (n_in // 256)
    return dtype.nbytes(n_out * n_in) + extra


def weight_dtype(ggml_type: GGMLQuantizationType) -> DType | None:
    """The DType of a GGUF tensor type, or None if kiln has no kernels for it."""
    for d in WEIGHT_DTYPES:
        if d.value == ggml_type:
            return d
    return None


# How a matmul stores its activations for the dot with each weight type (runtime_c/types.c's
# table says the same; a test holds them together): (elements, bytes) per block.
_ACT_BLOCK: dict[DType, tuple[int, int]] = {
    **{t: (1, 4) for t in (DType.F32, DType.F16, DType.BF16)},
    **{t: (32, 34) for t in (DType.Q4_0, DType.Q5_0, DType.Q8_0)},  # q8_0
    **{t: (32, 36) for t in (DType.Q4_1, DType.Q5_1)},  # q8_1: q8_0 plus d*sum(q)
    **{t: (32, 34) for t in (DType.IQ4_NL, DType.MXFP4)},  # q8_0, as llama.cpp pairs them
}
_ACT_BLOCK.update({t: (256, 292) for t in WEIGHT_DTYPES if t not in _ACT_BLOCK})  # q8_K: every super-block type


def act_row_bytes(weight: DType, n: int) -> int:
    block, size = _ACT_BLOCK[weight]
    return n // block * size


def act_scales_bytes(weight: DType, rows: int, n: int) -> int:
    """Bytes after a matmul's quantized rows (from a multiple of 64) for their scales as the x8
    kernels take them, a tile of X8_TILE rows at a time (runtime_c/types.c's kiln_act_scales_bytes)."""
    from .cconst import X8_TILE, X8_TILE_SCALES

    if _ACT_BLOCK[weight][0] != 32 or rows < 2:
        return 0
    return -(-rows // X8_TILE) * X8_TILE_SCALES * 4 * X8_TILE * (n // 32)


def matmul_scratch_bytes(weight: DType, rows: int, n: int) -> int:
    """A matmul's scratch (kiln_matmul_scratch_bytes): its quantized rows, then their x8 scales."""
    return -(-rows * act_row_bytes(weight, n) // 64) * 64 + act_scales_bytes(weight, rows, n)


def same_act_format(a: DType, b: DType) -> bool:
    """Whether two weight types' dots take their activations in one format (each format has its
    own block geometry: f32, q8_0, q8_1, q8_K)."""
    return _ACT_BLOCK[a] == _ACT_BLOCK[b]


# KV-cache element types, by their option spelling.
KV_DTYPES: dict[str, DType] = {t.label: t for t in (DType.F32, DType.F16, DType.Q8_0, DType.Q5_0, DType.Q4_1,
                                                      DType.Q4_0)}


def parse_kv_dtype(text: str | DType, option: str = "kv_dtype (--kv-dtype)") -> DType:
    if isinstance(text, DType) and text in KV_DTYPES.values():
        return text
    try:
        return KV_DTYPES[str(text).lower()]
    except KeyError:
        raise OptionError(
            f"{option}: unknown KV cache dtype {text!r}; choose one of {', '.join(KV_DTYPES)}"
        ) from None


def check_against_runtime(ffi, lib) -> None:
    """Raise if this table and the C runtime's (a cffi module of kernels.h) disagree on any fact."""
    from .errors import KilnError

    n = 256  # a whole number of blocks of every type
    problems = []
    for d in DType:
        t = d.value.value
        if lib.kiln_type_supported(t) != (d in RUNTIME_DTYPES):
            problems.append(f"{d.name}: supported in Python {d in RUNTIME_DTYPES}, in C {bool(lib.kiln_type_supported(t))}")
            continue
        if d not in RUNTIME_DTYPES:
            continue
        if lib.kiln_row_bytes(t, n) != d.nbytes(n):
            problems.append(f"{d.name}: {n} elements are {d.nbytes(n)} bytes in Python, {lib.kiln_row_bytes(t, n)} in C")
        if lib.kiln_act_row_bytes(t, n) != act_row_bytes(d, n):
            problems.append(f"{d.name}: activation rows differ ({act_row_bytes(d, n)} vs {lib.kiln_act_row_bytes(t, n)})")
        for rows in (1, 2, 9):
            if lib.kiln_matmul_scratch_bytes(t, rows, n) != matmul_scratch_bytes(d, rows, n):
                problems.append(f"{d.name}: a matmul of {rows} rows' scratch differs ({matmul_scratch_bytes(d, rows, n)} "
                                f"vs {lib.kiln_matmul_scratch_bytes(t, rows, n)})")
        if bool(lib.kiln_x8_packs(t, 8, n)) != (d in X8_DTYPES):
            problems.append(f"{d.name}: x8 layout in Python {d in X8_DTYPES}, in C {bool(lib.kiln_x8_packs(t, 8, n))}")
        elif d in X8_DTYPES and lib.kiln_x8_bytes(t, 8, n) != x8_bytes(d, 8, n):
            problems.append(f"{d.name}: x8 bytes {x8_bytes(d, 8, n)} vs {lib.kiln_x8_bytes(t, 8, n)}")
        if bool(lib.kiln_amx_prefill(t)) != (d in AMX_DTYPES):
            problems.append(f"{d.name}: AMX in prefill in Python {d in AMX_DTYPES}, in C {bool(lib.kiln_amx_prefill(t))}")
        if bool(lib.kiln_kv_type_supported(t)) != (d in KV_DTYPES.values()):
            problems.append(f"{d.name}: a KV cache type in Python {d in KV_DTYPES.values()}, in C "
                            f"{bool(lib.kiln_kv_type_supported(t))}")
    if problems:
        raise KilnError("compiler/core/dtypes.py and runtime_c/types.c disagree: " + "; ".join(problems))
