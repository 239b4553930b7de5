"""The C instance behind a Model (runtime_c/instance.c): the mapped weights, the KV pool, the
recurrent state slots, the arena and the threads, and every call into them.

It is the one owner of the sequences' state. A Sequence holds its id here; the Model, the decoding
loops, speculation and the server's caches act on sequences, and every one of their calls comes
down to this object: under its lock, a failed status raised as the error that says what to do
(status.py). It knows nothing of text or sampling, so the modules above it import it, never the
other way round.
"""
from __future__ import annotations

import os
import threading
from collections.abc import Sequence as SequenceABC
from pathlib import Path

import numpy as np

from ..driver import Compiled
from .status import ModelError, status_error
from .topology import default_threads


class Instance:
    def __init__(self, compiled: Compiled, weights_path: str | os.PathLike[str] | None = None,
                 threads: int | None = None):
        self.compiled = compiled
        self.spec, self.options = compiled.planned.spec, compiled.planned.options
        self.path = Path(weights_path) if weights_path is not None else self.spec.path
        self.ffi, self.lib = compiled.module.ffi, compiled.module.lib
        layout = compiled.planned.layout
        self.windows = tuple(g.window or 0 for g in layout.kv.groups)  # per group; 0: full context
        # a hybrid's recurrent layers keep a state slot per sequence: positions can be neither dropped from
        # it (rollback, context shift) nor borrowed from another sequence's pages (a prefix cache's)
        self.recurrent = layout.state is not None
        self.lock = threading.RLock()
        handle = self.ffi.new("kiln_model **")
        packed = str(compiled.packed_path).encode() if compiled.packed_path else self.ffi.NULL
        self.n_vocab, self.n_ctx = self.spec.hparams.n_vocab, self.options.ctx  # for the messages of a failed open
        self.check(self.lib.kiln_open(handle, str(self.path).encode(), packed, threads or default_threads()))
        self.handle = self.ffi.gc(handle[0], self.lib.kiln_close)
        self.n_vocab, self.n_ctx = int(self.lib.kiln_n_vocab(self.handle)), int(self.lib.kiln_n_ctx(self.handle))
        self.n_out = int(self.lib.kiln_n_out(self.handle))  # n_vocab logits, or an embedding model's n_embd
        self.n_groups = int(self.lib.kiln_n_groups(self.handle))
        self.page_size = int(self.lib.kiln_page_size(self.handle))

    # -- calls -----------------------------------------------------------------------------
    def check(self, status: int, seq=None, rows: int = 0) -> int:
        """A negative status becomes a ModelError that says what to do (seq: the Sequence it concerns)."""
        if status < 0:
            raise status_error(self, status, seq, rows)
        return status

    def call(self, fn, *args, seq=None, rows: int = 0) -> int:
        """fn(instance, *args) under the lock."""
        with self.lock:
            status = fn(self.handle, *args)
        return self.check(status, seq, rows)

    def buffer(self, array, ctype: str | None = None):
        """A numpy array or bytearray as the C pointer a call takes."""
        ptr = self.ffi.from_buffer(array)
        return self.ffi.cast(ctype, ptr) if ctype else ptr

    @property
    def n_threads(self) -> int:
        return int(self.lib.kiln_n_threads(self.handle))

    def kv_stats(self) -> dict:
        """The pool's pages (summed over layer groups, and per group) and what the sequences hold."""
        lib, groups = self.lib, []
        with self.lock:
            for g in self.compiled.planned.layout.kv.groups:
                used = int(lib.kiln_pages_used(self.handle, g.index))
                groups.append({"window": g.window, "layers": len(g.layers), "pages_total": g.n_pages,
                               "pages_used": used, "pages_free": g.n_pages - used, "page_bytes": g.page_bytes})
            past = [int(lib.kiln_seq_n_past(self.handle, s)) for s in range(self.options.n_seq)]
        total, used = sum(g["pages_total"] for g in groups), sum(g["pages_used"] for g in groups)
        return {"pages_total": total, "pages_used": used, "pages_free": total - used,
                "utilization": used / total if total else 0.0, "sequences": sum(p >= 0 for p in past),
                "tokens_cached": sum(p for p in past if p > 0), "page_size": self.options.page_size,
                "groups": groups}

    # -- what the calls take -----------------------------------------------------------------
    def tokens(self, ids) -> np.ndarray:
        tokens = np.ascontiguousarray(ids, dtype=np.int64)
        if tokens.ndim != 1 or tokens.size == 0:
            raise ModelError("expected a non-empty 1-D sequence of token ids")
        bad = np.flatnonzero((tokens < 0) | (tokens >= self.n_vocab))
        if bad.size:
            raise ModelError(f"token id {int(tokens[bad[0]])} at index {int(bad[0])} is out of range [0, {self.n_vocab})")
        return tokens.astype(np.int32)

    def pages(self, pages) -> np.ndarray:
        pages = np.ascontiguousarray(pages, dtype=np.int32)
        if pages.ndim != 2 or pages.shape[1] != self.n_groups:
            raise ModelError(f"expected pages of shape [n_blocks, {self.n_groups}], got {list(pages.shape)}")
        return pages

    def sinks(self, tokens: SequenceABC[int], sinks: int) -> int:
        """Positions a context shift keeps: `sinks`, plus the BOS token when the sequence starts with
        one (llama.cpp keeps it on top of --keep)."""
        bos = self.spec.tokenizer.bos_id
        return sinks + (1 if bos is not None and self.spec.tokenizer.add_bos and tokens[:1] == [bos] else 0)

    # -- steps -------------------------------------------------------------------------------
    def eval(self, seq, ids, logits_all: bool) -> np.ndarray:
        """kiln_eval: ids appended to seq in steps of the prefill chunk; the last row's logits, or all."""
        tokens = self.tokens(ids)
        out = np.empty((tokens.size if logits_all else 1, self.n_out), dtype=np.float32)
        self.call(self.lib.kiln_eval, seq.live(), self.buffer(tokens, "int32_t *"), tokens.size,
                  self.buffer(out, "float *"), int(logits_all), seq=seq)
        seq.tokens.extend(int(t) for t in tokens)
        return out if logits_all else out[0]

    def step(self, items, rows_wanted: SequenceABC[str | None]) -> np.ndarray:
        """kiln_step over items, (Sequence, token or ids) each; each item's logits rows: "all", its
        "last", or None."""
        if not items:
            raise ModelError(f"a step takes 1 to {self.options.batch_tokens} rows (batch_tokens, --batch-tokens), got 0")
        rows, seqs, want = [], [], []
        for (seq, toks), wanted in zip(items, rows_wanted):
            if getattr(seq, "instance", None) is not self:
                raise ModelError(f"step: {seq!r} is not a sequence of this model")
            ids = self.tokens([toks] if np.ndim(toks) == 0 else toks)
            rows.append(ids)
            seqs += [seq.live()] * ids.size
            want += [int(wanted == "all")] * (ids.size - 1) + [int(wanted is not None)]
        tokens = np.concatenate(rows)
        seq_arr, want_arr = np.array(seqs, np.int32), np.array(want, np.int8)
        out = np.empty((int(want_arr.sum()), self.n_out), dtype=np.float32)
        batch = self.ffi.new("kiln_batch *", {"n": tokens.size, "token": self.buffer(tokens, "int32_t *"),
                                              "seq": self.buffer(seq_arr, "int32_t *"),
                                              "logits": self.buffer(want_arr, "int8_t *")})
        first = items[0][0] if len({s.id for s, _ in items}) == 1 else None
        self.call(self.lib.kiln_step, batch, self.buffer(out, "float *"), seq=first, rows=tokens.size)
        for (seq, _), ids in zip(items, rows):
            seq.tokens.extend(int(t) for t in ids)
        return out
