"""What each weight type of a model runs on in a build: `kiln compile`'s line a type.

Nothing here lists types. A matrix reads the x8 layout where the planner packs it (planner/packed.py
`packs`: an X8_DTYPES type in whole groups of 8 rows) and the build has an x8 kernel (isa.h); else
its dot reads the GGUF rows, through the SIMD twin the library's own type table has for the type
(kiln_simd_kernels & KILN_SIMD_DOT, runtime_c/types.c), or through the scalar reference where it has
none, and the line says so: no type is slow without a word. The words for the paths are
build/targets.py's, which `kernels for ...` prints too.
"""
from __future__ import annotations

from collections import Counter
from typing import Callable, Collection

from ..core.dtypes import AMX_DTYPES, X8_DTYPES, DType
from ..frontend.spec import ModelSpec, TensorInfo
from ..ir.graph import Graph, Op, ValueKind
from ..planner.packed import PACKED_OPS, packs
from .runtime import runtime_kernels
from .targets import KERNEL_PATHS, cross, family, kernel_macros, kernels_reported

PATH_WORDS = dict(KERNEL_PATHS)
X8_PATHS = ("KILN_HAVE_VNNI", "KILN_HAVE_X8_AVX2")  # either reads the packed copy (isa.h's KILN_HAVE_X8)
# what a tensor is read by, best first: a matmul's dot is where a type's speed is decided
DOT, LOOKUP, VECTOR, UNREAD = "dot", "lookup", "vector", "unread"


def weight_kernels(spec: ModelSpec, graph: Graph, sanitize: bool = False, target: str = "native",
                   isa: tuple[str, ...] = (), log=lambda s: None) -> list[str]:
    """One line a weight type of the model, heaviest first: its tensors, their bytes, and the
    kernel they run on in the build for `target`. The library of a target this CPU can load is
    asked; one of another architecture is not loadable here, and its lines say that instead."""
    if cross(target):
        return describe(spec, graph, kernel_macros(sanitize, target, isa), None, family(target))
    rt = runtime_kernels(sanitize, log, target, isa)  # built once per target, like the runtime
    return describe(spec, graph, kernels_reported(rt),
                    lambda d: bool(rt.lib.kiln_simd_kernels(d.value.value) & rt.lib.KILN_SIMD_DOT))


def describe(spec: ModelSpec, graph: Graph, paths: Collection[str], simd_dot: Callable[[DType], bool] | None,
             arch: str = "") -> list[str]:
    """The lines, from a build's facts: its KILN_HAVE_* paths, and whether a type's dot has a SIMD
    twin (None: unknown, the library cannot be loaded here)."""
    uses = _uses(graph)
    by_type: dict[DType, list[TensorInfo]] = {}
    for t in spec.tensors.values():
        by_type.setdefault(t.dtype, []).append(t)
    lines = []
    for dtype, tensors in sorted(by_type.items(), key=lambda kv: -sum(t.nbytes for t in kv[1])):
        routes = Counter(_route(*uses.get(t.name, (t, UNREAD)), paths, simd_dot) for t in tensors)
        size = _size(sum(t.nbytes for t in tensors))
        if len(routes) == 1:
            lines.append(f"{dtype.name}: {_count(len(tensors))}, {size}: {next(iter(routes))}")
        else:
            lines.append(f"{dtype.name}: {_count(len(tensors))}, {size}: "
                         + "; ".join(f"{_count(n)}: {route}" for route, n in routes.most_common()))
    if simd_dot is None:
        lines.append(f"(an {arch} library cannot be loaded on this CPU to ask which types its SIMD dots "
                     "cover: a type without one runs the scalar reference)")
    return lines


def _uses(g: Graph) -> dict[str, tuple[TensorInfo, str]]:
    """File tensor name -> (the tensor or row view a node reads, how), the best use where several
    nodes read it (a tied embedding is a lookup and the LM head's dot)."""
    rank = (DOT, LOOKUP, VECTOR)
    out: dict[str, tuple[TensorInfo, str]] = {}
    for n in g.nodes:
        how = DOT if n.op in PACKED_OPS else LOOKUP if n.op is Op.EMBED else VECTOR
        for v in (v for v in n.inputs if v.kind is ValueKind.WEIGHT):
            for t in g.tensors(v):
                name = t.view_of or t.name
                if name not in out or rank.index(how) < rank.index(out[name][1]):
                    out[name] = (t, how)
    return out


def _route(t: TensorInfo, how: str, paths: Collection[str], simd_dot) -> str:
    if how == LOOKUP:
        return "row lookup (the embedding: a row a token, dequantized)"
    if how == VECTOR:
        return "vectors of elementwise ops (norms, biases, factors)"
    if how == UNREAD:
        return "not read by this architecture's graph"
    x8 = next((p for p in X8_PATHS if p in paths), None)
    amx = "KILN_HAVE_AMX" in paths and t.dtype in AMX_DTYPES
    if x8 and packs(t):
        # AMX tiles take the 32-weight blocks up to a bound of x8_amx.c's own, and Q3_K's and IQ4_XS's
        # prefill tiles; the K-quants' kx8 blocks stay with VNNI
        return PATH_WORDS[x8] + (f" ({PATH_WORDS['KILN_HAVE_AMX']}, where its rows fit the tiles)" if amx else "")
    simd = next((p for p in ("KILN_HAVE_AVX2", "KILN_HAVE_NEON") if p in paths), None)
    if simd is None:
        return "the scalar reference (a build without SIMD kernels)"
    rows = f"{'AVX2' if simd == 'KILN_HAVE_AVX2' else 'NEON'} rows on the GGUF layout"
    why = []
    # the super-block types with no x8 layout are those rows_sb_*.c serves: a block's weights and
    # scales are unpacked to bytes once for all the tile's activation rows
    if t.dtype.block_elems == 256 and t.dtype not in X8_DTYPES:
        why.append("unpacked once per tile" + (f", {PATH_WORDS['KILN_HAVE_AMX']}" if amx else ""))
    # the table types' prefill interleaves its tiles only with vpdpbusd (rows_lut_avx2.c)
    if t.dtype in (DType.IQ4_NL, DType.MXFP4) and simd == "KILN_HAVE_AVX2" and "KILN_HAVE_VNNI" in paths:
        why.append("interleaved once per tile in prefill")
    if x8:
        why.append("no x8 layout for this type" if t.dtype not in X8_DTYPES else "this shape has no x8 copy")
    rows += f" ({'; '.join(why)})" if why else ""
    if simd_dot is None:
        return f"{rows}, if the library has a SIMD dot for {t.dtype.name}"
    if not simd_dot(t.dtype):
        return f"the scalar reference (this build has no SIMD dot for {t.dtype.name})"
    return rows


def _count(n: int) -> str:
    return f"{n} tensor{'s' if n != 1 else ''}"


def _size(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB"
