"""`kiln serve`'s HTTP face: OpenAI's completions and chat completions, the model list, health
and Prometheus metrics, on FastAPI (the slot routes are in slots.py).

A request is held to its bounds before work is done for it: Host, API key, room in the queue,
Content-Type, body size and shape, the prompt's size against the context, then tokenizing (in
the thread pool), then the engine. Generation runs on the engine thread, whose events come back
through an asyncio queue; a watcher cancels the request on the engine the moment its client goes
away, streamed or not, and a deadline bounds it. Every bad request gets an OpenAI-style error
body and a 4xx that names the field.

A constrained request (response_format, grammar, json_schema, tools) has its schema or grammar
compiled in the thread pool too, so that a large one never holds up the engine thread; one that
llguidance rejects is a 400 naming the field (and the schema path).
"""
from __future__ import annotations

import asyncio
import contextlib
import json
from typing import AsyncIterator

from fastapi import FastAPI, Request as HttpRequest
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..core.errors import KilnError
from ..core.version import __version__
from ..runtime.constraints import Constraint, ConstraintError, Guide
from ..runtime.sampling import LogitBias
from ..text.chat import chat_template, render_chat_spans
from .engine import Engine
from .http import (ApiError, Events, HeaderLimits, ServerConfig, admitted_body, busy, check_host, check_key,
                   model_not_found)
from .protocol import ChatRequest, CompletionRequest, Envelope, FieldError, chat_logprobs, completion_logprobs
from .reasoning import ChatStream, Reasoning
from .tools import Calls
from .retrieval import add_retrieval_routes
from .slots import add_slot_routes
from .types import Event, QueueFull, Request

HEALTHY_HEARTBEAT = 60.0  # seconds: an engine that has not gone round its loop for longer is stuck


