"""Prefix reuse for hybrid models: whole-state snapshots at token boundaries, LRU within a byte budget.

A hybrid's recurrent state holds every position at once, so a prefix of it cannot be taken from a
longer sequence's pages as the radix cache takes KV pages (radix_cache.py). Instead the scheduler
snapshots a sequence's whole state (its KV pages and its recurrent slot, Sequence.snapshot) where
a later request is likely to continue it: every `interval` tokens of a prompt (its prefill is cut
there), at the end of each prompt, and at the end of each request (a conversation's next turn
starts with all of it). A request restores the deepest snapshot whose tokens begin its prompt and
prefills the rest; restoring is a copy, so the result is the same bits as computing it.

A snapshot is never invalidated by what later requests do (it is a copy, not shared pages); only
the budget evicts, least recently used first. Unlike llama-server's context checkpoints, they are
not tied to one slot: any request may restore any snapshot into any free sequence.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from ..core.sequences import common_prefix
from ..runtime import Model, Sequence


@dataclass(frozen=True)
class Snapshots:
    """The serve options of a hybrid's snapshots (--snapshot-interval, --snapshot-mib)."""
    interval: int = 256  # tokens of a prompt between snapshots
    budget_bytes: int = 1 << 30


@dataclass(frozen=True)
class Snapshot:
    tokens: tuple[int, ...]
    state: bytes


class StateCache:
    def __init__(self, model: Model, settings: Snapshots):
        self.model, self.budget, self.interval = model, settings.budget_bytes, settings.interval
        self.entries: OrderedDict[tuple[int, ...], Snapshot] = OrderedDict()  # least recently used first
        self.bytes = 0
        self.hits = self.misses = self.taken = self.evicted = 0

    def take(self, seq: Sequence) -> None:
        """Snapshot seq as it stands (once per token list), then evict down to the budget."""
        key = tuple(seq.tokens)
        if key in self.entries:
            self.entries.move_to_end(key)
            return
        if not key or not seq.exact:  # a shifted sequence's state is no prefix's
            return
        tokens, state = seq.snapshot()
        if len(state) > self.budget:
            return
        self.entries[key] = Snapshot(tuple(tokens), state)
        self.bytes += len(state)
        self.taken += 1
        while self.bytes > self.budget:
            _, old = self.entries.popitem(last=False)
            self.bytes -= len(old.state)
            self.evicted += 1

    def match(self, ids: list[int]) -> Snapshot | None:
        """The deepest snapshot whose tokens begin ids, leaving at least one token to run."""
        best = None
        for key, snap in self.entries.items():
            if len(key) < len(ids) and (best is None or len(key) > len(best.tokens)) \
                    and common_prefix(key, ids) == len(key):
                best = snap
        if best is None:
            self.misses += 1
            return None
        self.hits += 1
        self.entries.move_to_end(best.tokens)
        return best

    def restore(self, snap: Snapshot) -> Sequence:
        return self.model.sequence_restored(snap.tokens, snap.state)

    def cut(self, n_past: int, todo: int) -> int:
        """How many of a prompt's `todo` tokens the next chunk may take from n_past, so that it ends at
        the next multiple of the interval (where a snapshot is taken), if it would pass one."""
        boundary = (n_past // self.interval + 1) * self.interval
        return boundary - n_past if n_past + todo > boundary else todo
