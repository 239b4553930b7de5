"""How a model calls tools, as text: the call format kiln constrains and parses, and the built-in
prompt for chat templates that know nothing of tools.

The format is the one Hermes, Qwen 2.5/3 and SmolLM3 write: each call a JSON object of the
function's name and arguments between `<tool_call>` and `</tool_call>`,

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

and a tool's result comes back between `<tool_response>` and `</tool_response>`.

A template that renders `tools` itself (it names them in its output) is given them, with assistant
messages' `tool_calls` and `role: "tool"` messages as transformers passes them. A template that
does not (both bundled models') gets the fallback: FALLBACK_PROMPT, with the tools' JSON, joins
the system message (or becomes one), an assistant's calls are written into its text in the format
above, and tool results become a user message of `<tool_response>` blocks.
"""
from __future__ import annotations

import json
import re

OPEN, CLOSE = "<tool_call>", "</tool_call>"
RESPONSE_OPEN, RESPONSE_CLOSE = "<tool_response>", "</tool_response>"

FALLBACK_PROMPT = """You can call functions to help you answer. Each is described by a JSON schema:

{tools}

To call a function, reply with a JSON object of its name and arguments between {open} and {close}, like this:
{open}
{{"name": "<function name>", "arguments": {{"<argument>": <value>}}}}
{close}
Write one such block for each call. Each result comes back between {response_open} and {response_close}. \
If no function helps, answer in plain text."""

# What kiln's call grammar makes a call begin with (its JSON with ", " and ": " separators, name first).
CALL_HEAD = re.compile(r'\s*\{"name": "((?:[^"\\]|\\.)*)", "arguments": ')


def fallback_prompt(tools: list[dict]) -> str:
    return FALLBACK_PROMPT.format(tools="\n".join(json.dumps(t, ensure_ascii=False) for t in tools), open=OPEN,
                                  close=CLOSE, response_open=RESPONSE_OPEN, response_close=RESPONSE_CLOSE)


def call_text(name: str, arguments: str) -> str:
    """A call as the model writes it (`arguments`: its JSON text)."""
    return f'{OPEN}\n{{"name": {json.dumps(name, ensure_ascii=False)}, "arguments": {arguments}}}\n{CLOSE}'


def arguments_text(arguments) -> str:
    """OpenAI's arguments are a JSON string; transformers' templates take an object."""
    return arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)


def fallback_messages(messages: list[dict], tools: list[dict] | None) -> list[dict]:
    """The conversation for a template without tools: the tool prompt in the system message, calls in
    the assistant's text, tool results as user messages (consecutive ones in one)."""
    out: list[dict] = []
    rest = messages
    if tools:
        system = fallback_prompt(tools)
        if messages and messages[0]["role"] == "system":
            system = f"{(messages[0].get('content') or '').rstrip()}\n\n{system}"
            rest = messages[1:]
        out.append({"role": "system", "content": system})
    for m in rest:
        if m["role"] == "tool":
            block = f"{RESPONSE_OPEN}\n{m.get('content') or ''}\n{RESPONSE_CLOSE}"
            if out and out[-1].get("from_tool"):
                out[-1]["content"] += "\n" + block
            else:
                out.append({"role": "user", "content": block, "from_tool": True})
        elif m["role"] == "assistant" and m.get("tool_calls"):
            calls = [call_text(c["function"]["name"], arguments_text(c["function"]["arguments"]))
                     for c in m["tool_calls"]]
            out.append({"role": "assistant", "content": "\n".join([m.get("content") or "", *calls]).strip()})
        else:
            out.append({"role": m["role"], "content": m.get("content") or ""})
    return [{k: v for k, v in m.items() if k != "from_tool"} for m in out]


def split_call(block: str) -> tuple[str, str] | None:
    """A call block's (name, arguments JSON text), or None if it is not a call. kiln's grammar writes
    `{"name": ..., "arguments": ...}` exactly, and the arguments are its text; anything else that
    parses as such an object is taken too."""
    block = block.strip()
    head = CALL_HEAD.match(block)
    if head and block.endswith("}"):
        args = block[head.end():-1].strip()
        try:
            json.loads(args)
            return json.loads(f'"{head.group(1)}"'), args
        except ValueError:
            pass
    try:
        obj = json.loads(block)
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or "arguments" not in obj:
        return None
    return obj["name"], arguments_text(obj["arguments"])


def split_calls(text: str, split=split_call) -> tuple[str, list[tuple[str, str]]]:
    """The text before the first call (stripped), and every complete call block after it, each
    read by `split` (this format's, or tool_calls_xml.py's)."""
    at = text.find(OPEN)
    if at < 0:
        return text, []
    calls = []
    for block in re.findall(re.escape(OPEN) + r"(.*?)" + re.escape(CLOSE), text[at:], re.S):
        call = split(block)
        if call is not None:
            calls.append(call)
    return text[:at].strip(), calls
