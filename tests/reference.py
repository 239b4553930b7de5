"""llama.cpp (through llama-cpp-python) as the reference kiln is measured against."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import llama_cpp
from llama_cpp import Llama

from compiler.bench import LLAMACPP_KV_TYPES, flash_attn_settings


class Reference:
    """llama.cpp holding its KV cache in `kv_dtype` (or K in kv_dtype_k, V in kv_dtype_v), as
    kiln's is compared with it. A quantized V cache needs llama.cpp's flash-attention path; the
    others keep its default. swa_full keeps every position of the sliding-window layers, which
    llama.cpp needs to shift them."""

    def __init__(self, path: Path, n_ctx: int = 1024, kv_dtype: str = "f16", kv_dtype_k: str | None = None,
                 kv_dtype_v: str | None = None, swa_full: bool = False):
        k, v = kv_dtype_k or kv_dtype, kv_dtype_v or kv_dtype
        self.llm = Llama(model_path=str(path), n_ctx=n_ctx, n_batch=512, logits_all=True, n_threads=2,
                         verbose=False, seed=0, type_k=LLAMACPP_KV_TYPES[k], type_v=LLAMACPP_KV_TYPES[v],
                         swa_full=swa_full, **({"flash_attn": True} if "fa off" not in flash_attn_settings(v) else {}))

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        return self.llm.tokenize(text.encode(), add_bos=add_special, special=parse_special)

    def logits(self, ids: list[int]) -> np.ndarray:
        """Teacher-forced logits [len(ids), vocab] from a fresh context."""
        self.llm.reset()
        self.llm.eval(ids)
        return np.array(self.llm.scores[: len(ids)], dtype=np.float64)

    def extend(self, ids: list[int]) -> np.ndarray:
        """Append ids to what the context holds; their logits [len(ids), vocab]."""
        start = self.llm.n_tokens
        self.llm.eval(ids)
        return np.array(self.llm.scores[start:start + len(ids)], dtype=np.float64)

    def shift(self, n_keep: int, n_discard: int) -> None:
        """llama.cpp's context shift: remove positions [n_keep, n_keep + n_discard) and move the
        rest down by n_discard (the keys are rotated at the next decode)."""
        n_past = self.llm.n_tokens
        mem = llama_cpp.llama_get_memory(self.llm.ctx)
        assert llama_cpp.llama_memory_seq_rm(mem, 0, n_keep, n_keep + n_discard)
        llama_cpp.llama_memory_seq_add(mem, 0, n_keep + n_discard, n_past, -n_discard)
        ids = self.llm.input_ids[:n_past].copy()
        kept = np.r_[ids[:n_keep], ids[n_keep + n_discard:]]
        self.llm.input_ids[:kept.size] = kept
        self.llm.n_tokens = int(kept.size)

    def greedy(self, ids: list[int], n: int) -> list[int]:
        """llama.cpp's own greedy continuation of `ids`, n tokens long."""
        self.llm.reset()
        self.llm.eval(ids)
        out: list[int] = []
        for _ in range(n):
            tok = int(np.argmax(self.llm.scores[self.llm.n_tokens - 1]))
            out.append(tok)
            self.llm.eval([tok])
        return out


@dataclass(frozen=True)
class Agreement:
    mean_kl: float
    top1: float
    max_abs: float
    positions: int


def compare(ref_logits: np.ndarray, kiln_logits: np.ndarray) -> Agreement:
    """KL(llama.cpp || kiln) and top-1 agreement over the rows given."""
    def log_softmax(x):
        x = x.astype(np.float64)
        x = x - x.max(axis=-1, keepdims=True)
        return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))

    lp, lq = log_softmax(ref_logits), log_softmax(kiln_logits)
    kl = (np.exp(lp) * (lp - lq)).sum(axis=-1)
    top1 = (ref_logits.argmax(-1) == kiln_logits.argmax(-1)).mean()
    return Agreement(float(kl.mean()), float(top1), float(np.abs(ref_logits - kiln_logits).max()), len(kl))
