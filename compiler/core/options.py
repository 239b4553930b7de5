"""Compile options, checked once here so that every entry point (CLI, Python) reports the same errors."""
from __future__ import annotations

from dataclasses import dataclass

from .dtypes import DType, parse_kv_dtype
from .errors import OptionError

MAX_CTX = 1 << 20
MAX_PREFILL_CHUNK = 4096
MAX_SEQ = 256
MAX_PAGES = 1 << 22
# Rows of a page are a multiple of 8 so that attention's groups of eight rows never straddle
# two pages (runtime_c/attention.c); 64 was measured fastest (`kiln bench --page-sizes`; docs/architecture.md).
PAGE_SIZE_MULTIPLE = 8
DEFAULT_PAGE_SIZE = 64


@dataclass(frozen=True)
class CompileOptions:
    ctx: int = 2048
    kv_dtype: DType = DType.F32  # K and V, unless one of the two below is given
    prefill_chunk: int = 256  # tokens of one sequence per step; clamped to ctx and to batch_tokens
    n_seq: int = 1  # sequences live at once
    page_size: int = DEFAULT_PAGE_SIZE  # positions per KV page
    kv_pages: int | None = None  # pages of the full-context pool; None: n_seq x ctx worth
    batch_tokens: int | None = None  # rows one step takes; None: the prefill chunk
    kv_dtype_k: DType | None = None  # llama.cpp's -ctk; None: kv_dtype
    kv_dtype_v: DType | None = None  # llama.cpp's -ctv; None: kv_dtype
    kv_rotation: bool = True  # a quantized K or V is held in Hadamard blocks, as llama.cpp does
    # the step returns each wanted row's hidden state (which the runtime pools) in place of logits;
    # a model without an LM head (an encoder) always does
    embedding: bool = False

    def __post_init__(self) -> None:
        _check_range("ctx", "--ctx", self.ctx, 1, MAX_CTX)
        _check_range("prefill_chunk", "--prefill-chunk", self.prefill_chunk, 1, MAX_PREFILL_CHUNK)
        _check_range("n_seq", "--n-seq", self.n_seq, 1, MAX_SEQ)
        _check_range("page_size", "--page-size", self.page_size, PAGE_SIZE_MULTIPLE, 4096)
        if self.page_size % PAGE_SIZE_MULTIPLE:
            raise OptionError(f"page_size (--page-size) must be a multiple of {PAGE_SIZE_MULTIPLE}, "
                              f"got {self.page_size}")
        if self.kv_pages is not None:
            _check_range("kv_pages", "--kv-pages", self.kv_pages, 1, MAX_PAGES)
        batch = self.prefill_chunk if self.batch_tokens is None else self.batch_tokens
        _check_range("batch_tokens", "--batch-tokens", batch, 1, MAX_PREFILL_CHUNK)
        object.__setattr__(self, "kv_dtype", parse_kv_dtype(self.kv_dtype))
        for part in ("k", "v"):
            given = getattr(self, f"kv_dtype_{part}")
            dtype = self.kv_dtype if given is None else parse_kv_dtype(given, f"kv_dtype_{part} (--kv-dtype-{part})")
            object.__setattr__(self, f"kv_dtype_{part}", dtype)
        object.__setattr__(self, "batch_tokens", batch)
        object.__setattr__(self, "prefill_chunk", min(self.prefill_chunk, self.ctx, batch))


def _check_range(name: str, flag: str, value: object, lo: int, hi: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise OptionError(f"{name} ({flag}) must be an integer, got {value!r}")
    if not lo <= value <= hi:
        raise OptionError(f"{name} ({flag}) must be between {lo} and {hi}, got {value}")
