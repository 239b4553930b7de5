"""The Python face of a compiled model: `compiler.load(...)` returns a Model.

Python does no per-op work: each call is one C call that runs whole steps. Each Model owns
its own C instance (instance.py: weights mapping, KV pool, recurrent state, arena), so any number
can live in one process.
A Model holds up to n_seq sequences (`m.sequence()`); `m.step` runs rows of several in one
step. The single-sequence calls (`m.prefill`, `m.decode`, `m.generate`, ...) act on a default
sequence, opened on first use. A lock serialises every call into C, so several Python threads
may share a Model.
"""
from __future__ import annotations

import os
import weakref
from collections.abc import Iterator, Sequence as SequenceABC

import numpy as np

from ..driver import Compiled
from ..text.tokenizer import make_tokenizer
from . import embedding
from .batch import run_waves
from .constraints import Constraint, Guidance, Guide, constraint_of
from .generation import Decoding, ThinkingBudget, stop_list
from .instance import Instance
from .sampling import DEFAULTS, LogitBias, SamplingParams
from .sequence import Sequence
from .spec_decode import generate_one, generate_plain
from .speculation import Speculation, SpecStats
from .status import ModelError


class Model:
    """A loaded model: one C instance with its own KV pool, arena and threads."""

    spec_stats: SpecStats | None = None  # what speculation did in the last generation that used it

    def __init__(self, compiled: Compiled, weights_path: str | os.PathLike[str] | None = None,
                 threads: int | None = None):
        self.compiled = compiled
        self.instance = i = Instance(compiled, weights_path, threads)  # every sequence's state, and every C call
        self.spec, self.options, self.path = i.spec, i.options, i.path
        self.windows, self.recurrent = i.windows, i.recurrent
        self.n_vocab, self.n_ctx, self.n_groups, self.page_size = i.n_vocab, i.n_ctx, i.n_groups, i.page_size
        self._tokenizer = None
        self._default: Sequence | None = None
        self._class_head: embedding.ClassHead | None = None  # a reranker's, read on first use
        self.embedding = compiled.planned.graph.embedding  # its steps return hidden states
        # the Dense layers its pooled vectors pass through (EmbeddingGemma's), where the file has them
        self.projection = embedding.Projection.of(self.spec) if self.embedding else None
        me = weakref.ref(self)  # no cycle through self: a dropped Model frees its memory at once
        self.guidance = Guidance(lambda: me().tokenizer, self.spec.hparams.n_vocab, str(self.spec.path))
        # masks overlap the steps only where the step's threads leave a core free (constraints.py)
        self.guidance.overlap = self.n_threads < len(os.sched_getaffinity(0))

    @property
    def n_threads(self) -> int:
        return self.instance.n_threads

    # -- sequences ------------------------------------------------------------------------
    def sequence(self, pages: np.ndarray | None = None, tokens: SequenceABC[int] = ()) -> Sequence:
        """Open a sequence in a free slot (ModelError when all n_seq are open). With `pages`
        (held through Sequence.share), it starts out holding them as its first blocks: the
        `tokens` they were computed from, len(pages) * page_size of them."""
        i = self.instance
        seq = Sequence(self, i.call(i.lib.kiln_seq_open))
        if pages is None:
            return seq
        pages = i.pages(pages)
        try:
            if len(tokens) != len(pages) * self.page_size:
                raise ModelError(f"{len(pages)} pages hold {len(pages) * self.page_size} positions, "
                                 f"but {len(tokens)} tokens were given")
            i.call(i.lib.kiln_seq_attach, seq.id, i.buffer(pages, "int32_t *"), len(pages), seq=seq)
        except ModelError:
            seq.close()
            raise
        seq.tokens = [int(t) for t in tokens]
        return seq

    def sequence_from(self, path: str | os.PathLike[str]) -> Sequence:
        """A new sequence holding the KV cache a Sequence.save wrote (for this model and cache layout)."""
        from . import kv_file

        tokens, state, exact = kv_file.read(path, self.instance)
        if len(tokens) > self.n_ctx:
            raise kv_file.KVFileError(f"{path}: {len(tokens)} positions do not fit in n_ctx={self.n_ctx} (--ctx)")
        try:
            return self.sequence_restored(tokens, state, exact)
        except ModelError as e:
            raise kv_file.KVFileError(f"{path}: {e}") from None

    def sequence_restored(self, tokens: SequenceABC[int], state: bytes, exact: bool = True) -> Sequence:
        """A new sequence holding a state Sequence.snapshot took (of this model and cache layout)."""
        seq, i = self.sequence(), self.instance
        try:  # the C side checks the state's every field; then its positions must be the tokens'
            i.call(i.lib.kiln_seq_state_load, seq.id, i.buffer(state), len(state), seq=seq)
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
        self.instance.call(self.instance.lib.kiln_track_attention, int(bool(on)))

    def release_pages(self, pages: np.ndarray) -> None:
        """Drop the references Sequence.share took."""
        i = self.instance
        pages = i.pages(pages)
        i.call(i.lib.kiln_pages_release, i.buffer(pages, "int32_t *"), len(pages))

    @property
    def default_sequence(self) -> Sequence:
        """The sequence the single-sequence calls use, opened on first use."""
        with self.instance.lock:
            if self._default is None or self._default.closed:
                self._default = self.sequence()
                self._default.held_by_its_model()
            return self._default

    def kv_stats(self) -> dict:
        """The pool's pages (summed over layer groups, and per group) and what the sequences hold."""
        return self.instance.kv_stats()

    # -- steps ----------------------------------------------------------------------------
    def step(self, items: SequenceABC[tuple[Sequence, int | SequenceABC[int]]],
             need: SequenceABC[bool] | None = None) -> np.ndarray:
        """One batched step: each item is (sequence, token or token ids), appended to that sequence.
        Returns each item's last row of logits, [len(items), vocab]; given `need`, only those of the
        items whose flag is true, in order (a prompt's chunk before its last needs none, and its
        row would cost a pass over the output matrix)."""
        if need is not None and len(need) != len(items):
            raise ModelError(f"step: {len(need)} need flags for {len(items)} items")
        need = [True] * len(items) if need is None else need
        return self.instance.step(items, ["last" if wanted else None for wanted in need])

    def step_rows(self, items: SequenceABC[tuple[Sequence, int | SequenceABC[int]]],
                  every_row: SequenceABC[bool]) -> list[np.ndarray]:
        """`step`, with every row's logits for the items whose every_row is true ([len(ids), vocab])
        and the last row's for the others ([1, vocab]): a speculative verification reads each of
        its rows (speculation.py)."""
        if len(every_row) != len(items):
            raise ModelError(f"step_rows: {len(every_row)} every_row flags for {len(items)} items")
        sizes = [np.size(toks) if every else 1 for (_, toks), every in zip(items, every_row)]
        return np.split(self.instance.step(items, ["all" if every else "last" for every in every_row]),
                        np.cumsum(sizes)[:-1])

    # -- embeddings -----------------------------------------------------------------------
    def embed(self, inputs, pooling: str | None = None, normalize: int = 2,
              dimensions: int | None = None) -> np.ndarray | list[np.ndarray]:
        """Vectors of texts (or token id lists) from a model that returns hidden states (an encoder,
        or one loaded with embedding=True): [n_inputs, dimensions] float32. pooling: none, mean,
        cls or last (None: the file's pooling_type); normalize: llama-server's embd_normalize (2:
        L2, -1: none); dimensions: the first d of a Matryoshka model's, renormalized. "none"
        gives one [n_tokens, dims] array an input."""
        self._check_embedding()
        return embedding.embed(self, inputs, embedding.Pooling(pooling or embedding.default_pooling(self), normalize,
                                                               dimensions))

    def rerank(self, query: str, documents: SequenceABC[str]) -> np.ndarray:
        """Each document's relevance to the query (a reranker's classification head), in order."""
        self._check_embedding()
        if self._class_head is None:
            self._class_head = embedding.ClassHead(self)
        return embedding.rerank(self, query, documents, self._class_head)

    def _check_embedding(self) -> None:
        if not self.embedding:
            raise ModelError(f"{self.spec.path}: this build returns logits, not embeddings; load the model with "
                             "embedding=True (kiln --embedding)")

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
        """Continue `prompt` on the default sequence (see generate_on)."""
        return self.generate_on(self.default_sequence, prompt, **kw)

    def generate_on(self, seq: Sequence, prompt: str | list[int], max_tokens: int = 128,
                    temperature: float = DEFAULTS.temperature, top_k: int = DEFAULTS.top_k,
                    top_p: float = DEFAULTS.top_p, min_p: float = DEFAULTS.min_p,
                    repeat_penalty: float = DEFAULTS.repeat_penalty, seed: int | None = None,
                    stop: list[str] | str | None = None, stream: bool = False, context_shift: bool = False,
                    sinks: int = 4, json_schema=None, regex: str | None = None, grammar: str | None = None,
                    lark: str | None = None, logit_bias: dict | None = None, speculative: str | None = None,
                    draft_model: "Model | None" = None, max_draft: int | None = None) -> str | Iterator[str]:
        """Continue `prompt` (text, or token ids) on `seq` (seq.generate calls this). Returns the
        text, or yields it piece by piece if stream. The cache is reused: the prompt's longest
        prefix already held is not prefilled again. A full context ends generation, or with
        context_shift shifts the sequence (keeping `sinks` positions, plus the BOS token as
        llama.cpp does, and half of the rest) and goes on.
        At most one of json_schema (a dict or its JSON text), regex, grammar (llama.cpp's GBNF) and
        lark constrains the output, token by token; generation stops once the grammar is complete.
        A schema or grammar llguidance rejects raises ConstraintError, naming the schema path.
        logit_bias: {token id: bias in [-100, 100]}, added to those logits (OpenAI's).
        speculative: "ngram" (prompt lookup) or "draft" (draft_model: a smaller model with the same
        token list) checks up to max_draft guessed tokens in each step; the output is the same
        tokens plain decoding gives (greedy: bit for bit; sampling: the same distribution, and with
        "ngram" the same tokens for a seed). model.spec_stats tells what it did."""
        if seq.instance is not self.instance:
            raise ModelError(f"generate_on: {seq!r} is not a sequence of this model")
        params = SamplingParams(temperature, top_k, top_p, min_p, repeat_penalty, seed=seed)
        spec = Speculation.of(self, speculative, draft_model, max_draft)
        c = constraint_of(json_schema, regex, grammar, lark)
        guide = self.guidance.guide(c) if c is not None else None  # checked before any work
        bias = LogitBias.of(logit_bias, self.n_vocab)
        shift = sinks if context_shift else None
        if spec is not None:
            self.spec_stats = SpecStats()
            pieces = generate_one(seq, prompt, max_tokens, params, stop_list(stop), shift, spec, self.spec_stats,
                                  guide, bias)
        else:
            pieces = generate_plain(seq, prompt, max_tokens, params, stop_list(stop), shift, guide, bias)
        return pieces if stream else "".join(pieces)

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
                 bias: LogitBias | None = None, thinking: ThinkingBudget | None = None,
                 special: bool = False) -> Decoding:
        """The per-token state of one generation: its sampler, stop rules, text, and constraint
        (a Guide from self.guidance.guide), logit bias or thinking budget (generation.py); special:
        control tokens come out as text (a harmony model's channels)."""
        return Decoding(self.tokenizer, self.spec.tokenizer.eog_ids, self.n_ctx, prompt_ids, params, stops,
                        max_tokens, ignore_eos, context_shift, guide, bias, thinking, special)

    def sinks(self, tokens: SequenceABC[int], sinks: int) -> int:
        """Positions a context shift keeps: `sinks`, plus the BOS token when the sequence starts with
        one (llama.cpp keeps it on top of --keep)."""
        return self.instance.sinks(tokens, sinks)

    def op_seconds(self) -> np.ndarray:
        """Each op of the step graph's wall time summed since the last call ([n_ops] seconds, a body op
        over every layer), in a library built with profile=True; the sums start again from zero."""
        out, i = np.zeros(len(self.compiled.planned.graph.nodes), np.float64), self.instance
        with i.lock:
            status = i.lib.kiln_profile(i.handle, i.buffer(out, "double *"), len(out))
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
