"""Compile options, checked once here so that every entry point (CLI, Python) reports the same errors."""
from __future__ import annotations

from dataclasses import dataclass

from .dtypes import DType, parse_kv_dtype
from .errors import OptionError

MAX_CTX = 1 << 20
MAX_PREFILL_CHUNK = 4096
MAX_SEQ = 64


@dataclass(frozen=True)
class CompileOptions:
    ctx: int = 2048
    kv_dtype: DType = DType.F32
    prefill_chunk: int = 256  # clamped to ctx: a chunk longer than the context is never needed
    n_seq: int = 1

    def __post_init__(self) -> None:
        _check_range("ctx", "--ctx", self.ctx, 1, MAX_CTX)
        _check_range("prefill_chunk", "--prefill-chunk", self.prefill_chunk, 1, MAX_PREFILL_CHUNK)
        _check_range("n_seq", "--n-seq", self.n_seq, 1, MAX_SEQ)
        object.__setattr__(self, "kv_dtype", parse_kv_dtype(self.kv_dtype))
        object.__setattr__(self, "prefill_chunk", min(self.prefill_chunk, self.ctx))


def _check_range(name: str, flag: str, value: object, lo: int, hi: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise OptionError(f"{name} ({flag}) must be an integer, got {value!r}")
    if not lo <= value <= hi:
        raise OptionError(f"{name} ({flag}) must be between {lo} and {hi}, got {value}")
