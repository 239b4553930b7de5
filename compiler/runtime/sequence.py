"""One sequence of a Model: its positions in the shared KV pool, and the calls on them."""
from __future__ import annotations

import os
import weakref
from dataclasses import dataclass
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import numpy as np

from ..core.errors import OptionError
from ..core.sequences import common_prefix
from .constraints import constraint_of
from .generation import stop_list
from .spec_decode import generate_one
from .speculation import Speculation, SpecStats
from .sampling import DEFAULTS, LogitBias, SamplingParams
from .status import ModelError

if TYPE_CHECKING:
    from .model import Model


@dataclass(frozen=True)
class Mark:
    """A sequence's positions at a point, and (a hybrid's) its recurrent state there."""
    n_past: int
    state: bytearray | None = None


class Sequence:
    """One sequence of a Model: its own positions in the shared KV pool. Close it (or use it
    as a context manager) to give its pages back."""

    def __init__(self, model: "Model", seq_id: int):
        self._model: Callable[[], "Model | None"] = lambda: model
        self.id = seq_id
        self.tokens: list[int] = []  # what the cache holds, for prefix reuse
        self.exact = True  # the cache is what prefilling `tokens` gives (not after a shift); prefix caches need it
        self.closed = False

    @property
    def model(self) -> "Model":
        m = self._model()
        if m is None:
            raise ModelError(f"sequence {self.id}: its model was dropped; keep a reference to the Model")
        return m

    def held_by_its_model(self) -> None:
        """Refer to the model weakly: the model holds this sequence (its default one), and a cycle
        would keep a dropped model's arena and pool alive until Python's next full collection."""
        self._model = weakref.ref(self._model())

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

    def mark(self) -> "Mark":
        """What back_to needs to bring the sequence back here: its positions and, in a hybrid, a copy
        of its recurrent state (which no rollback can cut back)."""
        m = self.model
        state = None
        if m.recurrent:
            state = bytearray(int(m._lib.kiln_state_slot_bytes(m._m)))
            m._call(m._lib.kiln_seq_recurrent_save, self._live(), m._ffi.from_buffer(state), seq=self)
        return Mark(self.n_past, state)

    def back_to(self, mark: "Mark", replay: list[int] = ()) -> None:
        """Hold what the sequence held at `mark`, then `replay` fed after it (a speculative step's
        accepted tokens): a rollback, or in a hybrid the saved state restored and the replayed
        tokens run again, so that it holds the bits plain decoding gives."""
        if mark.state is None:
            self.rollback(mark.n_past + len(replay))
            return
        m = self.model
        m._call(m._lib.kiln_seq_rewind, self._live(), mark.n_past, m._ffi.from_buffer(mark.state), seq=self)
        del self.tokens[mark.n_past:]
        if replay:
            m.step([(self, list(replay))], need=[False])

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

    def shift(self, sinks: int = 4, n_discard: int | None = None) -> int:
        """A context shift (StreamingLLM, llama.cpp's --context-shift): keep the first `sinks`
        positions (the attention sinks), drop the n_discard after them (default: half of the
        rest), and move the remainder down. Returns the positions now held."""
        n_past = self.n_past
        if isinstance(sinks, bool) or not isinstance(sinks, (int, np.integer)) or not 0 <= sinks <= n_past:
            raise ModelError(f"shift: sinks must be between 0 and n_past={n_past}, got {sinks!r}")
        if n_discard is None:
            n_discard = max(1, (n_past - sinks) // 2)
        if isinstance(n_discard, bool) or not isinstance(n_discard, (int, np.integer)) \
                or not 1 <= n_discard <= n_past - sinks:
            raise ModelError(f"shift: n_discard must be between 1 and n_past - sinks = {n_past - sinks}, "
                             f"got {n_discard!r}")
        self.keep(np.r_[0:sinks, sinks + n_discard:n_past])
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

    def state_size(self) -> int:
        """The bytes of this sequence's KV state, as save would write them (less the file's header)."""
        m = self.model
        with m._lock:
            return int(m._lib.kiln_seq_state_size(m._m, self._live()))

    def snapshot(self) -> tuple[list[int], bytes]:
        """The sequence's tokens and its whole state as bytes: its KV pages and, in a hybrid, its
        recurrent slot (m.sequence_restored gives them back, bit for bit)."""
        m = self.model
        with m._lock:
            size = int(m._lib.kiln_seq_state_size(m._m, self._live()))
            state = bytearray(size)
            m._check(m._lib.kiln_seq_state_save(m._m, self.id, m._ffi.from_buffer(state), size), seq=self)
            tokens = list(self.tokens)
        if len(tokens) != self.n_past:
            raise ModelError(f"sequence {self.id} holds {self.n_past} positions but knows {len(tokens)} of their tokens")
        return tokens, bytes(state)

    def save(self, path: str | os.PathLike[str]) -> int:
        """Write the sequence's KV cache and tokens to a file (kv_file.py); returns its size in bytes.
        m.sequence_from(path) gives them back, bit for bit."""
        from . import kv_file

        tokens, state = self.snapshot()
        return kv_file.write(path, self.model, tokens, state, self.exact)

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

    def generate(self, prompt: str | list[int], max_tokens: int = 128, temperature: float = DEFAULTS.temperature,
                 top_k: int = DEFAULTS.top_k, top_p: float = DEFAULTS.top_p, min_p: float = DEFAULTS.min_p,
                 repeat_penalty: float = DEFAULTS.repeat_penalty, seed: int | None = None,
                 stop: list[str] | str | None = None, stream: bool = False, context_shift: bool = False,
                 sinks: int = 4, json_schema=None, regex: str | None = None, grammar: str | None = None,
                 lark: str | None = None, logit_bias: dict | None = None, speculative: str | None = None,
                 draft_model: "Model | None" = None, max_draft: int | None = None) -> str | Iterator[str]:
        """Continue `prompt` (text, or token ids). Returns the text, or yields it piece by piece if stream.
        The cache is reused: the prompt's longest prefix already held is not prefilled again.
        A full context ends generation, or with context_shift shifts the sequence (keeping `sinks`
        positions, plus the BOS token as llama.cpp does, and half of the rest) and goes on.
        At most one of json_schema (a dict or its JSON text), regex, grammar (llama.cpp's GBNF) and
        lark constrains the output, token by token; generation stops once the grammar is complete.
        A schema or grammar llguidance rejects raises ConstraintError, naming the schema path.
        logit_bias: {token id: bias in [-100, 100]}, added to those logits (OpenAI's).
        speculative: "ngram" (prompt lookup) or "draft" (draft_model: a smaller model with the same
        token list) checks up to max_draft guessed tokens in each step; the output is the same
        tokens plain decoding gives (greedy: bit for bit; sampling: the same distribution, and with
        "ngram" the same tokens for a seed). model.spec_stats tells what it did."""
        params = SamplingParams(temperature, top_k, top_p, min_p, repeat_penalty, seed=seed)
        spec = Speculation.of(self.model, speculative, draft_model, max_draft)
        c = constraint_of(json_schema, regex, grammar, lark)
        guide = self.model.guidance.guide(c) if c is not None else None  # checked before any work
        bias = LogitBias.of(logit_bias, self.model.n_vocab)
        if spec is not None:
            self.model.spec_stats = SpecStats()
            pieces = generate_one(self, prompt, max_tokens, params, stop_list(stop), sinks if context_shift else None,
                                  spec, self.model.spec_stats, guide, bias)
        else:
            pieces = self._generate(prompt, max_tokens, params, stop_list(stop), sinks if context_shift else None,
                                    guide, bias)
        return pieces if stream else "".join(pieces)

    def shift_if_full(self, sinks: int) -> None:
        """Shift the sequence if its context is full (the decoding loops' context shift)."""
        if self.n_past >= self.model.n_ctx:
            self.shift(self.model.sinks(self.tokens, sinks))

    def reuse_prefix(self, ids: list[int]) -> list[int]:
        """Roll back to the longest prefix the cache shares with `ids`; return what is left to prefill.
        A shifted cache is not what prefilling its tokens gives, so it is not reused."""
        if not self.exact:
            self.reset()
        k = min(common_prefix(self.tokens, ids), len(ids) - 1)  # at least one token must run to produce logits
        try:
            self.rollback(k)
        except ModelError:  # a sliding window's pages no longer reach back that far: start over
            self.reset()
            k = 0
        return ids[k:]

    def _generate(self, prompt, max_tokens: int, params: SamplingParams, stops: list[str],
                  sinks: int | None, guide=None, bias=None) -> Iterator[str]:
        ids = self.model.prompt_ids(prompt)
        logits = self.prefill(self.reuse_prefix(ids))
        run = self.model.decoding(ids, params, stops, max_tokens, context_shift=sinks is not None, guide=guide,
                                  bias=bias)
        while True:
            out = run.next(logits, self.n_past)
            if out.text:
                yield out.text
            if out.finish_reason:
                return
            if sinks is not None:
                self.shift_if_full(sinks)
            logits = self.decode(out.token)
