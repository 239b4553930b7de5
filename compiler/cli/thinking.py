"""A reasoning model's thinking in the terminal (`kiln chat`, `kiln run --chat`): dimmed, apart from
the answer, its markers gone (text/reasoning.py takes the reply apart as it streams)."""
from __future__ import annotations

import argparse

from ..text.reasoning import Format, ReasoningStream

DIM, RESET = "\x1b[2m", "\x1b[0m"


def add_think_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--no-think", action="store_true",
                   help="ask a reasoning model not to think (enable_thinking false, where its chat template reads it)")


class ThinkingView:
    """Writes a reply's pieces to `out`: the thinking dimmed (plain where out is no terminal),
    then a blank line and the answer."""

    def __init__(self, fmt: Format, opened: bool, out):
        self.stream, self.out = ReasoningStream(fmt, opened), out
        self.dim = DIM if getattr(out, "isatty", lambda: False)() else ""
        self.thinking = self.thought = False

    def write(self, piece: str, final: bool = False) -> None:
        for kind, text in self.stream.push(piece) + (self.stream.finish() if final else []):
            if kind == "reasoning":
                if not self.thinking:
                    self.out.write(self.dim)
                self.thinking = self.thought = True
            elif self.thinking:  # the answer begins
                self.out.write((RESET if self.dim else "") + "\n\n")
                self.thinking = False
            self.out.write(text if kind != "call" else f"[call {text[0]}({text[1]})]")
        if final and self.thinking:
            self.out.write(RESET if self.dim else "")
        self.out.flush()
