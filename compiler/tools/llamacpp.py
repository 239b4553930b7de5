"""llama.cpp, the engine kiln is measured against, through llama-cpp-python's bindings of its C API.

One driver serves every comparison: the tests' reference logits, kv-quality, kiln bench (one
sequence) and kiln bench --batch (many sequences in one llama_batch, as llama-batched-bench runs
them). It drives llama_decode itself and copies out only the rows of logits it is asked for:
llama-cpp-python's logits_all would keep an [n_ctx, vocab] array, 2 GB for Gemma's 262k
vocabulary at 2,048 positions.
"""
from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np

from ..core.dtypes import DType, parse_kv_dtype
from ..core.errors import KilnError
from ..core.options import CompileOptions

try:
    import llama_cpp as L
except ImportError:
    raise KilnError("this compares with llama.cpp: install llama-cpp-python (`make dev` builds it)") from None


def flash_attn_settings(kv_dtype_v: str) -> dict[str, bool]:
    """The llama.cpp settings a comparison runs: flash attention off and on, except that
    llama.cpp keeps a quantized V cache only with its flash-attention path."""
    return {"fa off": False, "fa on": True} if kv_dtype_v in ("f32", "f16") else {"fa on": True}


_QUIET = L.llama_log_callback(lambda level, text, user_data: None)  # kept alive: llama.cpp calls it
L.llama_log_set(_QUIET, ctypes.c_void_p())
L.llama_backend_init()


