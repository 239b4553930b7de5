"""OpenAI's request and response shapes for /v1/completions and /v1/chat/completions.

Requests are checked by pydantic in strict mode, so a field of the wrong type is an error that
names it rather than something coerced. Unknown fields are ignored, as vLLM and llama-server
do. Sampling fields OpenAI lacks are accepted under llama.cpp's and vLLM's names (top_k, min_p,
repeat_penalty or repetition_penalty). A field left out takes llama-server's default.

Structured output: OpenAI's `response_format` (json_object, json_schema) and `logit_bias` on both
routes, llama-server's `grammar` (GBNF) and `json_schema`, SGLang's `regex`, and on chat OpenAI's `tools`,
`tool_choice` and `parallel_tool_calls`, with `role: "tool"` messages and assistants' `tool_calls`.
"""
from __future__ import annotations

import json
import time
import uuid
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, field_validator, model_validator

from ..runtime.constraints import Constraint, ConstraintError
from ..runtime.sampling import SamplingParams
from .reasoning import ReasoningFields
from .tools import call_constraint
from .types import TokenLogprob, Usage

_DEFAULTS = SamplingParams()


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class StreamOptions(_Strict):
    include_usage: bool = False


class FieldError(ValueError):
    """A request that pydantic's shapes let through but that is wrong all the same: a 400 naming `field`."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


MAX_TOOLS = 128
FUNCTION_NAME = r"^[a-zA-Z0-9_-]{1,64}$"  # OpenAI's rule for a function's name


class JsonSchemaFormat(_Strict):
    name: Annotated[StrictStr, Field(min_length=1, max_length=64)] = "response"
    description: StrictStr | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None  # kiln holds the output to the schema either way


class ResponseFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")  # llama-server's: json_object with a schema

    def constraint(self) -> Constraint | None:
        if self.type == "text":
            return None
        if self.type == "json_object":
            return Constraint.json_schema(self.schema_, "response_format.schema") if self.schema_ is not None \
                else Constraint.json_object("response_format")
        if self.json_schema is None:
            raise FieldError("response_format.json_schema", "response_format.json_schema: required when type is "
                                                             "'json_schema'")
        return Constraint.json_schema(self.json_schema.schema_ if self.json_schema.schema_ is not None else {},
                                      "response_format.json_schema.schema")


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
    speculative: bool = True  # kiln's: false opts out of the server's speculative decoding (kiln serve --spec)
    response_format: ResponseFormat | None = None
    grammar: StrictStr | None = None  # llama-server's: a GBNF grammar
    json_schema: dict[str, Any] | None = None  # llama-server's
    regex: StrictStr | None = None  # SGLang's (vLLM's guided_regex)
    logit_bias: Annotated[dict[str, float], Field(max_length=1024)] | None = None

    def constraint(self) -> Constraint | None:
        """The output's constraint: at most one of response_format (not text), grammar, json_schema
        and regex. FieldError naming the field for a bad one."""
        given = [f for f, v in (("response_format", self.response_format and self.response_format.type != "text"),
                                ("grammar", self.grammar is not None), ("json_schema", self.json_schema is not None),
                                ("regex", self.regex is not None)) if v]
        if len(given) > 1:
            raise FieldError(given[1], f"{given[1]}: give only one of response_format, grammar, json_schema and regex")
        try:
            if self.grammar is not None:
                return Constraint("grammar", self.grammar, "grammar")
            if self.regex is not None:
                return Constraint("regex", self.regex, "regex")
            if self.json_schema is not None:
                return Constraint.json_schema(self.json_schema, "json_schema")
            return self.response_format.constraint() if self.response_format else None
        except ConstraintError as e:
            raise FieldError(given[0], str(e)) from None

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


class FunctionCall(_Strict):
    name: StrictStr
    arguments: StrictStr  # JSON text, as OpenAI sends it


class ToolCall(_Strict):
    id: StrictStr
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: StrictStr | list[TextPart] | None = None
    name: StrictStr | None = None
    tool_calls: Annotated[list[ToolCall], Field(max_length=MAX_TOOLS)] | None = None  # an assistant's
    tool_call_id: StrictStr | None = None  # a tool's: the call it answers

    @model_validator(mode="after")
    def _content_or_calls(self):
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ValueError("content is required (only an assistant message with tool_calls may leave it out)")
        if self.tool_calls and self.role != "assistant":
            raise ValueError("tool_calls belong to an assistant message")
        return self

    def text(self) -> str:
        if self.content is None:
            return ""
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class FunctionDef(_Strict):
    name: Annotated[StrictStr, Field(pattern=FUNCTION_NAME)]
    description: StrictStr | None = None
    parameters: dict[str, Any] | None = None  # its arguments' JSON schema
    strict: bool | None = None  # kiln holds a call's arguments to the schema either way


class Tool(_Strict):
    type: Literal["function"]
    function: FunctionDef


class FunctionName(_Strict):
    name: StrictStr


class NamedToolChoice(_Strict):
    type: Literal["function"]
    function: FunctionName


class ChatRequest(_Sampling, ReasoningFields):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    tools: Annotated[list[Tool], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    # llama-server's default: one call, then the answer ends (OpenAI's is true: a small model given
    # the choice writes call after call until max_tokens)
    parallel_tool_calls: bool = False

    @model_validator(mode="after")
    def _top_logprobs_need_logprobs(self):
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs requires logprobs to be true")
        return self

    def max_new_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def chat_messages(self) -> list[dict]:
        """The messages as a chat template takes them ("developer" is OpenAI's newer name for the
        system role; a call's arguments as an object, as transformers passes them)."""
        out = []
        for m in self.messages:
            d = {"role": "system" if m.role == "developer" else m.role, "content": m.text()}
            if m.tool_calls:
                d["tool_calls"] = [{"id": c.id, "type": "function",
                                    "function": {"name": c.function.name, "arguments": _object(c.function.arguments)}}
                                   for c in m.tool_calls]
            if m.tool_call_id is not None:
                d["tool_call_id"] = m.tool_call_id
            if m.name is not None:
                d["name"] = m.name
            out.append(d)
        return out

    def tool_list(self) -> list[dict] | None:
        """The tools the prompt shows (none with tool_choice "none")."""
        if not self.tools or self.tool_choice == "none":
            return None
        return [t.model_dump(exclude_none=True) for t in self.tools]

    def tools_constraint(self, xml: bool = False) -> Constraint | None:
        """What tool_choice asks of the output: calls only ("required", or a named function), a call
        held to its grammar once it begins ("auto", the default with tools), or nothing; `xml`: in
        Qwen3.5's format (tools.Calls). FieldError
        for a tool_choice naming no tool, or tools beside another constraint."""
        if not self.tools or self.tool_choice == "none":
            if isinstance(self.tool_choice, NamedToolChoice) or self.tool_choice == "required":
                raise FieldError("tool_choice", f"tool_choice: {self.tool_choice!r} needs tools, and none were given")
            return None
        if self.constraint() is not None:
            raise FieldError("tools", "tools: a request with tools cannot also constrain its output (response_format, "
                                      "grammar, json_schema)")
        functions = [t.function.model_dump(exclude_none=True) for t in self.tools]
        if isinstance(self.tool_choice, NamedToolChoice):
            wanted = self.tool_choice.function.name
            functions = [f for f in functions if f["name"] == wanted]
            if not functions:
                names = ", ".join(t.function.name for t in self.tools)
                raise FieldError("tool_choice", f"tool_choice: no tool is named {wanted!r} (the tools: {names})")
        forced = self.tool_choice not in (None, "auto")
        try:
            return call_constraint(functions, forced, self.parallel_tool_calls, xml=xml)
        except ConstraintError as e:
            raise FieldError("tools", str(e)) from None


def _object(arguments: str):
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments


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
