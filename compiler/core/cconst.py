"""The C runtime's constants that the compiler plans with, read from runtime_c/constants.h by
cffi's C parser: no compiler runs, and no number is copied into Python by hand."""
from __future__ import annotations

from functools import lru_cache

from .paths import RUNTIME_DIR


@lru_cache(maxsize=None)
def _constants() -> dict[str, int]:
    import cffi

    ffi = cffi.FFI()
    text = (RUNTIME_DIR / "constants.h").read_text()
    ffi.cdef("\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#")))
    return dict(ffi.typeof("enum kiln_constants").relements)


def c_constant(name: str) -> int:
    return _constants()[name]


MAX_HEAD_DIM = c_constant("KILN_MAX_HEAD_DIM")
HADAMARD_BLOCK = c_constant("KILN_HADAMARD_BLOCK")
ATTN_SPAN = c_constant("KILN_ATTN_SPAN")
ATTN_SPAN_STATE = c_constant("KILN_ATTN_SPAN_STATE")
K_TRANSPOSED_TYPES = c_constant("KILN_K_TRANSPOSED_TYPES")
PACKED_HEADER_BYTES = c_constant("KILN_PACKED_HEADER_BYTES")
X8_MAX_IN = c_constant("KILN_X8_MAX_IN")
X8_TILE = c_constant("KILN_X8_TILE")
X8_TILE_SCALES = c_constant("KILN_X8_TILE_SCALES")
MOE_MAX_EXPERTS = c_constant("KILN_MOE_MAX_EXPERTS")
MAX_STATE_DIM = c_constant("KILN_MAX_STATE_DIM")
MAX_CONV_TAPS = c_constant("KILN_MAX_CONV_TAPS")
