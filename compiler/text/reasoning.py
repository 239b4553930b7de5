"""A reasoning model's thinking, apart from its answer, as llama-server and vLLM return them.

Two formats, told apart by the chat template (`format_of`):

- THINK: the thinking between `<think>` and `</think>`, then the answer (Qwen3, Qwen3.5, the
  DeepSeek-R1 distills, SmolLM3). A template may open the section itself: Qwen3.5's and the
  distills' generation prompts end with `<think>\\n`, so the output starts inside it; with
  `enable_thinking: false` they write an empty section, and the output starts after it
  (`opens_in_thinking` reads which from the rendered prompt).
- HARMONY: gpt-oss's channels. Each message is `<|channel|>NAME<|message|>TEXT` ended by `<|end|>`
  (then `<|start|>assistant` and the next), `<|return|>` or `<|call|>`. `analysis` is the thinking,
  `final` the answer; a message whose header names a recipient `to=functions.NAME` is a call of
  that function with its text as the arguments (the `commentary` channel).

`split` takes a whole output apart; `ReasoningStream` does it as the text comes, holding back a
tail that may yet become a marker, so that the concatenation of what it hands out is what
`split` gives whole. A thinking section the output never closes (max_tokens reached within it)
is all reasoning, as llama-server returns it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import Enum

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
CHANNEL, MESSAGE, START = "<|channel|>", "<|message|>", "<|start|>"
HARMONY_ENDS = ("<|end|>", "<|return|>", "<|call|>")
RECIPIENT = re.compile(r"to=functions\.([^\s<]+)")


class Format(Enum):
    NONE = "none"  # no thinking section: the output is the answer
    THINK = "think"
    HARMONY = "harmony"


def format_of(template: str) -> Format:
    """The reasoning format a chat template's model writes: harmony where the template speaks in
    channels, think tags where it names them, else none."""
    if CHANNEL in template and MESSAGE in template:
        return Format.HARMONY
    if THINK_CLOSE in template:
        return Format.THINK
    return Format.NONE


def opens_in_thinking(fmt: Format, prompt: str) -> bool:
    """Whether the output starts inside a thinking section the prompt opened (its generation
    prompt ends with `<think>`, and no `</think>` follows it)."""
    return fmt is Format.THINK and prompt.rstrip().endswith(THINK_OPEN)


def closed_in_prompt(fmt: Format, prompt: str) -> bool:
    """Whether the prompt ends with a thinking section already closed (Qwen3's and Qwen3.5's
    templates with enable_thinking false write an empty one): the output is all answer."""
    return fmt is Format.THINK and prompt.rstrip().endswith(THINK_CLOSE)


@dataclass
class Parsed:
    reasoning: str = ""
    content: str = ""
    calls: list[tuple[str, str]] = field(default_factory=list)  # (function name, arguments' text)


def split(text: str, fmt: Format, open_at_start: bool = False) -> Parsed:
    """A whole output taken apart."""
    stream = ReasoningStream(fmt, open_at_start)
    parts = stream.push(text) + stream.finish()
    out = Parsed()
    for kind, piece in parts:
        if kind == "reasoning":
            out.reasoning += piece
        elif kind == "content":
            out.content += piece
        else:
            out.calls.append(piece)
    return out


def _held(text: str, markers: tuple[str, ...]) -> int:
    """The length of the longest tail of `text` that a marker begins with (and may yet become)."""
    return max((k for m in markers for k in range(min(len(m) - 1, len(text)), 0, -1) if m.startswith(text[-k:])),
               default=0)


class ReasoningStream:
    """Text in, ("reasoning" | "content", text) and ("call", (name, arguments)) parts out."""

    def __init__(self, fmt: Format, open_at_start: bool = False):
        self.fmt = fmt
        self.buf = ""
        # THINK: "before" (the answer unless a section opens first), "thinking", "answer", and the
        # ":lead" of each, whose leading whitespace belongs to neither
        self.state = "thinking" if open_at_start else "before"
        self.header: str | None = None  # HARMONY: the current message's header, once complete

    def push(self, piece: str) -> list[tuple[str, object]]:
        self.buf += piece
        if self.fmt is Format.THINK:
            return self._think(final=False)
        if self.fmt is Format.HARMONY:
            return self._harmony(final=False)
        out, self.buf = ([("content", self.buf)] if self.buf else []), ""
        return out

    def finish(self) -> list[tuple[str, object]]:
        if self.fmt is Format.THINK:
            return self._think(final=True)
        if self.fmt is Format.HARMONY:
            return self._harmony(final=True)
        return []

    # -- think tags -------------------------------------------------------------------------
    def _think(self, final: bool) -> list[tuple[str, object]]:
        out: list[tuple[str, object]] = []
        while self.buf:
            if self.state == "before":  # whitespace, then either <think> or the answer
                lead = self.buf.lstrip()
                if not lead and not final:
                    return out
                if lead.startswith(THINK_OPEN):
                    self.buf, self.state = lead[len(THINK_OPEN):], "thinking:lead"
                    continue
                if THINK_OPEN.startswith(lead) and not final:
                    return out  # may yet be the opening tag
                self.state = "answer"
            elif self.state == "thinking":
                at = self.buf.find(THINK_CLOSE)
                if at >= 0:
                    if self.buf[:at]:
                        out.append(("reasoning", self.buf[:at]))
                    self.buf, self.state = self.buf[at + len(THINK_CLOSE):], "answer:lead"
                    continue
                keep = 0 if final else _held(self.buf, (THINK_CLOSE,))
                if len(self.buf) > keep:
                    out.append(("reasoning", self.buf[:len(self.buf) - keep]))
                self.buf = self.buf[len(self.buf) - keep:]
                return out
            elif self.state.endswith(":lead"):  # the newlines after <think>, the whitespace after </think>
                self.buf = self.buf.lstrip("\n") if self.state == "thinking:lead" else self.buf.lstrip()
                if not self.buf:
                    return out
                self.state = self.state.removesuffix(":lead")
            else:
                out.append(("content", self.buf))
                self.buf = ""
        return out

    # -- harmony ----------------------------------------------------------------------------
    def _harmony(self, final: bool) -> list[tuple[str, object]]:
        out: list[tuple[str, object]] = []
        while True:
            if self.header is None:  # between messages: up to the next <|message|>
                at = self.buf.find(MESSAGE)
                if at < 0:
                    if final and self.buf.strip() and CHANNEL not in self.buf and START not in self.buf:
                        out.append(("content", self.buf))  # text outside any message: the answer's
                        self.buf = ""
                    return out
                self.header, self.buf = self.buf[:at], self.buf[at + len(MESSAGE):]
                self.body = ""
            ends = [(i, m) for m in HARMONY_ENDS if (i := self.buf.find(m)) >= 0]
            at, marker = min(ends) if ends else (-1, "")
            text = self.buf if at < 0 else self.buf[:at]
            keep = 0 if at >= 0 or final else _held(text, HARMONY_ENDS)
            ready, self.buf = text[:len(text) - keep], text[len(text) - keep:] + ("" if at < 0 else
                                                                                  self.buf[at + len(marker):])
            called = RECIPIENT.search(self.header)
            if called:  # a call's arguments go out whole, at the message's end
                self.body += ready
                if at >= 0 or final:
                    out.append(("call", (called.group(1), self.body.strip())))
            elif ready:
                channel = self.header.split(CHANNEL)[-1].split()[0] if CHANNEL in self.header else ""
                out.append(("reasoning" if channel == "analysis" else "content", ready))
            if at < 0:
                if final:
                    self.header = None
                return out
            self.header = None  # the next header (<|start|>assistant<|channel|>...) is read whole