def create_app(engine: Engine, config: ServerConfig) -> FastAPI:
    app = FastAPI(title="kiln", version=__version__, openapi_url=None, docs_url=None, redoc_url=None)
    model, name = engine.model, config.model_name
    longest_token = max(len(model.tokenizer.token_bytes(t, special=True)) for t in range(model.n_vocab))

    @app.exception_handler(ApiError)
    async def _api_error(request, exc: ApiError):
        return exc.response()

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request, exc: StarletteHTTPException):
        return ApiError(exc.status_code, str(exc.detail), kind="not_found_error" if exc.status_code == 404
                        else "invalid_request_error").response()

    async def admitted(request: HttpRequest, cls):
        """The checks every generation request passes, cheapest first; the validated request."""
        req = await admitted_body(request, config, engine.has_room, cls)
        if req.model != name:
            raise model_not_found(req.model, name)
        if model.embedding:
            raise ApiError(400, f"model '{name}' returns embeddings, not text: use /v1/embeddings or /v1/rerank",
                           param="model")
        return req

    def fits(text: str, field: str) -> None:
        """Refuse, before tokenizing it, text that no tokenization could fit in the context."""
        size = len(text.encode("utf-8", errors="replace"))
        if size > model.n_ctx * longest_token:
            raise ApiError(400, f"{field}: {size:,} bytes of text cannot fit in a context of {model.n_ctx} tokens "
                                f"(the longest token is {longest_token} bytes)", param=field,
                           code="context_length_exceeded")

    def prompt_ids(prompt) -> list[int]:
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
            bad = [t for t in prompt if not 0 <= t < model.n_vocab]
            if bad:
                raise ApiError(400, f"prompt: token id {bad[0]} is out of range [0, {model.n_vocab})", param="prompt")
            return list(prompt)
        text = prompt[0] if isinstance(prompt, list) else prompt
        fits(text, "prompt")
        ids = model.tokenize(text)
        if not ids:
            raise ApiError(400, "prompt: the prompt is empty", param="prompt")
        return ids

    def guided(constraint) -> Guide | None:
        """The request's constraint (a callable that builds it), compiled and its first mask computed:
        in the thread pool, as compiling a large grammar takes a while. A 400 naming the field for a
        bad one, or one that allows no first token."""
        c: Constraint | None = None
        try:
            c = constraint()
            if c is None:
                return None
            guide = model.guidance.guide(c)
            guide.mask()
            return guide
        except FieldError as e:
            raise ApiError(400, str(e), param=e.field) from None
        except ConstraintError as e:
            raise ApiError(400, str(e), param=c.field if c is not None else None) from None

    def submit(ids: list[int], req, max_tokens: int | None, logprobs: int | None,
               guide: Guide | None = None, reasoning: Reasoning | None = None) -> tuple[Request, Events]:
        field = "messages" if isinstance(req, ChatRequest) else "prompt"
        room = model.n_ctx - len(ids)
        if room < 1 and engine.sinks is None:
            raise ApiError(400, f"{field}: the prompt has {len(ids)} tokens; this server's context holds "
                                f"{model.n_ctx} (--ctx), and at least one must be left to generate",
                           param=field, code="context_length_exceeded")
        if max_tokens is not None and max_tokens > config.max_tokens:
            raise ApiError(400, f"max_tokens: at most {config.max_tokens} on this server (--max-tokens), "
                                f"got {max_tokens}", param="max_tokens")
        # a full context ends a request, unless the server shifts it (--context-shift)
        limit = config.max_tokens if engine.sinks is not None else min(room, config.max_tokens)
        if req.id_slot is not None and req.id_slot >= engine.n_slots:
            raise ApiError(400, f"id_slot: must be between 0 and {engine.n_slots - 1}, got {req.id_slot}",
                           param="id_slot")
        try:
            params = req.sampling()
        except KilnError as e:
            raise ApiError(400, str(e)) from None
        try:
            bias = LogitBias.of(req.logit_bias, model.n_vocab)
        except KilnError as e:
            raise ApiError(400, str(e), param="logit_bias") from None
        r = Request(ids, params, min(max_tokens or limit, limit), req.stops(), None, logprobs, req.ignore_eos,
                    req.id_slot, guide, bias)
        r.emit = events = Events(lambda: engine.cancel(r))
        r.speculative = req.speculative
        if reasoning is not None:
            budget = req.reasoning_budget if req.reasoning_budget is not None else config.reasoning_budget
            r.thinking = reasoning.budget(budget, lambda text: model.tokenize(text, add_special=False))
            r.special = reasoning.special
            r.speculative = r.speculative and r.thinking is None  # a draft would skip the forced close
        try:
            engine.submit(r)
        except QueueFull as e:
            raise busy(str(e)) from None
        except KilnError as e:
            raise ApiError(400, str(e)) from None
        return r, events

    @contextlib.asynccontextmanager
    async def watched(request: HttpRequest, r: Request):
        """Cancel r on the engine when its client disconnects (however far the response got) or
        its deadline passes; the watcher ends with the block."""
        async def watch():
            while True:
                message = await request.receive()
                if message["type"] == "http.disconnect":
                    engine.cancel(r)
                    return

        async def deadline():
            await asyncio.sleep(config.request_timeout)
            engine.cancel(r)
            r.emit(Event(error=f"the request took longer than {config.request_timeout:g} s (--request-timeout)"))

        tasks = [asyncio.create_task(watch()), asyncio.create_task(deadline())]
        try:
            yield
        finally:
            for t in tasks:
                t.cancel()

    async def collect(request: HttpRequest, r: Request, events: Events) -> list[Event]:
        """Every event of a non-streamed request; a 4xx/5xx for a request that failed."""
        got: list[Event] = []
        async with watched(request, r):
            while not got or not (got[-1].finish_reason or got[-1].error):
                got.append(await events.queue.get())
        if got[-1].error:
            if got[-1].invalid:
                raise ApiError(400, got[-1].error)
            raise ApiError(500, got[-1].error, kind="server_error")
        return got

    def sse(obj) -> str:
        return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"

    def stream(request: HttpRequest, r: Request, events: Events, first: list[dict], chunk) -> StreamingResponse:
        """SSE: `first` chunks, one per token event (chunk(event)), the finishing chunk, then [DONE]."""
        async def body() -> AsyncIterator[str]:
            async with watched(request, r):
                try:
                    for obj in first:
                        yield sse(obj)
                    while True:
                        event = await events.queue.get()
                        if event.error:
                            kind = "invalid_request_error" if event.invalid else "server_error"
                            yield sse({"error": {"message": event.error, "type": kind, "param": None,
                                                 "code": None}})
                            break
                        if event.text or event.logprob or event.finish_reason:
                            yield "".join(sse(o) for o in chunk(event))
                        if event.finish_reason:
                            break
                    yield "data: [DONE]\n\n"
                finally:
                    engine.cancel(r)  # a no-op for a finished request; frees a stopped client's pages

        return StreamingResponse(body(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    def usage_of(e: Event):
        return e.usage.hidden_cache() if e.usage and config.hide_cached_tokens else e.usage

    # -- routes -------------------------------------------------------------------------------
    @app.post("/v1/completions")
    async def completions(request: HttpRequest):
        req = await admitted(request, CompletionRequest)
        ids = await run_in_threadpool(prompt_ids, req.prompt)
        guide = await run_in_threadpool(guided, req.constraint)
        r, events = submit(ids, req, req.max_new_tokens(), req.logprobs, guide)
        env = Envelope("text_completion", name)
        token_text = model.tokenizer.token_bytes

        def choice(text: str, lps: list, finish: str | None, offset: int) -> dict:
            return {"index": 0, "text": text, "finish_reason": finish,
                    "logprobs": completion_logprobs(lps, token_text, offset) if req.logprobs is not None else None}

        if req.stream:
            sent = [0]

            def chunk(e: Event) -> list[dict]:
                out = [env.wrap([choice(e.text, [e.logprob] if e.logprob else [], e.finish_reason, sent[0])])]
                sent[0] += len(e.text)
                if e.finish_reason and req.include_usage:
                    out.append(env.wrap([], usage=usage_of(e)))
                return out
            return stream(request, r, events, [], chunk)
        got = await collect(request, r, events)
        lps = [e.logprob for e in got if e.logprob]
        return env.wrap([choice("".join(e.text for e in got), lps, got[-1].finish_reason, 0)], usage=usage_of(got[-1]))

    @app.post("/v1/chat/completions")
    async def chat_completions(request: HttpRequest):
        req = await admitted(request, ChatRequest)

        try:
            variables = req.template_kwargs()
        except ValueError as e:
            raise ApiError(400, str(e), param="chat_template_kwargs") from None

        def render() -> tuple[list[int], Reasoning, Calls | None]:
            for i, m in enumerate(req.messages):
                fits(m.text(), f"messages.{i}.content")
            tools = req.tool_list()
            try:
                text, plain = render_chat_spans(model.spec, req.chat_messages(), tools=tools, variables=variables)
                source = chat_template(model.spec).source  # its thinking's format and its calls' syntax
                reasoning = Reasoning.of(source, text, config.reasoning_format)
                calls = Calls.of(source, [t["function"] for t in tools]) if tools is not None else None
            except KilnError as e:
                raise ApiError(400, str(e), param="messages") from None
            fits(text, "messages")
            # the messages' special-token look-alikes stay text
            return model.tokenizer.tokenize(text, plain=plain), reasoning, calls

        ids, reasoning, calls = await run_in_threadpool(render)  # calls: the answer's become tool_calls
        guide = await run_in_threadpool(guided, lambda: reasoning.answer_only(
            req.tools_constraint(calls is not None and calls.xml) or req.constraint()))
        logprobs = (req.top_logprobs or 0) if req.logprobs else None
        r, events = submit(ids, req, req.max_new_tokens(), logprobs, guide, reasoning)
        env = Envelope("chat.completion", name)
        token_text = model.tokenizer.token_bytes

        def lp_json(lps: list) -> dict | None:
            return chat_logprobs(lps, token_text) if req.logprobs else None

        if req.stream:
            parts = ChatStream(reasoning, calls) if calls or reasoning.apart else None

            def chunk(e: Event) -> list[dict]:
                if parts is None:
                    deltas = [{"content": e.text}] if e.text or e.logprob else []
                else:
                    deltas = parts.push(e.text, final=bool(e.finish_reason))
                if not deltas and (e.logprob or e.finish_reason):
                    deltas = [{}]
                finish = "tool_calls" if parts is not None and parts.called and e.finish_reason == "stop" \
                    else e.finish_reason
                lps = lp_json([e.logprob] if e.logprob else [])
                out = [env.wrap([{"index": 0, "delta": d, "logprobs": lps if i == 0 else None,
                                  "finish_reason": finish if i == len(deltas) - 1 else None}], chunk=True)
                       for i, d in enumerate(deltas)]
                if e.finish_reason and req.include_usage:
                    out.append(env.wrap([], usage=usage_of(e), chunk=True))
                return out
            first = [env.wrap([{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                "finish_reason": None}], chunk=True)]
            return stream(request, r, events, first, chunk)
        got = await collect(request, r, events)
        message, finish = reasoning.message("".join(e.text for e in got), got[-1].finish_reason, calls)
        return env.wrap([{"index": 0, "message": message, "logprobs": lp_json([e.logprob for e in got if e.logprob]),
                          "finish_reason": finish}], usage=usage_of(got[-1]))

    @app.get("/v1/models")
    async def models(request: HttpRequest):
        check_host(request, config.allowed_hosts)
        check_key(request, config.api_keys)
        return {"object": "list", "data": [{"id": name, "object": "model", "created": 0, "owned_by": "kiln",
                                            "meta": {"n_ctx": model.n_ctx, "n_vocab": model.n_vocab,
                                                     "n_seq": model.options.n_seq}}]}

    @app.get("/health")
    async def health(request: HttpRequest):
        """llama-server's: 200 while the engine goes round its loop; 503 once it has died or stuck."""
        check_host(request, config.allowed_hosts)
        age = engine.heartbeat_age()
        if not engine.alive or age > HEALTHY_HEARTBEAT:
            why = "the engine has stopped" if not engine.alive else f"the engine has not stepped for {age:.0f} s"
            raise ApiError(503, why, kind="server_error")
        return {"status": "ok"}

    @app.get("/metrics")
    async def metrics(request: HttpRequest):  # a snapshot: never waits on the engine
        from prometheus_client import CONTENT_TYPE_LATEST

        check_host(request, config.allowed_hosts)
        check_key(request, (config.metrics_key,) if config.metrics_key else ())
        return Response(engine.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    add_slot_routes(app, engine, config)
    add_retrieval_routes(app, engine, config)
    app.add_middleware(HeaderLimits, config=config)
    return app
