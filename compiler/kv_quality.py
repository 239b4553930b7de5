"""What a KV-cache dtype costs in quality and saves in bytes, measured against the f32 cache.

Both models read the same text in lockstep, a chunk at a time, so only one chunk of
[tokens, vocab] logits is ever held; every position of the text is compared.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .model import Model, load

DEFAULT_TEXT = Path(__file__).parent / "data" / "long_text.txt"
STEP = 64


@dataclass(frozen=True)
class KVQuality:
    dtype: str
    kv_bytes: int
    saved_bytes: int  # against the f32 cache
    mean_kl: float  # KL(f32 || dtype), mean over positions
    top1: float  # argmax agreement with the f32 cache
    positions: int


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    x -= x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def compare_caches(base: Model, other: Model, ids: list[int]) -> tuple[float, float]:
    base.reset()
    other.reset()
    kl_sum, agree = 0.0, 0
    for i in range(0, len(ids), STEP):
        a, b = base.prefill(ids[i:i + STEP], logits="all"), other.prefill(ids[i:i + STEP], logits="all")
        lp, lq = _log_softmax(a), _log_softmax(b)
        kl_sum += float((np.exp(lp) * (lp - lq)).sum())
        agree += int((a.argmax(-1) == b.argmax(-1)).sum())
    return kl_sum / len(ids), agree / len(ids)


def measure(model: str | os.PathLike[str], dtypes: list[str], text: str, ctx: int = 2048,
            prefill_chunk: int = 256, log=lambda s: None) -> list[KVQuality]:
    base = load(model, ctx=ctx, kv_dtype="f32", prefill_chunk=prefill_chunk, log=log)
    ids = base.tokenize(text)[:ctx]
    f32_bytes = base.compiled.decode.layout.kv.total_bytes
    rows = [KVQuality("f32", f32_bytes, 0, 0.0, 1.0, len(ids))]
    for dtype in dtypes:
        other = load(model, ctx=ctx, kv_dtype=dtype, prefill_chunk=prefill_chunk, log=log)
        kv_bytes = other.compiled.decode.layout.kv.total_bytes
        kl, top1 = compare_caches(base, other, ids)
        rows.append(KVQuality(dtype, kv_bytes, f32_bytes - kv_bytes, kl, top1, len(ids)))
        log(f"{dtype}: mean KL {kl:.3e}, top-1 {top1:.2%}")
    return rows


def render(rows: list[KVQuality], model: str, source: str) -> str:
    out = [f"kv-quality: {model}, {rows[0].positions} tokens of {source}; KL(f32 cache || dtype) per position",
           f"{'dtype':<6} {'KV bytes':>14} {'saved':>8} {'mean KL':>10} {'top-1':>8}"]
    for r in rows:
        saved = f"{100 * r.saved_bytes / rows[0].kv_bytes:.1f}%" if r.saved_bytes else "-"
        out.append(f"{r.dtype:<6} {r.kv_bytes:>14,} {saved:>8} {r.mean_kl:>10.2e} {r.top1:>8.2%}")
    return "\n".join(out) + "\n"
