"""llama.cpp through llama-cpp-python, as the engine kiln is compared with (kv-quality, the tests).

It drives llama.cpp's batch API itself and copies out only the rows of logits it is asked for:
llama-cpp-python's logits_all keeps an [n_ctx, vocab] array, 2 GB for Gemma's 262k vocabulary
at 2,048 positions.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .bench import LLAMACPP_KV_TYPES, flash_attn_settings
from ..core.errors import KilnError

try:
    import llama_cpp
    from llama_cpp import Llama
    from llama_cpp._internals import LlamaBatch
except ImportError:
    raise KilnError("this needs llama.cpp: install llama-cpp-python (`make dev` builds it)") from None


class LlamaCpp:
    """llama.cpp holding its KV cache in `kv_dtype` (or K in kv_dtype_k, V in kv_dtype_v), as
    kiln's is compared with it. A quantized V cache needs llama.cpp's flash-attention path; the
    others keep its default. swa_full keeps every position of the sliding-window layers, which
    llama.cpp needs to shift them."""

    def __init__(self, path: Path, n_ctx: int = 1024, kv_dtype: str = "f16", kv_dtype_k: str | None = None,
                 kv_dtype_v: str | None = None, swa_full: bool = False, n_batch: int = 256):
        k, v = kv_dtype_k or kv_dtype, kv_dtype_v or kv_dtype
        self.llm = Llama(model_path=str(path), n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_batch, logits_all=False,
                         n_threads=2, verbose=False, seed=0, type_k=LLAMACPP_KV_TYPES[k], type_v=LLAMACPP_KV_TYPES[v],
                         swa_full=swa_full, **({"flash_attn": True} if "fa off" not in flash_attn_settings(v) else {}))
        self.n_batch, self.n_vocab = n_batch, self.llm.n_vocab()
        self.batch = LlamaBatch(n_tokens=n_batch, embd=0, n_seq_max=1)
        self.n_past = 0

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        return self.llm.tokenize(text.encode(), add_bos=add_special, special=parse_special)

    def reset(self) -> None:
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(self.llm.ctx), True)
        self.n_past = 0

    def _read(self, ids: list[int], rows) -> np.ndarray:
        """Append ids at n_past; the logits of ids[i] for i in rows, [len(rows), vocab] float32."""
        rows = list(rows)
        want, out = set(rows), {}
        for start in range(0, len(ids), self.n_batch):
            part = ids[start:start + self.n_batch]
            b = self.batch.batch
            b.n_tokens = len(part)
            for j, tok in enumerate(part):
                b.token[j], b.pos[j], b.n_seq_id[j], b.seq_id[j][0] = tok, self.n_past + j, 1, 0
                b.logits[j] = (start + j) in want
            if llama_cpp.llama_decode(self.llm.ctx, b) != 0:
                raise RuntimeError("llama_decode failed")
            for j in range(len(part)):
                if (start + j) in want:
                    ptr = llama_cpp.llama_get_logits_ith(self.llm.ctx, j)
                    out[start + j] = np.ctypeslib.as_array(ptr, shape=(self.n_vocab,)).copy()
            self.n_past += len(part)
        return np.stack([out[i] for i in rows]) if rows else np.zeros((0, self.n_vocab), np.float32)

    def logits(self, ids: list[int], rows=None) -> np.ndarray:
        """Teacher-forced logits of `rows` of ids (default all) from a fresh context."""
        self.reset()
        return self._read(ids, range(len(ids)) if rows is None else rows)

    def feed(self, ids: list[int]) -> None:
        """Append ids to what the context holds, keeping no logits."""
        self._read(ids, [])

    def extend(self, ids: list[int]) -> np.ndarray:
        """Append ids to what the context holds; their logits [len(ids), vocab]."""
        return self._read(ids, range(len(ids)))

    def shift(self, sinks: int, n_discard: int) -> None:
        """llama.cpp's context shift: remove positions [sinks, sinks + n_discard) and move the
        rest down by n_discard (the keys are rotated at the next decode)."""
        mem = llama_cpp.llama_get_memory(self.llm.ctx)
        assert llama_cpp.llama_memory_seq_rm(mem, 0, sinks, sinks + n_discard)
        llama_cpp.llama_memory_seq_add(mem, 0, sinks + n_discard, self.n_past, -n_discard)
        self.n_past -= n_discard

    def greedy(self, ids: list[int], n: int) -> list[int]:
        """llama.cpp's own greedy continuation of `ids`, n tokens long."""
        last = self.logits(ids, [len(ids) - 1])[0]
        out: list[int] = []
        for _ in range(n):
            out.append(int(np.argmax(last)))
            last = self._read(out[-1:], [0])[0]
        return out
