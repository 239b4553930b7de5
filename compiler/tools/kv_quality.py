"""What a KV-cache dtype costs in quality and saves in bytes, measured against the f32 cache.

Both caches read the same text in lockstep, a chunk at a time, so only one chunk of
[tokens, vocab] logits is ever held; every position of the text is compared (KL, top-1), and
every token after the first is scored (perplexity). With llama.cpp as well (`--llamacpp`), its
caches of the same types are measured the same way against its own f32 cache, side by side.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from ..core.dtypes import parse_kv_dtype
from ..core.errors import OptionError
from ..core.numerics import log_softmax
from ..runtime import load
from .perplexity import token_nll

DEFAULT_TEXT = Path(__file__).parent / "data" / "long_text.txt"
STEP = 64


@dataclass(frozen=True)
class KVQuality:
    dtype: str  # "q8_0", or "q8_0/q4_0" for K / V
    kv_bytes: int
    saved_bytes: int  # against the f32 cache
    mean_kl: float  # KL(f32 || dtype), mean over positions
    top1: float  # argmax agreement with the f32 cache
    positions: int
    ppl: float  # of the text's tokens after the first, with this cache
    delta_ppl: float  # ppl - the f32 cache's ppl
    engine: str = "kiln"


def parse_pair(spec: str) -> tuple[str, str]:
    """'q8_0' -> (q8_0, q8_0); 'q8_0/q4_0' -> K q8_0, V q4_0."""
    k, _, v = spec.partition("/")
    return parse_kv_dtype(k.strip()).label, parse_kv_dtype((v or k).strip()).label


def _label(k: str, v: str) -> str:
    return k if k == v else f"{k}/{v}"


@dataclass
class _Reader:
    """One engine with one cache: reset(), then read(chunk) -> that chunk's logits [len, vocab]."""
    reset: Callable[[], None]
    read: Callable[[list[int]], np.ndarray]


def compare_caches(base: _Reader, other: _Reader, ids: list[int]) -> tuple[float, float, float, float]:
    """Mean KL(base || other), top-1 agreement, and both caches' mean NLL of ids[1:]."""
    base.reset()
    other.reset()
    kl_sum, agree, nll_base, nll_other = 0.0, 0, 0.0, 0.0
    prev_a = prev_b = None
    for i in range(0, len(ids), STEP):
        chunk = ids[i:i + STEP]
        a, b = base.read(chunk), other.read(chunk)
        lp, lq = log_softmax(a), log_softmax(b)
        kl_sum += float((np.exp(lp) * (lp - lq)).sum())
        agree += int((a.argmax(-1) == b.argmax(-1)).sum())
        rows_a = a[:-1] if prev_a is None else np.vstack([prev_a[None], a[:-1]])
        rows_b = b[:-1] if prev_b is None else np.vstack([prev_b[None], b[:-1]])
        targets = chunk[1:] if prev_a is None else chunk
        nll_base += float(token_nll(rows_a, targets).sum())
        nll_other += float(token_nll(rows_b, targets).sum())
        prev_a, prev_b = a[-1], b[-1]
    n_scored = len(ids) - 1
    return kl_sum / len(ids), agree / len(ids), nll_base / n_scored, nll_other / n_scored


def _llamacpp(path: Path, ctx: int, k: str, v: str) -> _Reader:
    from .llamacpp import LlamaCpp

    llm = LlamaCpp(path, n_ctx=ctx, kv_dtype_k=k, kv_dtype_v=v, n_batch=STEP)
    return _Reader(llm.reset, llm.extend)


def measure(model: str | os.PathLike[str], dtypes: list[str], text: str, ctx: int = 2048,
            prefill_chunk: int = 256, llamacpp: bool = False, log=lambda s: None) -> list[KVQuality]:
    """One row per dtype for kiln (and then for llama.cpp when asked), each engine's f32 cache first."""
    m = load(model, ctx=ctx, kv_dtype="f32", prefill_chunk=prefill_chunk, log=log)
    ids = m.tokenize(text)[:ctx]
    f32_bytes = m.compiled.planned.layout.kv.total_bytes
    pairs = [parse_pair(d) for d in dtypes]
    if not pairs:
        raise OptionError("kv_dtype (--kv-dtype): name at least one dtype to measure against f32")
    kv_bytes: dict[str, int] = {}

    def kiln(k: str, v: str) -> _Reader:
        other = load(model, ctx=ctx, kv_dtype_k=k, kv_dtype_v=v, prefill_chunk=prefill_chunk, log=log)
        kv_bytes[_label(k, v)] = other.compiled.planned.layout.kv.total_bytes
        return _Reader(other.reset, lambda chunk: other.prefill(chunk, logits="all"))

    engines = [("kiln", _Reader(m.reset, lambda chunk: m.prefill(chunk, logits="all")), kiln)]
    if llamacpp:
        engines.append(("llama.cpp", _llamacpp(m.spec.path, ctx, "f32", "f32"),
                        lambda k, v: _llamacpp(m.spec.path, ctx, k, v)))
    rows = []
    for engine, ref, make in engines:
        measured = []
        for k, v in pairs:
            kl, top1, nll_base, nll = compare_caches(ref, make(k, v), ids)
            measured.append((_label(k, v), kl, top1, math.exp(nll)))
            log(f"{engine} {_label(k, v)}: mean KL {kl:.3e}, top-1 {top1:.2%}, ppl {math.exp(nll):.4f}")
        ppl0 = math.exp(nll_base)
        rows.append(KVQuality("f32", f32_bytes, 0, 0.0, 1.0, len(ids), ppl0, 0.0, engine))
        rows += [KVQuality(label, kv_bytes[label], f32_bytes - kv_bytes[label], kl, top1, len(ids), ppl, ppl - ppl0,
                           engine) for label, kl, top1, ppl in measured]
    return rows


def render(rows: list[KVQuality], model: str, source: str) -> str:
    out = [f"kv-quality: {model}, {rows[0].positions} tokens of {source}; KL(f32 cache || dtype) per position, "
           "each engine against its own f32 cache",
           f"{'engine':<10} {'K/V':<10} {'KV bytes':>14} {'saved':>7} {'mean KL':>10} {'top-1':>8} {'ppl':>9} "
           f"{'d ppl':>8}"]
    for r in rows:
        saved = f"{100 * r.saved_bytes / (r.kv_bytes + r.saved_bytes):.1f}%" if r.saved_bytes else "-"
        out.append(f"{r.engine:<10} {r.dtype:<10} {r.kv_bytes:>14,} {saved:>7} {r.mean_kl:>10.2e} {r.top1:>8.2%} "
                   f"{r.ppl:>9.4f} {r.delta_ppl:>+8.4f}")
    return "\n".join(out) + "\n"
