"""Writes runtime_c/iq_tables.h: the i-quants' grids, sign table and value tables, as gguf-py (the
format's reference in Python) holds them, so that no number in the header is kiln's own. The
header is committed; tests/test_quant_types.py regenerates it and requires the same bytes.

    python -m compiler.tools.iq_tables > runtime_c/iq_tables.h
"""
from __future__ import annotations

import sys

import numpy as np
from gguf import quants

# (C name, gguf class, C element type): each grid row is one group of weights (8, or 4 for IQ3)
GRIDS = (("kiln_iq2xxs_grid", quants.IQ2_XXS, "uint8_t"), ("kiln_iq2xs_grid", quants.IQ2_XS, "uint8_t"),
         ("kiln_iq2s_grid", quants.IQ2_S, "uint8_t"), ("kiln_iq3xxs_grid", quants.IQ3_XXS, "uint8_t"),
         ("kiln_iq3s_grid", quants.IQ3_S, "uint8_t"), ("kiln_iq1s_grid", quants.IQ1_S, "int8_t"))
# grids also written as columns (byte j of every row), for lookups of 64 indexes at once by byte
# permutes where a path has them (VBMI's vpermi2b, sb_unpack_avx2.h)
COLUMNS = ("kiln_iq3xxs_grid", "kiln_iq3s_grid")
# grids of 8 bytes from three values, also written as 16-bit codes (2 bits a byte: the value's
# place in kiln_iq2_grid_values), low bytes then high bytes, for the same lookups
CODES = ("kiln_iq2xxs_grid", "kiln_iq2s_grid")


def _array(decl: str, values: np.ndarray, per_line: int = 16) -> str:
    """A C initializer: one brace group per row of a 2-D table, `per_line` values (or rows) a line."""
    items = ([", ".join(str(int(v)) for v in row) for row in values] if values.ndim == 2
             else [str(int(v)) for v in values])
    if values.ndim == 2:
        items, per_line = ["{" + i + "}" for i in items], max(1, per_line // values.shape[1])
    lines = [", ".join(items[i:i + per_line]) for i in range(0, len(items), per_line)]
    return decl + " = {\n" + "".join(f"    {line},\n" for line in lines) + "};\n"


def _byte_rows(name: str, rows: np.ndarray, ctype: str = "uint8_t") -> str:
    """A table of long rows, each read by 64-byte vectors: aligned, 32 values a line."""
    n = rows.shape[1]
    body = "".join("    {\n" + "".join("        " + ", ".join(str(int(v)) for v in row[i:i + 32]) + ",\n"
                                      for i in range(0, n, 32)) + "    },\n" for row in rows)
    return f"static const {ctype} {name}[{len(rows)}][{n}] __attribute__((aligned(64), unused)) = {{\n" + body + "};\n"


def header() -> str:
    out = ["/* iq_tables.h: the tables the i-quants and MXFP4 decode through, written by",
           " * compiler/tools/iq_tables.py from gguf-py's (do not edit). Every path reads these: the scalar",
           " * references, the unpackers of the SIMD kernels, and the x8 packer. */",
           "#ifndef KILN_IQ_TABLES_H", "#define KILN_IQ_TABLES_H", "", "#include <stdint.h>", "",
           "/* the 4-bit non-linear values of IQ4_NL and IQ4_XS */",
           _array("static const int8_t kiln_kvalues_iq4nl[16] __attribute__((unused))", np.array(quants.IQ4_NL.kvalues)),
           "/* MXFP4's E2M1 values, doubled (its E8M0 scale is halved to match) */",
           _array("static const int8_t kiln_kvalues_mxfp4[16] __attribute__((unused))", np.array(quants.MXFP4.kvalues)),
           "/* IQ2_XXS/IQ2_XS/IQ3_XXS: 7 sign bits -> 8, the eighth making the count of minus signs even */",
           _array("static const uint8_t kiln_ksigns_iq2xs[128] __attribute__((unused))", np.frombuffer(quants.IQ2_XXS.ksigns, np.uint8), 16),
           ]
    for name, cls, ctype in GRIDS:
        cls.init_grid()
        grid = np.asarray(cls.grid).reshape(cls.grid_shape)
        n, width = cls.grid_shape
        assert np.array_equal(grid, np.round(grid)), name
        out.append(f"/* {cls.qtype.name}: {n} groups of {width} magnitudes"
                   + (" (-1, 0, 1)" if ctype == "int8_t" else "") + " */")
        out.append(_array(f"static const {ctype} {name}[{n}][{width}] __attribute__((aligned({width}), unused))",
                          grid.astype(np.int64), 32))
        if name in COLUMNS:
            out.append(f"/* the same, as {width} columns: {name}_cols[j][i] = {name}[i][j] */")
            out.append(_byte_rows(f"{name}_cols", grid.T.astype(np.int64), ctype))
    values = None
    for name, cls, _ in GRIDS:
        if name not in CODES:
            continue
        grid = np.asarray(cls.grid).reshape(cls.grid_shape).astype(np.int64)
        values = np.unique(grid) if values is None else values
        assert len(values) == 3 and np.array_equal(np.unique(grid), values), name
        code = sum(np.searchsorted(values, grid[:, i]) << (2 * i) for i in range(grid.shape[1]))
        out.append(f"/* {name} as 16-bit codes: byte i of row r is kiln_iq2_grid_values[code(r) >> 2i & 3],\n   "
                   f"code(r) = {name}_codes[0][r] | {name}_codes[1][r] << 8 */")
        out.append(_byte_rows(f"{name}_codes", np.stack([code & 255, code >> 8])))
    if values is not None:
        out.append("/* the three magnitudes of the 2-bit grids (IQ2_XXS, IQ2_XS, IQ2_S) */")
        out.append(_array("static const uint8_t kiln_iq2_grid_values[4] __attribute__((unused))", np.append(values, 0)))
    out.append("#endif")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.stdout.write(header())