class LlamaCpp:
    """A llama.cpp context holding its KV cache in `kv_dtype` (or K in kv_dtype_k, V in kv_dtype_v),
    by default kiln's own default, so that a comparison measures the engines and not the caches.

    flash_attn None: off, unless the V cache is quantized, which llama.cpp holds only on its
    flash-attention path. swa_full keeps every position of the sliding-window layers, which
    llama.cpp needs to shift them. n_seq > 1 makes one unified cache for that many sequences.
    eval_callback(tensor, ask) -> bool sees the graph's nodes (llama.cpp's cb_eval, for tests that
    read its intermediate tensors). The one-sequence methods (logits, feed, extend, shift, greedy)
    use sequence 0."""

    ctx = None  # until a context is made: close() (and so __del__) after a failed load has nothing to free

    def __init__(self, path: str | Path, n_ctx: int = 1024, kv_dtype: str | DType = CompileOptions.kv_dtype,
                 kv_dtype_k: str | None = None, kv_dtype_v: str | None = None, swa_full: bool = False,
                 n_batch: int = 256, threads: int = 2, flash_attn: bool | None = None, n_seq: int = 1,
                 eval_callback=None, pooling: int | None = None):
        k, v = (parse_kv_dtype(t) for t in (kv_dtype_k or kv_dtype, kv_dtype_v or kv_dtype))
        self.model = L.llama_model_load_from_file(str(path).encode(), L.llama_model_default_params())
        if not self.model:
            raise KilnError(f"{path}: llama.cpp could not load it")
        cp = L.llama_context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_seq_max = n_ctx, n_batch, n_batch, n_seq
        cp.kv_unified = n_seq > 1
        cp.n_threads = cp.n_threads_batch = threads
        cp.type_k, cp.type_v = k.value.value, v.value.value
        cp.flash_attn_type = int(flash_attn if flash_attn is not None else "fa off" not in flash_attn_settings(v.label))
        cp.swa_full = swa_full
        if pooling is not None:  # an embedding context: each sequence's pooled vector (llama.cpp's pooling_type)
            cp.embeddings, cp.pooling_type = True, pooling
        if eval_callback is not None:  # kept alive as long as the context, which calls it
            self._cb_eval = L.ggml_backend_sched_eval_callback(lambda t, ask, user: eval_callback(t, ask))
            cp.cb_eval = self._cb_eval
        self.ctx = L.llama_init_from_model(self.model, cp)
        if not self.ctx:
            L.llama_model_free(self.model)
            raise KilnError(f"{path}: llama.cpp could not make a context of {n_ctx} positions for {n_seq} sequence(s)")
        self.vocab = L.llama_model_get_vocab(self.model)
        self.n_batch, self.n_vocab = n_batch, L.llama_vocab_n_tokens(self.vocab)
        self.batch = L.llama_batch_init(n_batch, 0, 1)
        self.n_past = 0

    def close(self) -> None:
        if self.ctx:
            L.llama_batch_free(self.batch)
            L.llama_free(self.ctx)
            L.llama_model_free(self.model)
            self.ctx = None

    def __del__(self):
        self.close()

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        data = text.encode()
        n = len(data) + 8
        while True:
            ids = (L.llama_token * n)()
            got = L.llama_tokenize(self.vocab, data, len(data), ids, n, add_special, parse_special)
            if got >= 0:
                return list(ids[:got])
            n = -got

    def reset(self) -> None:
        L.llama_memory_clear(L.llama_get_memory(self.ctx), True)
        self.n_past = 0

    def decode(self, rows: list[tuple[int, int, int, bool]]) -> None:
        """One llama_decode of rows (token, position, sequence, logits wanted), at most n_batch."""
        b = self.batch
        for i, (tok, pos, seq, want) in enumerate(rows):
            b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = tok, pos, 1, want
            b.seq_id[i][0] = seq
        b.n_tokens = len(rows)
        if L.llama_decode(self.ctx, b) != 0:
            raise KilnError("llama.cpp: llama_decode failed")

    def row_logits(self, i: int) -> np.ndarray:
        """The logits of the last decode's row i (one it wanted), copied."""
        return np.ctypeslib.as_array(L.llama_get_logits_ith(self.ctx, i), shape=(self.n_vocab,)).copy()

    def _read(self, ids: list[int], rows) -> np.ndarray:
        """Append ids at n_past; the logits of ids[i] for i in rows, [len(rows), vocab] float32."""
        rows = list(rows)
        want, out = set(rows), {}
        for start in range(0, len(ids), self.n_batch):
            part = ids[start:start + self.n_batch]
            self.decode([(tok, self.n_past + j, 0, start + j in want) for j, tok in enumerate(part)])
            for j in range(len(part)):
                if start + j in want:
                    out[start + j] = self.row_logits(j)
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

    def eval(self, ids: list[int]) -> np.ndarray:
        """Append ids; the last one's logits (what a prefill or a decode step gives a caller)."""
        return self._read(ids, [len(ids) - 1])[0]

    def embed(self, inputs: list[list[int]]) -> list[np.ndarray]:
        """Each input's pooled vector (an embedding context), inputs packed as llama.cpp's embedding
        example packs them: whole, up to n_batch tokens and n_seq sequences a decode."""
        n_embd, out = L.llama_model_n_embd(self.model), []
        n_seq = L.llama_n_seq_max(self.ctx)
        at = 0
        while at < len(inputs):
            rows, take = [], []
            while at < len(inputs) and len(take) < n_seq and len(rows) + len(inputs[at]) <= self.n_batch:
                rows += [(tok, j, len(take), True) for j, tok in enumerate(inputs[at])]
                take.append(at)
                at += 1
            if not take:
                raise KilnError(f"input {at} has {len(inputs[at])} tokens, over n_batch {self.n_batch}")
            mem = L.llama_get_memory(self.ctx)
            if mem:
                L.llama_memory_clear(mem, True)
            self.decode(rows)
            out += [np.ctypeslib.as_array(L.llama_get_embeddings_seq(self.ctx, s), shape=(n_embd,)).copy()
                    for s in range(len(take))]
        return out

    def shift(self, sinks: int, n_discard: int) -> None:
        """llama.cpp's context shift: remove positions [sinks, sinks + n_discard) and move the
        rest down by n_discard (the keys are rotated at the next decode)."""
        mem = L.llama_get_memory(self.ctx)
        assert L.llama_memory_seq_rm(mem, 0, sinks, sinks + n_discard)
        L.llama_memory_seq_add(mem, 0, sinks + n_discard, self.n_past, -n_discard)
        self.n_past -= n_discard

    def greedy(self, ids: list[int], n: int) -> list[int]:
        """llama.cpp's own greedy continuation of `ids`, n tokens long."""
        last = self.logits(ids, [len(ids) - 1])[0]
        out: list[int] = []
        for _ in range(n):
            out.append(int(np.argmax(last)))
            last = self._read(out[-1:], [0])[0]
        return out
