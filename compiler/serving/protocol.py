"""OpenAI's request and response shapes for /v1/completions and /v1/chat/completions.

Requests are checked by pydantic in strict mode, so a field of the wrong type is an error that
names it rather than something coerced. Unknown fields are ignored, as vLLM and llama-server
do. Sampling fields OpenAI lacks are accepted under llama.cpp's and vLLM's names (top_k, min_p,
repeat_penalty or repetition_penalty). A field left out takes llama-server's default.
"""
from __future__ import annotations

import time
import uuid
from typing import Annotated, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, field_validator, model_validator

from ..runtime.sampling import SamplingParams
from .types import TokenLogprob, Usage

_DEFAULTS = SamplingParams()


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class StreamOptions(_Strict):
    include_usage: bool = False


class _Sampling(_Strict):
    model: StrictStr
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    top_k: Annotated[int, Field(ge=0)] | None = None
    min_p: Annotated[float, Field(ge=0, le=1)] | None = None
    repeat_penalty: Annotated[float, Field(gt=0)] | None = None
    repetition_penalty: Annotated[float, Field(gt=0)] | None = None
    presence_penalty: Annotated[float, Field(ge=-2, le=2)] | None = None
    frequency_penalty: Annotated[float, Field(ge=-2, le=2)] | None = None
    seed: Annotated[int, Field(ge=-1, lt=2**64)] | None = None  # -1: a random seed, as llama.cpp's
    stop: StrictStr | Annotated[list[StrictStr], Field(max_length=16)] | None = None
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    n: Literal[1] = 1
    ignore_eos: bool = False  # llama-server's and vLLM's: generate max_tokens whatever the model says
    id_slot: Annotated[int, Field(ge=0, lt=2**31)] | None = None  # llama-server's: start from the slot's restored cache
    stream: bool = False
    stream_options: StreamOptions | None = None

    def sampling(self) -> SamplingParams:
        def pick(value, default):
            return default if value is None else value

        return SamplingParams(
            temperature=pick(self.temperature, _DEFAULTS.temperature), top_k=pick(self.top_k, _DEFAULTS.top_k),
            top_p=pick(self.top_p, _DEFAULTS.top_p), min_p=pick(self.min_p, _DEFAULTS.min_p),
            repeat_penalty=pick(self.repeat_penalty, pick(self.repetition_penalty, _DEFAULTS.repeat_penalty)),
            seed=self.seed, presence_penalty=pick(self.presence_penalty, 0.0),
            frequency_penalty=pick(self.frequency_penalty, 0.0))

    def stops(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class SlotRequest(_Strict):
    """POST /slots/{id}?action=save|restore: a file name under --slot-save-path, never a path."""
    filename: StrictStr = Field(min_length=1, max_length=255)
    overwrite: bool = False  # a save replaces an existing file only when asked

    @field_validator("filename")
    @classmethod
    def _plain_name(cls, name: str) -> str:
        if any(c in name for c in "/\\") or name.startswith(".") or not name.isprintable():
            raise ValueError("must be a plain file name: no path separators, control characters or leading dot")
        try:
            name.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError("must be valid Unicode (a lone surrogate is not)") from None
        return name


class CompletionRequest(_Sampling):
    prompt: StrictStr | Annotated[list[StrictInt], Field(min_length=1)] | Annotated[list[StrictStr], Field(min_length=1, max_length=1)]
    logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    echo: Literal[False] = False

    def max_new_tokens(self) -> int:
        return 16 if self.max_tokens is None else self.max_tokens  # OpenAI's default for completions


class TextPart(_Strict):
    type: Literal["text"]
    text: StrictStr


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant"]
    content: StrictStr | list[TextPart]
    name: StrictStr | None = None

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class ChatRequest(_Sampling):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None

    @model_validator(mode="after")
    def _top_logprobs_need_logprobs(self):
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs requires logprobs to be true")
        return self

    def max_new_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def chat_messages(self) -> list[dict[str, str]]:
        # "developer" is OpenAI's newer name for the system role
        return [{"role": "system" if m.role == "developer" else m.role, "content": m.text()} for m in self.messages]


# -- responses -------------------------------------------------------------------------------
def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def usage_json(u: Usage) -> dict:
    out = {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
           "total_tokens": u.prompt_tokens + u.completion_tokens}
    if u.cached_tokens is not None:
        out["prompt_tokens_details"] = {"cached_tokens": u.cached_tokens}
    return out


class Envelope:
    """The fields every response and chunk of one request shares."""

    def __init__(self, kind: Literal["text_completion", "chat.completion"], model: str):
        self.kind, self.model = kind, model
        self.id = new_id("cmpl" if kind == "text_completion" else "chatcmpl")
        self.created = int(time.time())

    def wrap(self, choices: list[dict], usage: Usage | None = None, chunk: bool = False) -> dict:
        obj = self.kind + (".chunk" if chunk and self.kind == "chat.completion" else "")
        out = {"id": self.id, "object": obj, "created": self.created, "model": self.model, "choices": choices}
        if usage is not None:
            out["usage"] = usage_json(usage)
        return out


def chat_logprobs(items: list[TokenLogprob], token_text) -> dict:
    def entry(tok: int, lp: float) -> dict:
        raw = token_text(tok)
        return {"token": raw.decode("utf-8", errors="replace"), "logprob": lp, "bytes": list(raw)}

    return {"content": [entry(i.token, i.logprob) | {"top_logprobs": [entry(t, lp) for t, lp in i.top]}
                        for i in items]}


def completion_logprobs(items: list[TokenLogprob], token_text, offset: int) -> dict:
    tokens = [token_text(i.token).decode("utf-8", errors="replace") for i in items]
    offsets = []
    for t in tokens:
        offsets.append(offset)
        offset += len(t)
    return {"tokens": tokens, "token_logprobs": [i.logprob for i in items],
            "top_logprobs": [{token_text(t).decode("utf-8", errors="replace"): lp for t, lp in i.top} for i in items],
            "text_offset": offsets}


Prompt = Union[str, list[int]]
