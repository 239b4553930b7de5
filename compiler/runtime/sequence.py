"""One sequence of a Model: its state in the C instance (its KV pages and, in a hybrid, its
recurrent slot), the tokens that state holds, and every operation on it: append, roll back or
rewind, keep, fork, snapshot and restore, share pages. The instance (instance.py) owns the state;
a Sequence is its handle. Generation lives above (Model.generate_on), so that this module imports
nothing that imports it."""
from __future__ import annotations

import os
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from ..core.errors import OptionError
from ..core.sequences import common_prefix
from .instance import Instance
from .status import ModelError


@dataclass(frozen=True)
class Mark:
    """A sequence's positions at a point, and (a hybrid's) its recurrent state there."""
    n_past: int
    state: bytearray | None = None


class Sequence:
    """One sequence of a Model: its own positions in the shared KV pool. Close it (or use it
    as a context manager) to give its pages back."""

    def __init__(self, model, seq_id: int):
        self._model: Callable[[], object] = lambda: model  # its Model (model.py), for generate
        instance = model.instance
        self._instance: Callable[[], Instance | None] = lambda: instance
        self.id = seq_id
        self.tokens: list[int] = []  # what the cache holds, for prefix reuse
        self.exact = True  # the cache is what prefilling `tokens` gives (not after a shift); prefix caches need it
        self.closed = False

    @property
    def instance(self) -> Instance:
        """The C instance that holds this sequence's state (its model's)."""
        i = self._instance()
        if i is None:
            raise ModelError(f"sequence {self.id}: its model was dropped; keep a reference to the Model")
        return i

    @property
    def model(self):
        m = self._model()
        if m is None:
            raise ModelError(f"sequence {self.id}: its model was dropped; keep a reference to the Model")
        return m

    def held_by_its_model(self) -> None:
        """Refer to the model weakly: the model holds this sequence (its default one), and a cycle
        would keep a dropped model's arena and pool alive until Python's next full collection."""
        self._model, self._instance = weakref.ref(self._model()), weakref.ref(self._instance())

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"n_past={self.n_past}"
        return f"<kiln Sequence {self.id} {state}>"

    def __enter__(self) -> "Sequence":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def live(self) -> int:
        """Its id, for a call into C; ModelError once it is closed."""
        if self.closed:
            raise ModelError(f"sequence {self.id} is closed; open another with m.sequence()")
        return self.id

    @property
    def n_past(self) -> int:
        """Positions the sequence holds."""
        i = self.instance
        return i.call(i.lib.kiln_seq_n_past, self.live(), seq=self)

    def prefill(self, ids, logits: str = "last") -> np.ndarray:
        """Append `ids`; the last token's logits [vocab], or all of them [len(ids), vocab]."""
        if logits not in ("last", "all"):
            raise OptionError(f"logits must be 'last' or 'all', got {logits!r}")
        return self.instance.eval(self, ids, logits == "all")

    def decode(self, token: int) -> np.ndarray:
        """Append one token; its logits [vocab]."""
        return self.instance.eval(self, [token], False)

    def rollback(self, n: int) -> None:
        """Keep the first `n` positions."""
        i = self.instance
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 0 <= n <= self.n_past:
            raise ModelError(f"rollback({n!r}): sequence {self.id} holds n_past={self.n_past} positions")
        i.call(i.lib.kiln_seq_rollback, self.live(), int(n), seq=self)
        del self.tokens[n:]

    def mark(self) -> "Mark":
        """What back_to needs to bring the sequence back here: its positions and, in a hybrid, a copy
        of its recurrent state (which no rollback can cut back)."""
        i = self.instance
        state = None
        if i.recurrent:
            state = bytearray(int(i.lib.kiln_state_slot_bytes(i.handle)))
            i.call(i.lib.kiln_seq_recurrent_save, self.live(), i.buffer(state), seq=self)
        return Mark(self.n_past, state)

    def back_to(self, mark: "Mark", replay: list[int] = ()) -> None:
        """Hold what the sequence held at `mark`, then `replay` fed after it (a speculative step's
        accepted tokens): a rollback, or in a hybrid the saved state restored and the replayed
        tokens run again, so that it holds the bits plain decoding gives."""
        if mark.state is None:
            self.rollback(mark.n_past + len(replay))
            return
        i = self.instance
        i.call(i.lib.kiln_seq_rewind, self.live(), mark.n_past, i.buffer(mark.state), seq=self)
        del self.tokens[mark.n_past:]
        if replay:
            i.step([(self, list(replay))], [None])

    def reset(self) -> None:
        i = self.instance
        i.call(i.lib.kiln_seq_reset, self.live(), seq=self)
        self.tokens.clear()
        self.exact = True

    def keep(self, positions) -> None:
        """Keep only `positions` (strictly increasing, each < n_past), in order: the sequence then
        holds len(positions) of them, each key rotated to its new position, as if the text had
        been those tokens all along (the attention states themselves are not recomputed)."""
        i = self.instance
        keep = np.ascontiguousarray(positions, dtype=np.int64)
        n_past = self.n_past
        if keep.ndim != 1 or (keep.size and (keep[0] < 0 or keep[-1] >= n_past or np.any(np.diff(keep) <= 0))):
            raise ModelError(f"keep: positions must be strictly increasing within [0, {n_past}) "
                             f"(sequence {self.id} holds n_past={n_past})")
        keep32 = keep.astype(np.int32)
        i.call(i.lib.kiln_seq_keep, self.live(), i.buffer(keep32, "int32_t *"), keep32.size, seq=self)
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
        i = self.instance
        with i.lock:
            n = int(i.lib.kiln_seq_n_past(i.handle, self.live()))
            out = np.zeros(max(n, 0), np.float32)
            status = i.lib.kiln_seq_attention(i.handle, self.id, i.buffer(out, "float *"), n)
        if status == i.lib.KILN_E_ARG:
            raise ModelError("attention_mass: call m.track_attention(True) first")
        i.check(status, seq=self)
        return out

    def share(self, first_block: int, n_blocks: int) -> np.ndarray:
        """The pages of full blocks [first_block, first_block + n_blocks), [n_blocks, n_groups]
        (-1 where a sliding group has let a block go), with a reference taken on each for the
        caller, which keeps them alive after the sequence moves on or closes. A prefix cache
        holds them this way; give them back with m.release_pages."""
        i = self.instance
        pages = np.empty((max(n_blocks, 0), i.n_groups), np.int32)
        i.call(i.lib.kiln_seq_share, self.live(), int(first_block), int(n_blocks), i.buffer(pages, "int32_t *"),
               seq=self)
        return pages

    def state_size(self) -> int:
        """The bytes of this sequence's KV state, as save would write them (less the file's header)."""
        i = self.instance
        with i.lock:
            return int(i.lib.kiln_seq_state_size(i.handle, self.live()))

    def snapshot(self) -> tuple[list[int], bytes]:
        """The sequence's tokens and its whole state as bytes: its KV pages and, in a hybrid, its
        recurrent slot (m.sequence_restored gives them back, bit for bit)."""
        i = self.instance
        with i.lock:
            size = int(i.lib.kiln_seq_state_size(i.handle, self.live()))
            state = bytearray(size)
            i.check(i.lib.kiln_seq_state_save(i.handle, self.id, i.buffer(state), size), seq=self)
            tokens = list(self.tokens)
        if len(tokens) != self.n_past:
            raise ModelError(f"sequence {self.id} holds {self.n_past} positions but knows {len(tokens)} of their tokens")
        return tokens, bytes(state)

    def save(self, path: str | os.PathLike[str]) -> int:
        """Write the sequence's KV cache and tokens to a file (kv_file.py); returns its size in bytes.
        m.sequence_from(path) gives them back, bit for bit."""
        from . import kv_file

        tokens, state = self.snapshot()
        return kv_file.write(path, self.instance, tokens, state, self.exact)

    def fork(self) -> "Sequence":
        """A new sequence holding the same positions: full pages are shared, a page either
        writes into is copied first."""
        i = self.instance
        child = Sequence(self.model, i.call(i.lib.kiln_seq_fork, self.live(), seq=self))
        child.tokens, child.exact = list(self.tokens), self.exact
        return child

    def close(self) -> None:
        if not self.closed:
            self.instance.call(self.instance.lib.kiln_seq_close, self.id, seq=self)
            self.closed = True
            self.tokens.clear()

    def generate(self, prompt: str | list[int], **options) -> str | Iterator[str]:
        """Continue `prompt` (text, or token ids) on this sequence: Model.generate_on, whose options
        (sampling, stop, stream, context_shift, constraints, logit_bias, speculation) it takes."""
        return self.model.generate_on(self, prompt, **options)

    def shift_if_full(self, sinks: int) -> None:
        """Shift the sequence if its context is full (the decoding loops' context shift)."""
        if self.n_past >= self.instance.n_ctx:
            self.shift(self.instance.sinks(self.tokens, sinks))

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
