"""OpenAI's tools in `kiln serve`: the constraint a tool_choice puts on the output, and the calls in
the output as `message.tool_calls`, whole or streamed as `delta.tool_calls`.

The calls are written in the format of text/tool_calls.py (`<tool_call>{"name": ..., "arguments":
...}</tool_call>`), or in Qwen3.5's XML (text/tool_calls_xml.py) where the chat template teaches
that (`Calls.of`). With tool_choice "required" or a named function the whole output is held to
one or more valid calls (of that function; its parameters' JSON schema); with "auto" the model
writes freely until it begins a call (the `<tool_call>` marker), and the call is held to the
grammar from there (a lazy constraint). "none" renders no tools and constrains nothing.
"""
from __future__ import annotations

import json
import uuid

from dataclasses import dataclass, field

from ..runtime.constraints import JSON_OPTIONS, Constraint
from ..text.tool_calls import CALL_HEAD, CLOSE, OPEN, split_call, split_calls
from ..text.tool_calls_xml import split_xml_call, uses_xml_calls, xml_call_rules


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass(frozen=True)
class Calls:
    """How this model writes its calls: JSON (kiln's format) or XML (Qwen3.5's), and the request's
    functions by name (the XML's parameters are typed by them)."""
    xml: bool = False
    functions: dict = field(default_factory=dict)

    @classmethod
    def of(cls, template: str, functions: list[dict] | None = None) -> "Calls":
        return cls(uses_xml_calls(template), {f["name"]: f for f in functions or []})

    def split(self, block: str) -> tuple[str, str] | None:
        return split_xml_call(block, self.functions) if self.xml else split_call(block)


def call_constraint(functions: list[dict], forced: bool, parallel: bool, field: str = "tools",
                    xml: bool = False) -> Constraint:
    """The output's grammar for calls of `functions` (OpenAI's function objects): each call a JSON
    object of a function's name and arguments valid for its parameters (or, `xml`, Qwen3.5's
    `<function=...>` block of them). `forced`: the output is nothing but calls; else the constraint
    starts at the first `<tool_call>` (what precedes is free)."""
    block = f'ws call ws "{CLOSE}"'
    more = f' (ws "{OPEN}" {block})*' if parallel else ""
    head = (f'start: {json.dumps(OPEN) + " " if forced else ""}{block}{more} ws\n'
            'ws: /[ \\n]{0,2}/\n')
    if xml:
        rules = [r for i, f in enumerate(functions) for r in xml_call_rules(i, f)]
        lark = head + f"call: {' | '.join(f'fn_{i}' for i in range(len(functions)))}\n" + "\n".join(rules) + "\n"
    else:
        calls = {"anyOf": [{"type": "object", "additionalProperties": False, "required": ["name", "arguments"],
                            "properties": {"name": {"const": f["name"]},
                                           "arguments": f.get("parameters") or {"type": "object"}}}
                           for f in functions], "x-guidance": JSON_OPTIONS}
        lark = head + f'call: %json {json.dumps(calls)}\n'
    return Constraint("lark", lark, field, trigger=None if forced else OPEN)


def message_of(text: str, finish_reason: str | None, calls_in: Calls = Calls()) -> tuple[dict, str | None]:
    """A whole answer's `message` (content, and tool_calls when it made any) and its finish_reason
    ("tool_calls" for an answer that ended after its calls)."""
    content, calls = split_calls(text, calls_in.split)
    if not calls:
        return {"role": "assistant", "content": text}, finish_reason
    message = {"role": "assistant", "content": content or None,
               "tool_calls": [{"id": new_call_id(), "type": "function", "function": {"name": n, "arguments": a}}
                              for n, a in calls]}
    return message, "tool_calls" if finish_reason == "stop" else finish_reason


def _held(text: str) -> int:
    """How many characters at the end of `text` may yet begin a call: the longest tail that is a
    prefix of the marker, and the whitespace before it (dropped if a call follows)."""
    keep = next((k for k in range(min(len(OPEN) - 1, len(text)), 0, -1) if OPEN.startswith(text[-k:])), 0)
    return len(text) - len(text[:len(text) - keep].rstrip())


class ToolStream:
    """The chunks' deltas for a streamed answer with tools, fed its text as it comes: `content`
    until a call begins, then for each call a first delta with its index, id, type and name, and
    its arguments' text in pieces as they are written (OpenAI's `delta.tool_calls`). Their
    concatenation is what message_of gives whole."""

    def __init__(self, calls_in: Calls = Calls()):
        self.text, self.sent = "", 0  # content characters sent
        self.calls: list[list] = []  # per call begun: [header end within its block, argument characters sent]
        self.calls_in = calls_in  # XML calls go out whole, at their block's end

    @property
    def called(self) -> bool:
        return bool(self.calls)

    def push(self, piece: str, final: bool = False) -> list[dict]:
        self.text += piece
        at = self.text.find(OPEN)
        deltas = []
        end = (len(self.text) if final else len(self.text) - _held(self.text)) if at < 0 else \
            len(self.text[:at].rstrip())
        if end > self.sent:
            deltas.append({"content": self.text[self.sent:end]})
            self.sent = end
        if at < 0:
            return deltas
        blocks = self.text[at:].split(OPEN)[1:]
        for i, block in enumerate(blocks):
            body, closed = block.partition(CLOSE)[0], CLOSE in block
            if self.calls_in.xml:  # a call goes out whole once its block closes
                if i < len(self.calls):
                    continue
                if not closed:
                    break
                call = self.calls_in.split(body)
                if call is None:  # not one of ours
                    continue
                self.calls.append([None, len(call[1])])
                deltas.append({"tool_calls": [{"index": i, "id": new_call_id(), "type": "function",
                                               "function": {"name": call[0], "arguments": call[1]}}]})
                continue
            if i == len(self.calls):
                head = CALL_HEAD.match(body)
                if head is None and not closed:
                    break
                call = split_call(body) if head is None else (json.loads(f'"{head.group(1)}"'), "")
                if call is None:  # a closed block that is not a call: not one of ours
                    continue
                self.calls.append([head.end() if head else None, 0])
                deltas.append({"tool_calls": [{"index": i, "id": new_call_id(), "type": "function",
                                               "function": {"name": call[0], "arguments": ""}}]})
            if i >= len(self.calls):
                break
            start, sent = self.calls[i]
            if closed:
                args = (split_call(body) or ("", ""))[1]
            else:  # hold back the last "}": it may close the call's object rather than the arguments
                args = body[start:]
                args = args[:args.rfind("}")] if "}" in args else args
            if len(args) > sent and start is not None or closed and sent == 0 and args:
                deltas.append({"tool_calls": [{"index": i, "function": {"arguments": args[sent:]}}]})
                self.calls[i][1] = len(args)
        return deltas

    def finish(self) -> list[dict]:
        return self.push("", final=True)
