"""Render a GGUF's own chat template (tokenizer.chat_template) with jinja2, as Hugging Face does:
a sandboxed environment, `messages`, `add_generation_prompt`, and the BOS/EOS token texts."""
from __future__ import annotations

from jinja2.exceptions import TemplateError as JinjaTemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from .errors import KilnError
from .gguf_model import TokenizerData


def _raise(message: str):
    raise JinjaTemplateError(message)


def render_chat(tok: TokenizerData, messages: list[dict[str, str]], add_generation_prompt: bool = True,
                source: str = "model") -> str:
    if not tok.chat_template:
        raise KilnError(f"{source}: the GGUF has no tokenizer.chat_template; run without --chat")
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise

    def text(i):
        return tok.tokens[i] if i is not None else ""

    try:
        return env.from_string(tok.chat_template).render(
            messages=messages, add_generation_prompt=add_generation_prompt,
            bos_token=text(tok.bos_id), eos_token=text(tok.eos_id))
    except JinjaTemplateError as e:
        raise KilnError(f"{source}: the chat template failed to render: {e}") from None
