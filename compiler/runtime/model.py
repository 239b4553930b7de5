"""The Python face of a compiled model: `compiler.load(...)` returns a Model.

Python does no per-op work: each call is one C call that runs whole steps. Each Model owns
its own C instance (weights mapping, KV pool, arena), so any number can live in one process.
A Model holds up to n_seq sequences (`m.sequence()`); `m.step` runs rows of several in one
step. The single-sequence calls (`m.prefill`, `m.decode`, `m.generate`, ...) act on a default
sequence, opened on first use. A lock serialises every call into C, so several Python threads
may share a Model.
"""
from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Iterator, Sequence as SequenceABC
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import numpy as np

from ..build.cc import CSource, header_cdef, load_extension, runtime_sources
from ..codegen import Generated, generate
from ..core.errors import KilnError, OptionError
from .generation import Decoding, stop_list
from ..ir.graph import Mode
from ..core.options import CompileOptions
from ..build.packing import packed_file
from ..driver import Planned, plan
from ..core.progress import as_progress
from ..core.paths import RUNTIME_DIR, cache_dir
from ..frontend.registry import resolve
from .sampling import SamplingParams
from ..text.tokenizer import make_tokenizer


class ModelError(KilnError):
    """A call on a loaded model was refused (bad token or sequence, full context or pool, bad rollback, wrong weights)."""


class PoolFullError(ModelError):
    """The KV pool has too few free pages for the step; nothing was changed. A scheduler frees
    pages (evicts cached prefixes, preempts a sequence) and tries again."""


@dataclass(frozen=True)
class Compiled:
    decode: Planned
    prefill: Planned
    source: Generated
    source_dir: Path
    c_source: CSource  # what the extension was built from; build_c_library builds the same C without Python
    module: ModuleType
    packed_path: Path | None  # the packed weights file the library maps; None: every weight from the GGUF


def compile_model(model: str | os.PathLike[str], opts: CompileOptions, sanitize: bool = False,
                  log=lambda s: None, profile: bool = False, target: str = "native") -> Compiled:
    """Plan, generate, build and pack `model`; each stage cached. `log` is a message callable
    or a progress.Progress, which then shows the stages. `profile` builds the library that
    times every op (Model.op_seconds)."""
    p = as_progress(log)
    with p.stage("fetch"):
        path = resolve(model, p)
    with p.stage("plan"):
        decode, prefill = plan(path, opts, Mode.DECODE, p), plan(path, opts, Mode.PREFILL, p)
        p.note(f"decode {len(decode.graph.nodes)} ops, prefill {len(prefill.graph.nodes)} ops, "
               f"arena {decode.layout.activation_bytes + prefill.layout.activation_bytes:,} bytes, "
               f"KV pool {decode.layout.kv.total_bytes:,} bytes")
    with p.stage("generate"):
        src = generate(decode, prefill)
        digest = hashlib.sha256((src.model_c + src.model_h).encode()).hexdigest()[:24]
        src_dir = cache_dir() / "src" / digest
        if not (src_dir / "model.c").is_file():
            src_dir.mkdir(parents=True, exist_ok=True)
            for name, text in (("model.h", src.model_h), ("model.c", src.model_c)):
                tmp = src_dir / f".{name}.{os.getpid()}"
                tmp.write_text(text)
                os.replace(tmp, src_dir / name)
        p.note(f"model.c {src.model_c.count(chr(10)):,} lines in {src_dir}")
    cdef = header_cdef(RUNTIME_DIR / "status.h") + "\n" + header_cdef(src_dir / "model.h")
    c_source = CSource("model", cdef, '#include "model.h"', (src_dir / "model.c", *runtime_sources()), (src_dir,),
                       sanitize, ("KILN_PROFILE",) if profile else (), target)
    with p.stage("cc"):
        module = load_extension(c_source, p)
    with p.stage("pack"):
        packed = packed_file(decode.spec, decode.layout.packed, cache_dir(), module.lib, p)
    return Compiled(decode, prefill, src, src_dir, c_source, module, packed)


