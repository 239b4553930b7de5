"""Text generation on top of steps: sampled tokens become text pieces, cut at stop strings.

Shared by a single sequence's `generate` and by `Model.generate_batch`, which decodes many
sequences in one step each.
"""
from __future__ import annotations

import codecs


class TextStream:
    """Tokens in, text out: UTF-8 decoded incrementally; the text is cut at the first stop
    string, and a tail that could still become one is held back until it cannot."""

    def __init__(self, tokenizer, stops: list[str]):
        self.tokenizer, self.stops = tokenizer, stops
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.text, self.emitted, self.stopped = "", 0, False
        self.hold = max((len(s) - 1 for s in stops), default=0)

    def push(self, token: int) -> str:
        """The text that token makes certain; sets `stopped` once a stop string appears."""
        self.text += self.decoder.decode(self.tokenizer.token_bytes(token))
        cut = min((i for i in (self.text.find(s) for s in self.stops) if i >= 0), default=-1)
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
