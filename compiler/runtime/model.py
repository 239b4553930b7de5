"""The Python face of a compiled model: `compiler.load(...)` returns a Model.

Python does no per-op work: each call is one C call that runs whole steps. Each Model owns
its own C instance (weights mapping, KV pool, arena), so any number can live in one process.
A Model holds up to n_seq sequences (`m.sequence()`); `m.step` runs rows of several in one
step. The single-sequence calls (`m.prefill`, `m.decode`, `m.generate`, ...) act on a default
sequence, opened on first use. A lock serialises every call into C, so several Python threads
may share a Model.
"""
from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Iterator, Sequence as SequenceABC
from pathlib import Path

import numpy as np

from ..driver import Compiled
from ..text.tokenizer import make_tokenizer
from .constraints import Constraint, Guidance, Guide, constraint_of
from .generation import Decoding, stop_list
from .sampling import DEFAULTS, LogitBias, SamplingParams
from .batch import run_waves
from .sequence import Sequence
from .speculation import Speculation, SpecStats
from .status import ModelError, status_error
from .topology import default_threads


class Model:
    """A loaded model: one C instance with its own KV pool, arena and threads."""

    spec_stats: SpecStats | None = None  # what speculation did in the last generation that used it

    def __init__(self, compiled: Compiled, weights_path: str | os.PathLike[str] | None = None,
                 threads: int | None = None):
        self.compiled = compiled
        self.spec = compiled.planned.spec
        self.options = compiled.planned.options
        self.path = Path(weights_path) if weights_path is not None else self.spec.path
        self._ffi, self._lib = compiled.module.ffi, compiled.module.lib
        self.windows = tuple(g.window or 0 for g in compiled.planned.layout.kv.groups)  # per group; 0: full context
        # a hybrid's recurrent layers keep a state slot per sequence: positions can be neither dropped from
        # it (rollback, context shift) nor borrowed from another sequence's pages (a prefix cache's)
        self.recurrent = compiled.planned.layout.state is not None
        self._tokenizer = None
        self._default: Sequence | None = None
        me = weakref.ref(self)  # no cycle through self: a dropped Model frees its memory at once
        self.guidance = Guidance(lambda: me().tokenizer, self.spec.hparams.n_vocab, str(self.spec.path))
        self._lock = threading.RLock()
        handle = self._ffi.new("kiln_model **")
        packed = str(compiled.packed_path).encode() if compiled.packed_path else self._ffi.NULL
        self.n_vocab, self.n_ctx = self.spec.hparams.n_vocab, self.options.ctx  # for the messages of a failed open
        self._check(self._lib.kiln_open(handle, str(self.path).encode(), packed, threads or default_threads()))
        self._m = self._ffi.gc(handle[0], self._lib.kiln_close)
        self.n_vocab, self.n_ctx = int(self._lib.kiln_n_vocab(self._m)), int(self._lib.kiln_n_ctx(self._m))
        self.n_groups, self.page_size = int(self._lib.kiln_n_groups(self._m)), int(self._lib.kiln_page_size(self._m))
        # masks overlap the steps only where the step's threads leave a core free (constraints.py)
        self.guidance.overlap = self.n_threads < len(os.sched_getaffinity(0))

    def _check(self, status: int, seq: Sequence | None = None, rows: int = 0) -> int:
        """A negative status becomes a ModelError that says what to do."""
        if status < 0:
            raise status_error(self, status, seq, rows)
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
        if len(tokens) > self.n_ctx:
            raise kv_file.KVFileError(f"{path}: {len(tokens)} positions do not fit in n_ctx={self.n_ctx} (--ctx)")
        try:
            return self.sequence_restored(tokens, state, exact)
        except ModelError as e:
            raise kv_file.KVFileError(f"{path}: {e}") from None

    def sequence_restored(self, tokens: SequenceABC[int], state: bytes, exact: bool = True) -> Sequence:
        """A new sequence holding a state Sequence.snapshot took (of this model and cache layout)."""
        seq = self.sequence()
        try:  # the C side checks the state's every field; then its positions must be the tokens'
            self._call(self._lib.kiln_seq_state_load, seq.id, self._ffi.from_buffer(state), len(state), seq=seq)
            if seq.n_past != len(tokens):
                raise ModelError(f"the state holds {seq.n_past} positions, its header {len(tokens)} tokens")
        except ModelError:
            seq.close()
            raise
        seq.tokens, seq.exact = [int(t) for t in tokens], exact
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
                self._default.held_by_its_model()
            return self._default

    def kv_stats(self) -> dict:
        """The pool's pages (summed over layer groups, and per group) and what the sequences hold."""
        lib = self._lib
        groups = []
        layout = self.compiled.planned.layout.kv
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

    def step(self, items: SequenceABC[tuple[Sequence, int | SequenceABC[int]]],
             need: SequenceABC[bool] | None = None) -> np.ndarray:
        """One batched step: each item is (sequence, token or token ids), appended to that sequence.
        Returns each item's last row of logits, [len(items), vocab]; given `need`, only those of the
        items whose flag is true, in order (a prompt's chunk before its last needs none, and its
        row would cost a pass over the output matrix)."""
        if need is not None and len(need) != len(items):
            raise ModelError(f"step: {len(need)} need flags for {len(items)} items")
        need = [True] * len(items) if need is None else need
        return self._step(items, ["last" if wanted else None for wanted in need])

    def step_rows(self, items: SequenceABC[tuple[Sequence, int | SequenceABC[int]]],
                  every_row: SequenceABC[bool]) -> list[np.ndarray]:
        """`step`, with every row's logits for the items whose every_row is true ([len(ids), vocab])
        and the last row's for the others ([1, vocab]): a speculative verification reads each of
        its rows (speculation.py)."""
        if len(every_row) != len(items):
            raise ModelError(f"step_rows: {len(every_row)} every_row flags for {len(items)} items")
        sizes = [np.size(toks) if every else 1 for (_, toks), every in zip(items, every_row)]
        return np.split(self._step(items, ["all" if every else "last" for every in every_row]), np.cumsum(sizes)[:-1])

    def _step(self, items, rows_wanted: SequenceABC[str | None]) -> np.ndarray:
        """kiln_step over items; each item's logits rows: "all", its "last", or None."""
        if not items:
            raise ModelError(f"a step takes 1 to {self.options.batch_tokens} rows (batch_tokens, --batch-tokens), got 0")
        rows, seqs, want = [], [], []
        for (seq, toks), wanted in zip(items, rows_wanted):
            if not isinstance(seq, Sequence) or seq.model is not self:
                raise ModelError(f"step: {seq!r} is not a sequence of this model")
            ids = self._tokens([toks] if np.ndim(toks) == 0 else toks)
            rows.append(ids)
            seqs += [seq._live()] * ids.size
            want += [int(wanted == "all")] * (ids.size - 1) + [int(wanted is not None)]
        tokens = np.concatenate(rows)
        seq_arr, want_arr = np.array(seqs, np.int32), np.array(want, np.int8)
        out = np.empty((int(want_arr.sum()), self.n_vocab), dtype=np.float32)
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

    def generate_batch(self, prompts: SequenceABC[str | list[int]], max_tokens: int = 128,
                       temperature: float = DEFAULTS.temperature, top_k: int = DEFAULTS.top_k,
                       top_p: float = DEFAULTS.top_p, min_p: float = DEFAULTS.min_p,
                       repeat_penalty: float = DEFAULTS.repeat_penalty, seed: int | None = None,
                       stop: list[str] | str | None = None, context_shift: bool = False, sinks: int = 4,
                       json_schema=None, regex: str | None = None, grammar: str | None = None,
                       lark: str | None = None, logit_bias: dict | None = None,
                       constraints: SequenceABC[Constraint | dict | None] | None = None,
                       speculative: str | None = None, draft_model: "Model | None" = None,
                       max_draft: int | None = None) -> list[str]:
        """Continue every prompt, decoding all of them together: one step per token serves every
        sequence still running. Each has its own sampler (seeded seed + i when a seed is given);
        more prompts than free sequences run in waves. context_shift and sinks: as in generate.
        json_schema, regex, grammar, lark and logit_bias constrain every prompt as in generate;
        `constraints` gives each prompt its own instead: a Constraint, a dict of those keywords
        (`{"regex": "[0-9]+"}`), or None for a free one. speculative, draft_model, max_draft: as
        in Sequence.generate; the sequences' verification steps are shared as their plain steps are."""
        prompts = list(prompts)
        ids = [self.prompt_ids(p) for p in prompts]
        params = [SamplingParams(temperature, top_k, top_p, min_p, repeat_penalty,
                                 seed=None if seed is None else seed + i) for i in range(len(prompts))]
        shared = constraint_of(json_schema, regex, grammar, lark)
        if constraints is None:
            constraints = [shared] * len(prompts)
        elif shared is not None or len(constraints) != len(prompts):
            raise ModelError(f"generate_batch: constraints must give one entry per prompt ({len(prompts)}), "
                             "instead of json_schema, regex, grammar or lark")
        wanted = [c if c is None or isinstance(c, Constraint) else constraint_of(**c) for c in constraints]
        bias = LogitBias.of(logit_bias, self.n_vocab)
        guides = [self.guidance.guide(c) if c is not None else None for c in wanted]  # all checked before any step
        spec = Speculation.of(self, speculative, draft_model, max_draft)
        if spec is not None:
            self.spec_stats = SpecStats()
        return run_waves(self, ids, params, stop_list(stop), max_tokens, sinks if context_shift else None, guides,
                         bias, spec)

    def decoding(self, prompt_ids: list[int], params: SamplingParams, stops: list[str], max_tokens: int,
                 ignore_eos: bool = False, context_shift: bool = False, guide: Guide | None = None,
                 bias: LogitBias | None = None) -> Decoding:
        """The per-token state of one generation: its sampler, stop rules, text, and constraint
        (a Guide from self.guidance.guide) or logit bias (generation.py)."""
        return Decoding(self.tokenizer, self.spec.tokenizer.eog_ids, self.n_ctx, prompt_ids, params, stops,
                        max_tokens, ignore_eos, context_shift, guide, bias)

    def sinks(self, tokens: SequenceABC[int], sinks: int) -> int:
        """Positions a context shift keeps: `sinks`, plus the BOS token when the sequence starts with
        one (llama.cpp keeps it on top of --keep)."""
        bos = self.spec.tokenizer.bos_id
        return sinks + (1 if bos is not None and self.spec.tokenizer.add_bos and tokens[:1] == [bos] else 0)

    def op_seconds(self) -> np.ndarray:
        """Each op of the step graph's wall time summed since the last call ([n_ops] seconds, a body op
        over every layer), in a library built with profile=True; the sums start again from zero."""
        out = np.zeros(len(self.compiled.planned.graph.nodes), np.float64)
        with self._lock:
            status = self._lib.kiln_profile(self._m, self._ffi.cast("double *", self._ffi.from_buffer(out)), len(out))
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
