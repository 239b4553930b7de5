"""A reasoning model's thinking in `kiln serve`'s chat completions, as llama-server and vLLM
return it: `message.reasoning_content` beside `message.content`, streamed as
`delta.reasoning_content` before the answer's deltas (text/reasoning.py reads the formats).

A request may pass the chat template variables reasoning models read (`reasoning_effort`, which
gpt-oss's template reads; `chat_template_kwargs`, e.g. {"enable_thinking": false} for Qwen3), and
a `reasoning_budget`: at most that many thinking tokens, after which the end of the section is
forced (runtime/generation.py's ThinkingBudget) and the answer follows. A constraint
(response_format, grammar, tools) holds the answer, not the thinking: it waits for the end of the
section (a lazy constraint whose trigger is the close marker), as llama-server and vLLM apply it.

`--reasoning-format none` leaves the thinking in the content, as llama-server's does.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictStr

from ..runtime.constraints import Constraint
from ..runtime.generation import ThinkingBudget
from ..text.reasoning import (THINK_CLOSE, THINK_OPEN, Format, ReasoningStream, closed_in_prompt, format_of,
                              opens_in_thinking, split)
from .tools import Calls, ToolStream, message_of, new_call_id

MAX_TEMPLATE_KWARGS = 32
MAX_TEMPLATE_KWARGS_BYTES = 4096
# what the chat template is given by the server itself: a request may not set these
RESERVED = frozenset({"messages", "tools", "add_generation_prompt", "bos_token", "eos_token", "raise_exception",
                      "strftime_now"})
# each format's markers for the budget: the section's opening, its end, and what is forced to end it
BUDGET_MARKERS = {Format.THINK: (THINK_OPEN, THINK_CLOSE, THINK_CLOSE),
                  Format.HARMONY: ("<|channel|>analysis<|message|>", "<|end|>",
                                   "<|end|><|start|>assistant<|channel|>final<|message|>")}


class ReasoningFields(BaseModel):
    """The chat request's reasoning fields (mixed into protocol.ChatRequest)."""
    model_config = ConfigDict(strict=True, extra="ignore")

    reasoning_effort: Literal["low", "medium", "high"] | None = None
    chat_template_kwargs: dict[StrictStr, Any] | None = None
    reasoning_budget: Annotated[int, Field(ge=0, le=1_000_000)] | None = None  # None: the server's

    def template_kwargs(self) -> dict:
        """The variables the chat template is rendered with beyond the messages; ValueError naming
        the field for a reserved name or an unbounded object."""
        extra = {"enable_thinking": True, **(self.chat_template_kwargs or {})}  # llama-server's default
        if len(extra) > MAX_TEMPLATE_KWARGS:
            raise ValueError(f"chat_template_kwargs: at most {MAX_TEMPLATE_KWARGS} variables, got {len(extra)}")
        if len(json.dumps(extra)) > MAX_TEMPLATE_KWARGS_BYTES:
            raise ValueError(f"chat_template_kwargs: at most {MAX_TEMPLATE_KWARGS_BYTES} bytes of JSON")
        taken = sorted(RESERVED & set(extra))
        if taken:
            raise ValueError(f"chat_template_kwargs: '{taken[0]}' is the server's to set (reserved: "
                             f"{', '.join(sorted(RESERVED))})")
        if self.reasoning_effort is not None:
            extra["reasoning_effort"] = self.reasoning_effort
        return extra


@dataclass(frozen=True)
class Reasoning:
    """One request's reasoning: its format, whether its output starts inside the thinking, whether
    it may think at all (not where the prompt closed the section), and whether the thinking is
    returned apart (--reasoning-format auto)."""
    fmt: Format
    open_at_start: bool
    apart: bool
    may_think: bool = True

    @classmethod
    def of(cls, template: str, prompt: str, reasoning_format: str) -> "Reasoning":
        fmt = format_of(template)
        return cls(fmt, opens_in_thinking(fmt, prompt), reasoning_format == "auto" and fmt is not Format.NONE,
                   fmt is not Format.NONE and not closed_in_prompt(fmt, prompt))

    @property
    def special(self) -> bool:
        """Whether the output's control tokens must come out as text (harmony's channels)."""
        return self.fmt is Format.HARMONY

    def budget(self, limit: int | None, tokenize) -> ThinkingBudget | None:
        if limit is None or limit < 0 or self.fmt is Format.NONE:
            return None
        open_text, close_text, forced = BUDGET_MARKERS[self.fmt]
        return ThinkingBudget(limit, open_text, close_text, tokenize(forced), self.open_at_start)

    def answer_only(self, c: Constraint | None) -> Constraint | None:
        """A constraint held back until the thinking ends, where the output may think first (not
        where the prompt closed the section). A lazy one (tools under "auto") already waits for its
        own marker."""
        if c is None or self.fmt is not Format.THINK or not self.may_think or c.trigger is not None:
            return c
        return replace(c, trigger=THINK_CLOSE)

    def message(self, text: str, finish: str | None, calls: Calls | None) -> tuple[dict, str | None]:
        """A whole answer's `message` and finish_reason; `calls`: the request's tools' format (None:
        it has none)."""
        if not self.apart:
            return message_of(text, finish, calls) if calls else ({"role": "assistant", "content": text}, finish)
        parsed = split(text, self.fmt, self.open_at_start)
        if parsed.calls:  # harmony's: the calls are messages of their own
            calls = [{"id": new_call_id(), "type": "function", "function": {"name": n, "arguments": a}}
                     for n, a in parsed.calls]
            message = {"role": "assistant", "content": parsed.content or None, "tool_calls": calls}
            finish = "tool_calls" if finish == "stop" else finish
        elif calls:
            message, finish = message_of(parsed.content, finish, calls)
        else:
            message = {"role": "assistant", "content": parsed.content}
        message["reasoning_content"] = parsed.reasoning or None
        return message, finish


class ChatStream:
    """A streamed answer's deltas: reasoning_content while it thinks, then the answer's content
    (through ToolStream where the request has tools), and harmony's calls as tool_calls."""

    def __init__(self, reasoning: Reasoning, calls: Calls | None):
        self.thinking = ReasoningStream(reasoning.fmt, reasoning.open_at_start) if reasoning.apart else None
        self.calls = ToolStream(calls) if calls else None
        self.harmony_calls = 0

    @property
    def called(self) -> bool:
        return self.harmony_calls > 0 or (self.calls is not None and self.calls.called)

    def push(self, piece: str, final: bool = False) -> list[dict]:
        parts = [("content", piece)] if self.thinking is None else \
            self.thinking.push(piece) + (self.thinking.finish() if final else [])
        deltas: list[dict] = []
        for kind, value in parts:
            if kind == "reasoning":
                deltas.append({"reasoning_content": value})
            elif kind == "call":
                name, arguments = value
                deltas.append({"tool_calls": [{"index": self.harmony_calls, "id": new_call_id(), "type": "function",
                                               "function": {"name": name, "arguments": arguments}}]})
                self.harmony_calls += 1
            elif self.calls is not None:
                deltas += self.calls.push(value)
            elif value:
                deltas.append({"content": value})
        if final and self.calls is not None:
            deltas += self.calls.finish()
        return deltas
