"""Prompt lookup (n-gram drafting; llama.cpp's `lookup`, vLLM's `ngram`): the next tokens are guessed
from where the history's own last tokens occurred before.

PromptLookup keeps a cursor into the history: the place it believes the output is copying from.
A model quoting a passage reads it forwards, so once the output follows the passage at p, the
guess is what follows p, and the cursor moves on with each token that matches; it is looked up
again only when the output leaves it, or a longer match than its own turns up. A lookup matches
the history's last n-gram, longest first (n from n_max down to n_min), and among the places that
n-gram occurred takes the first at or after where the last copy left off (a copy that skipped or
reworded a few words goes on further down the same passage), else the latest. The cursor's run
(how many tokens before it agree with the history's end) tells DraftLength how far to trust it.

LookupDrafts is one sequence's drafting: the lookup, the length policy, and what a step drafted,
so that the decoding loops and the server draft and learn the same way.
"""
from __future__ import annotations

import bisect

from .draft_length import DraftLength, StepCost

REACH = 64  # a run is counted up to here: past 32 tokens of agreement a guess is as good as it gets


class PromptLookup:
    """Prompt lookup over one sequence's history (a list the caller appends to: prompt and
    output). An index maps every n-gram (n_min <= n <= n_max) whose next token is known to the
    places it ended, in order. Past the history's end the guess goes around the loop the cursor
    is in (the text repeating with that period), so a repetition yields whole drafts. Matches
    of one token (a comma, "the") guess too poorly to pay for their rows, so n starts at 2."""

    def __init__(self, history: list[int], n_max: int = 6, n_min: int = 2):
        self.history, self.n_max, self.n_min = history, n_max, n_min
        self.index: dict[tuple[int, ...], list[int]] = {}  # keys of different lengths never collide
        self.indexed = 0  # history[:indexed] is in the index
        self.cursor: int | None = None  # history[cursor] is the guess for the next token
        self.run = 0  # tokens before the cursor that agree with the history's end, up to REACH
        self.left_off = 0  # where the last copy was when the output left it

    def catch_up(self) -> None:
        """Index the tokens appended since the last call (O(n_max) each), move the cursor over
        those it guessed, and look up again if one differed or a longer match may exist."""
        h, index, start = self.history, self.index, self.indexed
        if start == len(h):
            return
        for end in range(max(start, 1), len(h)):  # the n-grams ending at `end`, followed by h[end]
            for n in range(self.n_min, min(self.n_max, end) + 1):
                index.setdefault(tuple(h[end - n:end]), []).append(end)
        self.indexed = len(h)
        cursor = self.cursor
        for token in h[start:]:
            if cursor is None or h[cursor] != token:
                if cursor is not None:
                    self.left_off = cursor
                cursor = None
                break
            cursor += 1
        self.cursor, self.run = cursor, (min(self.run + len(h) - start, REACH) if cursor is not None else 0)
        if self.run < self.n_max:
            self._look_up()

    def _look_up(self) -> None:
        """The longest n-gram ending the history that occurred before; the cursor stays if its run
        is at least that long (it is one of those places, and the copy goes on)."""
        h, size = self.history, len(self.history)
        for n in range(min(self.n_max, size - 1), max(self.n_min, self.run + 1) - 1, -1):
            ends = self.index.get(tuple(h[size - n:]))
            if ends:
                if self.cursor is not None:
                    self.left_off = self.cursor
                at = bisect.bisect_left(ends, self.left_off)
                self.cursor = ends[at] if at < len(ends) else ends[-1]
                self.run = self._agreement(self.cursor)
                return

    def _agreement(self, cursor: int) -> int:
        """How many tokens before `cursor` equal the history's last ones (up to REACH)."""
        h, size, run = self.history, len(self.history), 0
        while run < REACH and run < cursor and h[cursor - 1 - run] == h[size - 1 - run]:
            run += 1
        return run

    def propose(self, k: int) -> list[int]:
        """Up to k tokens from the cursor on; [] when no n-gram of the history's end occurred before."""
        self.catch_up()
        if self.cursor is None:
            return []
        h, start = self.history, self.cursor
        period = len(h) - start
        return [h[start + i % period] for i in range(k)]


class LookupDrafts:
    """One sequence's prompt lookup and draft length, and what its last step drafted."""

    def __init__(self, history: list[int], max_draft: int, cost: StepCost):
        self.lookup, self.length = PromptLookup(history), DraftLength(max_draft, cost)
        self.drafts: list[int] = []
        self.guess: int | None = None  # the first token a k = 0 step would have drafted, scored when sampled
        self.run = 0  # the cursor's run when they were drafted

    def draft(self, room: int, decodes: int = 1, rows: int | None = None) -> list[int]:
        """This step's drafts: at most `room`, as many as pay beside `decodes` decoding sequences'
        `rows` rows (DraftLength.choose)."""
        self.lookup.catch_up()
        self.run = self.lookup.run
        k = min(self.length.choose(decodes, rows, self.run), room) if self.lookup.cursor is not None else 0
        proposal = self.lookup.propose(max(k, 1))
        self.drafts, self.guess = proposal[:k], (proposal[0] if proposal and not k else None)
        return self.drafts

    def drop(self) -> None:
        """The step went on without the drafts (no pages for them): nothing to learn from it."""
        self.drafts, self.guess = [], None

    def observe(self, accepted: int, first: int) -> None:
        """The step's verification: `accepted` drafts held, `first` the token its first row gave. A
        guess that was not sent is scored too, so drafting resumes once guesses would pay."""
        if self.drafts:
            self.length.observe(accepted, len(self.drafts), self.run)
        elif self.guess is not None:
            self.length.observe(int(first == self.guess), 1, self.run)
