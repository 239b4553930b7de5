"""Text generation on top of steps: sampled tokens become text pieces, cut at stop strings.

Shared by a single sequence's `generate`, by `Model.generate_batch`, which decodes many
sequences in one step each, and by the server's engine.
"""
from __future__ import annotations

import codecs
from dataclasses import dataclass

import numpy as np

from .constraints import Guide
from .sampling import LogitBias, Sampler, SamplingParams


class TextStream:
    """Tokens in, text out: UTF-8 decoded incrementally; the text is cut at the first stop
    string, and a tail that could still become one is held back until it cannot."""

    def __init__(self, tokenizer, stops: list[str], special: bool = False):
        self.tokenizer, self.stops, self.special = tokenizer, stops, special  # special: control tokens as text
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.text, self.emitted, self.stopped = "", 0, False
        self.hold = max((len(s) - 1 for s in stops), default=0)
        self.scanned = 0  # text before this has been searched; a stop string can start only hold before it

    def push(self, token: int) -> str:
        """The text that token makes certain; sets `stopped` once a stop string appears. Each
        token's search covers only the new text and the `hold` characters before it."""
        self.text += self.decoder.decode(self.tokenizer.token_bytes(token, self.special))
        start = max(0, self.scanned - self.hold)
        self.scanned = len(self.text)
        cut = min((i for i in (self.text.find(s, start) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            self.stopped = True
            piece, self.emitted = self.text[self.emitted:cut], len(self.text)
            return piece
        if len(self.text) - self.hold > self.emitted:
            piece, self.emitted = self.text[self.emitted:len(self.text) - self.hold], len(self.text) - self.hold
            return piece
        return ""

    def finish(self) -> str:
        if self.stopped:
            return ""
        tail = self.text[self.emitted:] + self.decoder.decode(b"", final=True)
        self.emitted = len(self.text)
        return tail


def stop_list(stop: list[str] | str | None) -> list[str]:
    return [stop] if isinstance(stop, str) else list(stop or [])


class ThinkingBudget:
    """At most `limit` tokens of thinking: counted from the start where the prompt opened the
    section, else from the output's `open` marker; at the limit the `close` ids are forced, one a
    step, and the answer follows (llama-server's --reasoning-budget, per request). A section the
    model closes itself ends the count."""

    def __init__(self, limit: int, open_text: str, close_text: str, close_ids: list[int], open_at_start: bool):
        self.limit, self.open_text, self.close_text, self.close_ids = limit, open_text, close_text, close_ids
        self.state = "thinking" if open_at_start else "before"  # then "closing", "done"
        self.count, self.since = 0, 0  # thinking tokens; where in the text the section's thinking began
        self.forcing: list[int] = []

    def forced(self) -> int | None:
        """The token the next step must take, or None to sample."""
        if self.state == "thinking" and self.count >= self.limit:
            self.state, self.forcing = "closing", list(self.close_ids)
        return self.forcing.pop(0) if self.state == "closing" and self.forcing else None

    def saw(self, text: str) -> None:
        """The output so far, after each token taken."""
        if self.state == "before" and (at := text.find(self.open_text)) >= 0:
            self.state, self.since = "thinking", at + len(self.open_text)
        elif self.state == "thinking":
            if self.close_text in text[self.since:]:
                self.state = "done"
            else:
                self.count += 1
        elif self.state == "closing" and not self.forcing:
            self.state = "done"


@dataclass(frozen=True)
class Sampled:
    text: str  # what the token makes certain (empty while a stop string could still match)
    token: int | None  # to feed back, or to report; None for an end-of-generation token
    finish_reason: str | None  # "stop" or "length" once generation ends


class Decoding:
    """One sequence's generation: `next(logits, n_past)` samples a token and says what text it
    adds and whether generation has ended: an end-of-generation token, a stop string or a
    constraint's grammar complete ("stop"), max_tokens or a full context ("length"; never with
    context_shift, where the caller shifts the sequence instead of stopping). With a `guide`
    (constraints.py) only the tokens it allows are sampled; `bias` is OpenAI's logit_bias."""

    def __init__(self, tokenizer, eog_ids, n_ctx: int, prompt_ids: list[int], params: SamplingParams,
                 stops: list[str], max_tokens: int, ignore_eos: bool = False, context_shift: bool = False,
                 guide: Guide | None = None, bias: LogitBias | None = None, thinking: ThinkingBudget | None = None,
                 special: bool = False):
        self.eog_ids = frozenset() if ignore_eos else eog_ids
        self.n_ctx, self.left = (None if context_shift else n_ctx), max_tokens
        self.sample, self.history = Sampler(params), list(prompt_ids)
        self.text = TextStream(tokenizer, stops, special)
        self.guide, self.bias, self.thinking = guide, bias, thinking

    def ready(self) -> bool:
        """Whether next() would sample without waiting for a constraint's mask."""
        return self.guide is None or self.guide.ready()

    def next(self, logits: np.ndarray, n_past: int) -> Sampled:
        if self.left <= 0:
            return Sampled(self.text.finish(), None, "length")
        if self.thinking is not None and (forced := self.thinking.forced()) is not None:
            return self.take(forced, n_past)
        allowed = None
        if self.guide is not None:
            allowed = self.guide.mask()  # DeadEnd when the constraint allows nothing
            if self.guide.stopped:  # the grammar is complete: the end is all it allows
                return Sampled(self.text.finish(), None, "stop")
        return self.take(self.sample(logits, self.history, allowed, self.bias), n_past)

    def take(self, tok: int, n_past: int) -> Sampled:
        """Generation goes on with `tok`, which the caller drew from this row's distribution
        (speculative sampling's rule, speculation.py); next() is sample-then-take."""
        if tok in self.eog_ids:
            return Sampled(self.text.finish(), None, "stop")
        self.history.append(tok)
        self.left -= 1
        piece = self.text.push(tok)
        if self.thinking is not None:
            self.thinking.saw(self.text.text)
        if self.text.stopped:
            return Sampled(piece, tok, "stop")
        if self.left == 0 or (self.n_ctx is not None and n_past >= self.n_ctx):
            return Sampled(piece + self.text.finish(), tok, "length")
        if self.guide is not None:  # the next mask is computed while the caller steps
            self.guide.advance(tok, self.text.tokenizer.token_bytes(tok))
        return Sampled(piece, tok, None)