class Sequence:
    """One sequence of a Model: its own positions in the shared KV pool. Close it (or use it
    as a context manager) to give its pages back."""

    def __init__(self, model: "Model", seq_id: int):
        self.model, self.id = model, seq_id
        self.tokens: list[int] = []  # what the cache holds, for prefix reuse
        self.exact = True  # the cache is what prefilling `tokens` gives (not after a shift); prefix caches need it
        self.closed = False

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"n_past={self.n_past}"
        return f"<kiln Sequence {self.id} {state}>"

    def __enter__(self) -> "Sequence":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _live(self) -> int:
        if self.closed:
            raise ModelError(f"sequence {self.id} is closed; open another with m.sequence()")
        return self.id

    @property
    def n_past(self) -> int:
        """Positions the sequence holds."""
        return self.model._call(self.model._lib.kiln_seq_n_past, self._live(), seq=self)

    def prefill(self, ids, logits: str = "last") -> np.ndarray:
        """Append `ids`; the last token's logits [vocab], or all of them [len(ids), vocab]."""
        if logits not in ("last", "all"):
            raise OptionError(f"logits must be 'last' or 'all', got {logits!r}")
        return self.model._eval(self, ids, logits == "all")

    def decode(self, token: int) -> np.ndarray:
        """Append one token; its logits [vocab]."""
        return self.model._eval(self, [token], False)

    def rollback(self, n: int) -> None:
        """Keep the first `n` positions."""
        m = self.model
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 0 <= n <= self.n_past:
            raise ModelError(f"rollback({n!r}): sequence {self.id} holds n_past={self.n_past} positions")
        m._call(m._lib.kiln_seq_rollback, self._live(), int(n), seq=self)
        del self.tokens[n:]

    def reset(self) -> None:
        self.model._call(self.model._lib.kiln_seq_reset, self._live(), seq=self)
        self.tokens.clear()
        self.exact = True

    def keep(self, positions) -> None:
        """Keep only `positions` (strictly increasing, each < n_past), in order: the sequence then
        holds len(positions) of them, each key rotated to its new position, as if the text had
        been those tokens all along (the attention states themselves are not recomputed)."""
        m = self.model
        keep = np.ascontiguousarray(positions, dtype=np.int64)
        n_past = self.n_past
        if keep.ndim != 1 or (keep.size and (keep[0] < 0 or keep[-1] >= n_past or np.any(np.diff(keep) <= 0))):
            raise ModelError(f"keep: positions must be strictly increasing within [0, {n_past}) "
                             f"(sequence {self.id} holds n_past={n_past})")
        keep32 = keep.astype(np.int32)
        m._call(m._lib.kiln_seq_keep, self._live(), m._ffi.cast("int32_t *", m._ffi.from_buffer(keep32)),
                keep32.size, seq=self)
        self.tokens = [self.tokens[i] for i in keep] if len(self.tokens) == n_past else []
        self.exact = self.exact and bool(np.array_equal(keep, np.arange(keep.size)))

    def shift(self, n_keep: int = 4, n_discard: int | None = None) -> int:
        """A context shift (StreamingLLM, llama.cpp's --context-shift): keep the first n_keep
        positions (the attention sinks), drop the n_discard after them (default: half of the
        rest), and move the remainder down. Returns the positions now held."""
        n_past = self.n_past
        if isinstance(n_keep, bool) or not isinstance(n_keep, (int, np.integer)) or not 0 <= n_keep <= n_past:
            raise ModelError(f"shift: n_keep must be between 0 and n_past={n_past}, got {n_keep!r}")
        if n_discard is None:
            n_discard = max(1, (n_past - n_keep) // 2)
        if isinstance(n_discard, bool) or not isinstance(n_discard, (int, np.integer)) \
                or not 1 <= n_discard <= n_past - n_keep:
            raise ModelError(f"shift: n_discard must be between 1 and n_past - n_keep = {n_past - n_keep}, "
                             f"got {n_discard!r}")
        self.keep(np.r_[0:n_keep, n_keep + n_discard:n_past])
        return n_past - n_discard

    def attention_mass(self) -> np.ndarray:
        """[n_past]: the attention each position has received since it was written (summed over
        heads, layers and queries), while m.track_attention(True) is on."""
        m = self.model
        with m._lock:
            n = int(m._lib.kiln_seq_n_past(m._m, self._live()))
            out = np.zeros(max(n, 0), np.float32)
            status = m._lib.kiln_seq_attention(m._m, self.id, m._ffi.cast("float *", m._ffi.from_buffer(out)), n)
        if status == m._lib.KILN_E_ARG:
            raise ModelError("attention_mass: call m.track_attention(True) first")
        m._check(status, seq=self)
        return out

    def share(self, first_block: int, n_blocks: int) -> np.ndarray:
        """The pages of full blocks [first_block, first_block + n_blocks), [n_blocks, n_groups]
        (-1 where a sliding group has let a block go), with a reference taken on each for the
        caller, which keeps them alive after the sequence moves on or closes. A prefix cache
        holds them this way; give them back with m.release_pages."""
        m = self.model
        pages = np.empty((max(n_blocks, 0), m.n_groups), np.int32)
        m._call(m._lib.kiln_seq_share, self._live(), int(first_block), int(n_blocks),
                m._ffi.cast("int32_t *", m._ffi.from_buffer(pages)), seq=self)
        return pages

    def save(self, path: str | os.PathLike[str]) -> int:
        """Write the sequence's KV cache and tokens to a file (kv_file.py); returns its size in bytes.
        m.sequence_from(path) gives them back, bit for bit."""
        from . import kv_file

        m = self.model
        with m._lock:
            size = int(m._lib.kiln_seq_state_size(m._m, self._live()))
            state = bytearray(size)
            m._check(m._lib.kiln_seq_state_save(m._m, self.id, m._ffi.from_buffer(state), size), seq=self)
            tokens = list(self.tokens)
        if len(tokens) != self.n_past:
            raise ModelError(f"save: sequence {self.id} holds {self.n_past} positions but knows {len(tokens)} "
                             "of their tokens")
        return kv_file.write(path, m, tokens, bytes(state), self.exact)

    def fork(self) -> "Sequence":
        """A new sequence holding the same positions: full pages are shared, a page either
        writes into is copied first."""
        m = self.model
        child = Sequence(m, m._call(m._lib.kiln_seq_fork, self._live(), seq=self))
        child.tokens, child.exact = list(self.tokens), self.exact
        return child

    def close(self) -> None:
        if not self.closed:
            self.model._call(self.model._lib.kiln_seq_close, self.id, seq=self)
            self.closed = True
            self.tokens.clear()

    def generate(self, prompt: str | list[int], max_tokens: int = 128, temperature: float = 0.8, top_k: int = 40,
                 top_p: float = 0.95, min_p: float = 0.05, repeat_penalty: float = 1.0, seed: int | None = None,
                 stop: list[str] | str | None = None, stream: bool = False, context_shift: bool = False,
                 n_keep: int = 4) -> str | Iterator[str]:
        """Continue `prompt` (text, or token ids). Returns the text, or yields it piece by piece if stream.
        The cache is reused: the prompt's longest prefix already held is not prefilled again.
        A full context ends generation, or with context_shift shifts the sequence (keeping n_keep
        sinks, plus the BOS token as llama.cpp does, and half of the rest) and goes on."""
        params = SamplingParams(temperature, top_k, top_p, min_p, repeat_penalty, seed=seed)
        pieces = self._generate(prompt, max_tokens, params, stop_list(stop), n_keep if context_shift else None)
        return pieces if stream else "".join(pieces)

    def shift_if_full(self, n_keep: int) -> None:
        """Shift the sequence if its context is full (the decoding loops' context shift)."""
        if self.n_past >= self.model.n_ctx:
            self.shift(self.model.sinks(self.tokens, n_keep))

    def _reuse_prefix(self, ids: list[int]) -> list[int]:
        """Roll back to the longest prefix the cache shares with `ids`; return what is left to prefill.
        A shifted cache is not what prefilling its tokens gives, so it is not reused."""
        if not self.exact:
            self.reset()
        k = 0
        for a, b in zip(self.tokens, ids):
            if a != b:
                break
            k += 1
        k = min(k, len(ids) - 1)  # at least one token must run to produce logits
        try:
            self.rollback(k)
        except ModelError:  # a sliding window's pages no longer reach back that far: start over
            self.reset()
            k = 0
        return ids[k:]

    def _generate(self, prompt, max_tokens: int, params: SamplingParams, stops: list[str],
                  n_keep: int | None) -> Iterator[str]:
        ids = self.model.prompt_ids(prompt)
        logits = self.prefill(self._reuse_prefix(ids))
        run = self.model._decoding(ids, params, stops, max_tokens, context_shift=n_keep is not None)
        while True:
            out = run.next(logits, self.n_past)
            if out.text:
                yield out.text
            if out.finish_reason:
                return
            if n_keep is not None:
                self.shift_if_full(n_keep)
            logits = self.decode(out.token)


def _status_message(m: "Model", status: int, seq: Sequence | None, rows: int) -> str:
    lib, o = m._lib, m.options
    who = f"sequence {seq.id}" if seq is not None else "a sequence"
    windows = sorted({ly.window for ly in m.compiled.decode.layout.kv.layers if ly.window})

    def pool() -> str:
        s = m.kv_stats()
        return f"{s['pages_used']} of {s['pages_total']} pages of {o.page_size} positions in use"

    messages = {
        lib.KILN_E_ARG: lambda: "invalid argument",
        lib.KILN_E_TOKEN: lambda: f"token id out of range [0, {m.n_vocab})",
        lib.KILN_E_CTX_FULL: lambda: f"context full: the tokens do not fit in n_ctx={m.n_ctx} of {who}"
        + (f" (n_past={seq.n_past})" if seq is not None and not seq.closed else "")
        + "; reset(), rollback(), or compile with a larger ctx (--ctx)",
        lib.KILN_E_ROLLBACK: lambda: f"rollback beyond the positions {who} holds",
        lib.KILN_E_ROLLBACK_WINDOW: lambda: "rollback further back than the sliding-window layers' pages remember "
        f"(window {', '.join(map(str, windows))}): pages that left every window went back to the pool; "
        "reset() and prefill again",
        lib.KILN_E_OPEN: lambda: f"{m.path}: cannot open or map the weights file",
        lib.KILN_E_WEIGHTS: lambda: f"{m.path}: this is not the weights file the library was compiled for "
        f"(expected {lib.kiln_weights_size():,} bytes and the same header); recompile for it",
        lib.KILN_E_NOMEM: lambda: "out of memory allocating the KV pool or the arena",
        lib.KILN_E_PACKED: lambda: f"{m.compiled.packed_path}: not the packed weights file for {m.path} "
        "(or unreadable); delete it and load again to rewrite it",
        lib.KILN_E_KV_FULL: lambda: f"the KV pool is out of pages ({pool()}): close or roll back sequences, "
        "or compile with more pages (kv_pages, --kv-pages)",
        lib.KILN_E_NO_SEQ: lambda: f"all {o.n_seq} sequences are open: close one, or compile with more "
        "(n_seq, --n-seq)",
        lib.KILN_E_SEQ: lambda: f"{who} is not open" + ("" if seq is None else "; open another with m.sequence()"),
        lib.KILN_E_BATCH: lambda: f"a step takes 1 to {o.batch_tokens} rows (batch_tokens, --batch-tokens), "
        f"got {rows}",
        lib.KILN_E_SHIFT_WINDOW: lambda: f"the shift would make the sliding-window layers (window "
        f"{', '.join(map(str, windows))}) read positions whose pages already left their window (the first "
        "positions, the sinks): keep fewer sinks, or discard fewer positions so that the window stays clear of them",
    }
    return messages[status]() if status in messages else f"kiln error {status}"


class Model:
    """A loaded model: one C instance with its own KV pool, arena and threads."""

    def __init__(self, compiled: Compiled, weights_path: str | os.PathLike[str] | None = None,
                 threads: int | None = None):
        self.compiled = compiled
        self.spec = compiled.decode.spec
        self.options = compiled.decode.options
        self.path = Path(weights_path) if weights_path is not None else self.spec.path
        self._ffi, self._lib = compiled.module.ffi, compiled.module.lib
        self.n_vocab = int(self._lib.kiln_n_vocab())
        self.n_ctx = int(self._lib.kiln_n_ctx())
        self.n_groups = int(self._lib.kiln_n_groups())
        self.page_size = int(self._lib.kiln_page_size())
        self.windows = tuple(g.window or 0 for g in compiled.decode.layout.kv.groups)  # per group; 0: full context
        self._tokenizer = None
        self._default: Sequence | None = None
        self._lock = threading.RLock()
        handle = self._ffi.new("kiln_model **")
        packed = str(compiled.packed_path).encode() if compiled.packed_path else self._ffi.NULL
        self._check(self._lib.kiln_open(handle, str(self.path).encode(), packed, threads or default_threads()))
        self._m = self._ffi.gc(handle[0], self._lib.kiln_close)

    def _check(self, status: int, seq: Sequence | None = None, rows: int = 0) -> int:
        """A negative status becomes a ModelError that says what to do."""
        if status < 0:
            error = PoolFullError if status == self._lib.KILN_E_KV_FULL else ModelError
            raise error(_status_message(self, status, seq, rows))
        return status

    def _call(self, fn, *args, seq: Sequence | None = None, rows: int = 0) -> int:
        """Call into C under the model's lock."""
        with self._lock:
            status = fn(self._m, *args)
        return self._check(status, seq, rows)

    @property
    def n_threads(self) -> int:
        return int(self._lib.kiln_n_threads(self._m))

    # -- sequences ------------------------------------------------------------------------
    def sequence(self, pages: np.ndarray | None = None, tokens: SequenceABC[int] = ()) -> Sequence:
        """Open a sequence in a free slot (ModelError when all n_seq are open). With `pages`
        (held through Sequence.share), it starts out holding them as its first blocks: the
        `tokens` they were computed from, len(pages) * page_size of them."""
        seq = Sequence(self, self._call(self._lib.kiln_seq_open))
        if pages is None:
            return seq
        pages = self._pages(pages)
        try:
            if len(tokens) != len(pages) * self.page_size:
                raise ModelError(f"{len(pages)} pages hold {len(pages) * self.page_size} positions, "
                                 f"but {len(tokens)} tokens were given")
            self._call(self._lib.kiln_seq_attach, seq.id, self._ffi.cast("int32_t *", self._ffi.from_buffer(pages)),
                       len(pages), seq=seq)
        except ModelError:
            seq.close()
            raise
        seq.tokens = [int(t) for t in tokens]
        return seq

    def sequence_from(self, path: str | os.PathLike[str]) -> Sequence:
        """A new sequence holding the KV cache a Sequence.save wrote (for this model and cache layout)."""
        from . import kv_file

        tokens, state, exact = kv_file.read(path, self)
        if len(state) < 4 or int.from_bytes(state[:4], "little", signed=True) != len(tokens):
            raise kv_file.KVFileError(f"{path}: the state holds a different number of positions than its "
                                      f"{len(tokens)} tokens")
        if len(tokens) > self.n_ctx:
            raise kv_file.KVFileError(f"{path}: {len(tokens)} positions do not fit in n_ctx={self.n_ctx} (--ctx)")
        seq = self.sequence()
        try:
            self._call(self._lib.kiln_seq_state_load, seq.id, self._ffi.from_buffer(state), len(state), seq=seq)
        except ModelError as e:
            seq.close()
            raise kv_file.KVFileError(f"{path}: {e}") from None
        seq.tokens, seq.exact = tokens, exact
        return seq

    def track_attention(self, on: bool = True) -> None:
        """Keep, per position, the attention it receives (for heavy-hitter eviction, h2o.py). It
        costs a second pass over each layer's keys, so it is off until asked for."""
        self._call(self._lib.kiln_track_attention, int(bool(on)))

    def release_pages(self, pages: np.ndarray) -> None:
        """Drop the references Sequence.share took."""
        pages = self._pages(pages)
        self._call(self._lib.kiln_pages_release, self._ffi.cast("int32_t *", self._ffi.from_buffer(pages)), len(pages))

    def _pages(self, pages) -> np.ndarray:
        pages = np.ascontiguousarray(pages, dtype=np.int32)
        if pages.ndim != 2 or pages.shape[1] != self.n_groups:
            raise ModelError(f"expected pages of shape [n_blocks, {self.n_groups}], got {list(pages.shape)}")
        return pages

    @property
    def default_sequence(self) -> Sequence:
        """The sequence the single-sequence calls use, opened on first use."""
        with self._lock:
            if self._default is None or self._default.closed:
                self._default = self.sequence()
            return self._default

    def kv_stats(self) -> dict:
        """The pool's pages (summed over layer groups, and per group) and what the sequences hold."""
        lib = self._lib
        groups = []
        layout = self.compiled.decode.layout.kv
        with self._lock:
            for g in layout.groups:
                used = int(lib.kiln_pages_used(self._m, g.index))
                groups.append({"window": g.window, "layers": len(g.layers), "pages_total": g.n_pages,
                               "pages_used": used, "pages_free": g.n_pages - used, "page_bytes": g.page_bytes})
            past = [int(lib.kiln_seq_n_past(self._m, s)) for s in range(self.options.n_seq)]
        total, used = sum(g["pages_total"] for g in groups), sum(g["pages_used"] for g in groups)
        return {"pages_total": total, "pages_used": used, "pages_free": total - used,
                "utilization": used / total if total else 0.0, "sequences": sum(p >= 0 for p in past),
                "tokens_cached": sum(p for p in past if p > 0), "page_size": self.options.page_size,
                "groups": groups}

    # -- steps ----------------------------------------------------------------------------
    def _tokens(self, ids) -> np.ndarray:
        tokens = np.ascontiguousarray(ids, dtype=np.int64)
        if tokens.ndim != 1 or tokens.size == 0:
            raise ModelError("expected a non-empty 1-D sequence of token ids")
        bad = np.flatnonzero((tokens < 0) | (tokens >= self.n_vocab))
        if bad.size:
            raise ModelError(f"token id {int(tokens[bad[0]])} at index {int(bad[0])} is out of range [0, {self.n_vocab})")
        return tokens.astype(np.int32)

    def _eval(self, seq: Sequence, ids, logits_all: bool) -> np.ndarray:
        tokens = self._tokens(ids)
        out = np.empty((tokens.size if logits_all else 1, self.n_vocab), dtype=np.float32)
        ffi = self._ffi
        self._call(self._lib.kiln_eval, seq._live(), ffi.cast("int32_t *", ffi.from_buffer(tokens)), tokens.size,
                   ffi.cast("float *", ffi.from_buffer(out)), int(logits_all), seq=seq)
        seq.tokens.extend(int(t) for t in tokens)
        return out if logits_all else out[0]

    def step(self, items: SequenceABC[tuple[Sequence, int | SequenceABC[int]]]) -> np.ndarray:
        """One batched step: each item is (sequence, token or token ids), appended to that sequence.
        Returns each item's last row of logits, [len(items), vocab]."""
        if not items:
            raise ModelError(f"a step takes 1 to {self.options.batch_tokens} rows (batch_tokens, --batch-tokens), got 0")
        rows, seqs, want = [], [], []
        for seq, toks in items:
            if not isinstance(seq, Sequence) or seq.model is not self:
                raise ModelError(f"step: {seq!r} is not a sequence of this model")
            ids = self._tokens([toks] if np.ndim(toks) == 0 else toks)
            rows.append(ids)
            seqs += [seq._live()] * ids.size
            want += [0] * (ids.size - 1) + [1]
        tokens = np.concatenate(rows)
        seq_arr, want_arr = np.array(seqs, np.int32), np.array(want, np.int8)
        out = np.empty((len(items), self.n_vocab), dtype=np.float32)
        ffi = self._ffi
        batch = ffi.new("kiln_batch *", {"n": tokens.size, "token": ffi.cast("int32_t *", ffi.from_buffer(tokens)),
                                         "seq": ffi.cast("int32_t *", ffi.from_buffer(seq_arr)),
                                         "logits": ffi.cast("int8_t *", ffi.from_buffer(want_arr))})
        first = items[0][0] if len({s.id for s, _ in items}) == 1 else None
        self._call(self._lib.kiln_step, batch, ffi.cast("float *", ffi.from_buffer(out)), seq=first, rows=tokens.size)
        for (seq, _), ids in zip(items, rows):
            seq.tokens.extend(int(t) for t in ids)
        return out

    # -- the default sequence -------------------------------------------------------------
    @property
    def n_past(self) -> int:
        return self.default_sequence.n_past if self._default is not None and not self._default.closed else 0

    @property
    def tokens(self) -> list[int]:
        return self.default_sequence.tokens

    def prefill(self, ids, logits: str = "last") -> np.ndarray:
        """Append `ids` to the default sequence; the last token's logits [vocab], or all of them [len(ids), vocab]."""
        return self.default_sequence.prefill(ids, logits)

    def decode(self, token: int) -> np.ndarray:
        """Append one token to the default sequence; its logits [vocab]."""
        return self.default_sequence.decode(token)

    def reset(self) -> None:
        self.default_sequence.reset()

    def rollback(self, n: int) -> None:
        """Keep the first `n` positions of the default sequence."""
        self.default_sequence.rollback(n)

    def generate(self, prompt: str | list[int], **kw) -> str | Iterator[str]:
        """Continue `prompt` on the default sequence (see Sequence.generate)."""
        return self.default_sequence.generate(prompt, **kw)

    def generate_batch(self, prompts: SequenceABC[str | list[int]], max_tokens: int = 128, temperature: float = 0.8,
                       top_k: int = 40, top_p: float = 0.95, min_p: float = 0.05, repeat_penalty: float = 1.0,
                       seed: int | None = None, stop: list[str] | str | None = None, context_shift: bool = False,
                       n_keep: int = 4) -> list[str]:
        """Continue every prompt, decoding all of them together: one step per token serves every
        sequence still running. Each has its own sampler (seeded seed + i when a seed is given);
        more prompts than free sequences run in waves. context_shift and n_keep: as in generate."""
        prompts = list(prompts)
        ids = [self.prompt_ids(p) for p in prompts]
        params = [SamplingParams(temperature, top_k, top_p, min_p, repeat_penalty,
                                 seed=None if seed is None else seed + i) for i in range(len(prompts))]
        out: list[str] = [""] * len(prompts)
        todo = list(range(len(prompts)))
        while todo:
            wave: list[tuple[int, Sequence]] = []
            try:
                while todo:
                    wave.append((todo[0], self.sequence()))
                    todo.pop(0)
            except ModelError:
                if not wave:
                    raise
            try:
                self._decode_together(wave, ids, params, stop_list(stop), max_tokens, out,
                                      n_keep if context_shift else None)
            finally:
                for _, s in wave:
                    s.close()
        return out

    def _decode_together(self, wave, ids, params, stops, max_tokens, out, n_keep: int | None) -> None:
        running = [(i, s, self._decoding(ids[i], params[i], stops, max_tokens, context_shift=n_keep is not None),
                    s.prefill(ids[i])) for i, s in wave]
        while running:
            step = []
            for i, s, run, logits in running:
                got = run.next(logits, s.n_past)
                out[i] += got.text
                if not got.finish_reason:
                    step.append((i, s, run, got.token))
            if not step:
                return
            for _, s, _, _ in step:
                if n_keep is not None:
                    s.shift_if_full(n_keep)
            rows = self.step([(s, tok) for _, s, _, tok in step])
            running = [(i, s, run, row) for (i, s, run, _), row in zip(step, rows)]

    def _decoding(self, prompt_ids: list[int], params: SamplingParams, stops: list[str], max_tokens: int,
                  ignore_eos: bool = False, context_shift: bool = False) -> Decoding:
        return Decoding(self.tokenizer, self.spec.tokenizer.eog_ids, self.n_ctx, prompt_ids, params, stops,
                        max_tokens, ignore_eos, context_shift)

    def sinks(self, tokens: SequenceABC[int], n_keep: int) -> int:
        """Positions a context shift keeps: n_keep, plus the BOS token when the sequence starts with
        one (llama.cpp keeps it on top of --keep)."""
        bos = self.spec.tokenizer.bos_id
        return n_keep + (1 if bos is not None and self.spec.tokenizer.add_bos and tokens[:1] == [bos] else 0)

    def op_seconds(self, mode: Mode = Mode.PREFILL) -> np.ndarray:
        """Each op of a step graph's wall time summed since the last call ([n_ops] seconds), in a
        library built with profile=True; the sums start again from zero."""
        nodes = (self.compiled.decode if mode is Mode.DECODE else self.compiled.prefill).graph.nodes
        out = np.zeros(len(nodes), np.float64)
        with self._lock:
            status = self._lib.kiln_profile(self._m, 0 if mode is Mode.DECODE else 1,
                                            self._ffi.cast("double *", self._ffi.from_buffer(out)), len(nodes))
        if status < 0:
            raise ModelError("op_seconds: this library does not time its ops; load it with profile=True")
        return out

    # -- text -----------------------------------------------------------------------------
    @property
    def tokenizer(self):
        """Built on first use, so that a model whose tokenizer kiln cannot build still runs on ids."""
        if self._tokenizer is None:
            self._tokenizer = make_tokenizer(self.spec.tokenizer, str(self.spec.path))
        return self._tokenizer

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        """llama.cpp's llama_tokenize: BOS only where the GGUF asks for it; special-token text to ids."""
        return self.tokenizer.tokenize(text, add_special, parse_special)

    def detokenize(self, ids, special: bool = False) -> str:
        return self.tokenizer.detokenize(ids, special)

    def prompt_ids(self, prompt: str | list[int]) -> list[int]:
        """A prompt's token ids (text is tokenized), refused when empty or longer than the context."""
        ids = self.tokenize(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
        if not ids:
            raise ModelError("generate: the prompt is empty")
        if len(ids) > self.n_ctx:
            raise ModelError(f"generate: the prompt has {len(ids)} tokens but n_ctx is {self.n_ctx} (--ctx)")
        return ids


def load(model: str | os.PathLike[str], ctx: int = 2048, kv_dtype: str = "f32", threads: int | None = None,
         prefill_chunk: int = CompileOptions.prefill_chunk, n_seq: int = 1, page_size: int = CompileOptions.page_size,
         kv_pages: int | None = None, batch_tokens: int | None = None, kv_dtype_k: str | None = None,
         kv_dtype_v: str | None = None, kv_rotation: bool = True, sanitize: bool = False,
         log=lambda s: None, target: str = "native") -> Model:
    """Compile (or reuse the cached build of) `model` and load it. `model` is a GGUF path or a bundled name.
    kv_dtype sets both K and V; kv_dtype_k / kv_dtype_v (llama.cpp's -ctk / -ctv) override one.
    kv_rotation=False holds a quantized cache without Hadamard blocks (kv_plan.py)."""
    opts = CompileOptions(ctx=ctx, kv_dtype=kv_dtype, prefill_chunk=prefill_chunk, n_seq=n_seq, page_size=page_size,
                          kv_pages=kv_pages, batch_tokens=batch_tokens, kv_dtype_k=kv_dtype_k, kv_dtype_v=kv_dtype_v,
                          kv_rotation=kv_rotation)
    return load_options(model, opts, threads, sanitize, log, target=target)


def load_options(model: str | os.PathLike[str], opts: CompileOptions, threads: int | None = None,
                 sanitize: bool = False, log=lambda s: None, profile: bool = False, target: str = "native") -> Model:
    """`load` with the options already checked (the CLI builds them once for every command)."""
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise OptionError(f"threads must be a positive integer, got {threads!r}")
    return Model(compile_model(model, opts, sanitize, log, profile, target), threads=threads)


def default_threads() -> int:
    """Physical cores this process may run on: SMT siblings share one core's units and would
    only contend in the matmuls."""
    try:
        cpus = os.sched_getaffinity(0)
    except AttributeError:
        return os.cpu_count() or 1
    cores = set()
    for cpu in cpus:
        topo = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
        try:
            cores.add((topo.joinpath("physical_package_id").read_text(), topo.joinpath("core_id").read_text()))
        except OSError:
            cores.add(("cpu", str(cpu)))
    return max(1, len(cores))
