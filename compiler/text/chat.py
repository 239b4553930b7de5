"""Chat prompts: a GGUF's own chat template (tokenizer.chat_template) rendered with jinja2 as
Hugging Face does (a sandboxed environment, `messages`, `add_generation_prompt`, the BOS/EOS
token texts). A GGUF without one gets its architecture's built-in template
(templates/chat/<name>.jinja, named by the architecture template), as llama.cpp falls back.

Tools: a template that renders `tools` itself is given them (and the messages' `tool_calls` and
`role: "tool"` messages), as transformers and llama.cpp pass them; one that does not gets the
built-in fallback prompt of tool_calls.py.
"""
from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache

from jinja2.exceptions import TemplateError as JinjaTemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from ..core.errors import KilnError
from ..frontend.spec import ModelSpec
from ..core.paths import CHAT_TEMPLATE_DIR
from ..frontend.architecture_file import load_architecture
from .tool_calls import fallback_messages

ROLES = ("system", "user", "assistant")


@dataclass(frozen=True)
class ChatTemplate:
    source: str  # the jinja text
    origin: str  # where it came from, for messages: "the GGUF" or templates/chat/<name>.jinja


def chat_template(spec: ModelSpec) -> ChatTemplate:
    """The template a chat prompt for this model is rendered with; a KilnError when there is none."""
    if spec.tokenizer.chat_template:
        return ChatTemplate(spec.tokenizer.chat_template, "the GGUF's tokenizer.chat_template")
    name = load_architecture(spec.arch).chat_template
    if name is None:
        raise KilnError(f"{spec.path}: the GGUF has no tokenizer.chat_template and architecture '{spec.arch}' "
                        "has no built-in one (templates/<arch>.json, field chat_template); run without --chat")
    path = CHAT_TEMPLATE_DIR / f"{name}.jinja"
    return ChatTemplate(path.read_text(), str(path))


def _raise(message: str):
    raise JinjaTemplateError(message)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise
    # transformers' and llama.cpp's: gpt-oss's template writes today's date into its system message
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


@lru_cache(maxsize=16)
def renders_tools(source: str) -> bool:
    """Whether a template renders the `tools` it is given: a probe tool's name shows in its output."""
    probe = "kiln_probe_" + secrets.token_hex(4)
    tool = {"type": "function", "function": {"name": probe, "description": "a probe",
                                             "parameters": {"type": "object", "properties": {}}}}
    try:
        out = _environment().from_string(source).render(messages=[{"role": "user", "content": "hi"}], tools=[tool],
                                                         add_generation_prompt=True, bos_token="", eos_token="")
    except Exception:  # a template that fails on tools does not take them
        return False
    return probe in out


def render_chat(spec: ModelSpec, messages: list[dict], add_generation_prompt: bool = True,
                tools: list[dict] | None = None, variables: dict | None = None) -> str:
    return render_chat_spans(spec, messages, add_generation_prompt, tools, variables)[0]


def render_chat_spans(spec: ModelSpec, messages: list[dict], add_generation_prompt: bool = True,
                      tools: list[dict] | None = None,
                      variables: dict | None = None) -> tuple[str, list[tuple[int, int]]]:
    """The rendered prompt, and the spans of it that are the messages' own text (to tokenize with
    their special-token look-alikes as text: Tokenizer.tokenize's `plain`). Each message's text,
    less its outer whitespace (which a template may trim), is framed by markers no one can guess
    before rendering; they are taken out after, and where they were are the spans. `tools`
    (OpenAI's function tools) go to a template that renders them, else into the fallback prompt;
    `variables` are the template's own (enable_thinking, reasoning_effort, ...)."""
    template = chat_template(spec)
    tok = spec.tokenizer
    env = _environment()
    open_, close = f"\ue000{secrets.token_hex(8)}", f"{secrets.token_hex(8)}\ue001"
    if not renders_tools(template.source) and (tools or any(m["role"] == "tool" or m.get("tool_calls")
                                                            for m in messages)):
        messages, tools = fallback_messages(messages, tools), None

    def text(i):
        return tok.tokens[i] if i is not None else ""

    def framed(content: str | None) -> str:
        content = content or ""
        core = content.strip()
        if not core:
            return content
        lead = content[:len(content) - len(content.lstrip())]
        return f"{lead}{open_}{core}{close}{content[len(lead) + len(core):]}"

    try:
        extra = {**(variables or {}), **({"tools": tools} if tools else {})}
        out = env.from_string(template.source).render(
            messages=[{**m, "content": framed(m.get("content"))} for m in messages],
            add_generation_prompt=add_generation_prompt, bos_token=text(tok.bos_id), eos_token=text(tok.eos_id),
            **extra)
    except JinjaTemplateError as e:
        raise KilnError(f"{spec.path}: the chat template ({template.origin}) failed to render: {e}") from None
    pieces, spans, at = [], [], 0
    for i, piece in enumerate(out.split(open_)):
        if i:  # a message's text, to its close marker (or to the end, where a template cut it off)
            content, _, piece = piece.partition(close)
            pieces.append(content)
            spans.append((at, at + len(content)))
            at += len(content)
        piece = piece.replace(close, "")
        pieces.append(piece)
        at += len(piece)
    return "".join(pieces), spans
