"""Chat prompts: a GGUF's own chat template (tokenizer.chat_template) rendered with jinja2 as
Hugging Face does (a sandboxed environment, `messages`, `add_generation_prompt`, the BOS/EOS
token texts). A GGUF without one gets its architecture's built-in template
(templates/chat/<name>.jinja, named by the architecture template), as llama.cpp falls back.
"""
from __future__ import annotations

import secrets
from dataclasses import dataclass

from jinja2.exceptions import TemplateError as JinjaTemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from ..core.errors import KilnError
from ..frontend.spec import ModelSpec
from ..core.paths import CHAT_TEMPLATE_DIR
from ..frontend.architecture import load_architecture

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


def render_chat(spec: ModelSpec, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
    return render_chat_spans(spec, messages, add_generation_prompt)[0]


def render_chat_spans(spec: ModelSpec, messages: list[dict[str, str]],
                      add_generation_prompt: bool = True) -> tuple[str, list[tuple[int, int]]]:
    """The rendered prompt, and the spans of it that are the messages' own text (to tokenize with
    their special-token look-alikes as text: Tokenizer.tokenize's `plain`). Each message's text,
    less its outer whitespace (which a template may trim), is framed by markers no one can guess
    before rendering; they are taken out after, and where they were are the spans."""
    template = chat_template(spec)
    tok = spec.tokenizer
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise
    open_, close = f"\ue000{secrets.token_hex(8)}", f"{secrets.token_hex(8)}\ue001"

    def text(i):
        return tok.tokens[i] if i is not None else ""

    def framed(content: str) -> str:
        core = content.strip()
        if not core:
            return content
        lead = content[:len(content) - len(content.lstrip())]
        return f"{lead}{open_}{core}{close}{content[len(lead) + len(core):]}"

    try:
        out = env.from_string(template.source).render(
            messages=[{**m, "content": framed(m["content"])} for m in messages],
            add_generation_prompt=add_generation_prompt, bos_token=text(tok.bos_id), eos_token=text(tok.eos_id))
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
