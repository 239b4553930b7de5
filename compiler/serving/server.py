"""`kiln serve`'s HTTP face: OpenAI's completions and chat completions, the model list, health
and Prometheus metrics, on FastAPI. The handlers never block the event loop: tokenizing and
template rendering run in the thread pool, generation on the engine thread, whose events come
back through an asyncio queue. Every bad request gets an OpenAI-style error body and a 4xx.
"""
from __future__ import annotations

import asyncio
import json
import secrets
import time
from pathlib import Path
from typing import AsyncIterator

from fastapi import FastAPI, Request as HttpRequest
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..core.version import __version__
from ..text.chat import render_chat
from ..core.errors import KilnError
from ..runtime.kv_file import KVFileError
from .engine import Engine
from .types import Event, QueueFull, Request
from .protocol import ChatRequest, CompletionRequest, Envelope, SlotRequest, chat_logprobs, completion_logprobs

MAX_BODY_BYTES = 4 << 20


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error", headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind
        self.headers = headers

    def response(self) -> JSONResponse:
        body = {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}
        return JSONResponse(body, status_code=self.status, headers=self.headers)


async def _read_json(request: HttpRequest, limit: int) -> object:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ApiError(413, f"the request body is {int(declared):,} bytes; the limit is {limit:,}")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise ApiError(413, f"the request body is over the limit of {limit:,} bytes")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ApiError(400, f"the request body is not valid UTF-8 (byte {e.start})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ApiError(400, f"the request body is not valid JSON: {e}") from None


def _validated(cls, obj):
    """The request as cls; a 400 naming the field otherwise (every alternative of a union field)."""
    try:
        return cls.model_validate(obj)
    except ValidationError as e:
        def field(loc) -> str:  # without the tags pydantic adds for a union's members ('str', 'list[int]')
            return ".".join(str(p) for p in loc if isinstance(p, int) or p.isidentifier() and p not in _TYPE_TAGS)

        errors = e.errors()
        where = field(errors[0]["loc"])
        msgs = list(dict.fromkeys(err["msg"] for err in errors if field(err["loc"]) == where))
        text = "; or ".join(msgs)
        raise ApiError(400, f"{where}: {text}" if where else text, param=where or None) from None


_TYPE_TAGS = {"str", "int", "float", "bool", "list", "dict"}


class _Events:
    """The engine's events for one request, handed to the event loop."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue[Event] = asyncio.Queue()

    def __call__(self, event: Event) -> None:  # on the engine thread
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, event)
        except RuntimeError:  # the loop has closed: the server is going down
            pass


def create_app(engine: Engine, model_name: str, api_key: str | None = None,
               max_body_bytes: int = MAX_BODY_BYTES, slot_save_path: Path | None = None) -> FastAPI:
    app = FastAPI(title="kiln", version=__version__, openapi_url=None, docs_url=None, redoc_url=None)
    model = engine.model

    @app.exception_handler(ApiError)
    async def _api_error(request, exc: ApiError):
        return exc.response()

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request, exc: StarletteHTTPException):
        return ApiError(exc.status_code, str(exc.detail), kind="not_found_error" if exc.status_code == 404
                        else "invalid_request_error").response()

    def authorize(request: HttpRequest) -> None:
        if api_key is None:
            return
        given = request.headers.get("authorization", "")
        if not (given.startswith("Bearer ") and secrets.compare_digest(given[7:].encode(), api_key.encode())):
            raise ApiError(401, "invalid or missing API key: send the header 'Authorization: Bearer <key>'",
                           kind="authentication_error", code="invalid_api_key")

    def check_model(name: str) -> None:
        if name != model_name:
            raise ApiError(404, f"model '{name}' does not exist; this server serves '{model_name}'", param="model",
                           code="model_not_found", kind="not_found_error")

    def prompt_ids(prompt) -> list[int]:
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
            bad = [t for t in prompt if not 0 <= t < model.n_vocab]
            if bad:
                raise ApiError(400, f"prompt: token id {bad[0]} is out of range [0, {model.n_vocab})", param="prompt")
            return list(prompt)
        text = prompt[0] if isinstance(prompt, list) else prompt
        ids = model.tokenize(text)
        if not ids:
            raise ApiError(400, "prompt: the prompt is empty", param="prompt")
        return ids

    def submit(ids: list[int], req, max_tokens: int | None, logprobs: int | None) -> tuple[Request, _Events]:
        room = model.n_ctx - len(ids)
        if room < 1:
            raise ApiError(400, f"the prompt has {len(ids)} tokens; this server's context holds {model.n_ctx} "
                                "(--ctx), and at least one must be left to generate",
                           param="messages" if isinstance(req, ChatRequest) else "prompt",
                           code="context_length_exceeded")
        try:
            params = req.sampling()
        except KilnError as e:
            raise ApiError(400, str(e)) from None
        events = _Events()
        r = Request(ids, params, min(max_tokens or room, room), req.stops(), events, logprobs, req.ignore_eos)
        try:
            engine.submit(r)
        except QueueFull as e:
            raise ApiError(503, f"the server is busy: {e}; retry shortly", kind="server_error",
                           headers={"Retry-After": "1"}) from None
        except KilnError as e:
            raise ApiError(400, str(e)) from None
        return r, events

    async def run(request: HttpRequest, r: Request, events: _Events) -> list[Event]:
        """Wait for every event of a non-streamed request; cancel it if the client goes away."""
        got: list[Event] = []
        try:
            while True:
                try:
                    event = await asyncio.wait_for(events.queue.get(), timeout=0.5)
                except asyncio.TimeoutError:
                    if await request.is_disconnected():
                        engine.cancel(r)
                        return got
                    continue
                got.append(event)
                if event.finish_reason or event.error:
                    return got
        except asyncio.CancelledError:
            engine.cancel(r)
            raise

    def failed(events: list[Event]) -> None:
        if events and events[-1].error:
            raise ApiError(500, events[-1].error, kind="server_error")

    def sse(obj) -> str:
        return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"

    def stream(r: Request, events: _Events, first: list[dict], chunk) -> StreamingResponse:
        """SSE: `first` chunks, one per token event (chunk(event)), the finishing chunk, then [DONE]."""
        async def body() -> AsyncIterator[str]:
            finished = False
            try:
                for obj in first:
                    yield sse(obj)
                while True:
                    event = await events.queue.get()
                    if event.error:
                        yield sse({"error": {"message": event.error, "type": "server_error", "param": None,
                                             "code": None}})
                        finished = True
                        break
                    if event.text or event.logprob or event.finish_reason:
                        yield from_chunks(chunk(event))
                    if event.finish_reason:
                        finished = True
                        break
                yield "data: [DONE]\n\n"
            finally:
                if not finished:  # the client went away: free its sequence and pages
                    engine.cancel(r)

        def from_chunks(objs: list[dict]) -> str:
            return "".join(sse(o) for o in objs)

        return StreamingResponse(body(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    # -- routes -------------------------------------------------------------------------------
    @app.post("/v1/completions")
    async def completions(request: HttpRequest):
        authorize(request)
        req = _validated(CompletionRequest, await _read_json(request, max_body_bytes))
        check_model(req.model)
        ids = await run_in_threadpool(prompt_ids, req.prompt)
        r, events = submit(ids, req, req.max_new_tokens(), req.logprobs)
        env = Envelope("text_completion", model_name)
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
                    out.append(env.wrap([], usage=e.usage))
                return out
            return stream(r, events, [], chunk)
        got = await run(request, r, events)
        failed(got)
        if not got:
            return Response(status_code=499)
        lps = [e.logprob for e in got if e.logprob]
        return env.wrap([choice("".join(e.text for e in got), lps, got[-1].finish_reason, 0)], usage=got[-1].usage)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: HttpRequest):
        authorize(request)
        req = _validated(ChatRequest, await _read_json(request, max_body_bytes))
        check_model(req.model)

        def render() -> list[int]:
            try:
                text = render_chat(model.spec, req.chat_messages())
            except KilnError as e:
                raise ApiError(400, str(e), param="messages") from None
            return model.tokenize(text)

        ids = await run_in_threadpool(render)
        logprobs = (req.top_logprobs or 0) if req.logprobs else None
        r, events = submit(ids, req, req.max_new_tokens(), logprobs)
        env = Envelope("chat.completion", model_name)
        token_text = model.tokenizer.token_bytes

        def lp_json(lps: list) -> dict | None:
            return chat_logprobs(lps, token_text) if req.logprobs else None

        if req.stream:
            def chunk(e: Event) -> list[dict]:
                delta = {"content": e.text} if e.text or e.logprob else {}
                out = [env.wrap([{"index": 0, "delta": delta, "logprobs": lp_json([e.logprob] if e.logprob else []),
                                  "finish_reason": e.finish_reason}], chunk=True)]
                if e.finish_reason and req.include_usage:
                    out.append(env.wrap([], usage=e.usage, chunk=True))
                return out
            first = [env.wrap([{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                "finish_reason": None}], chunk=True)]
            return stream(r, events, first, chunk)
        got = await run(request, r, events)
        failed(got)
        if not got:
            return Response(status_code=499)
        message = {"role": "assistant", "content": "".join(e.text for e in got)}
        return env.wrap([{"index": 0, "message": message, "logprobs": lp_json([e.logprob for e in got if e.logprob]),
                          "finish_reason": got[-1].finish_reason}], usage=got[-1].usage)

    @app.post("/slots/{slot_id}")
    async def slots(request: HttpRequest, slot_id: str, action: str = ""):
        """llama-server's slot save and restore: a slot's KV cache to a file under --slot-save-path,
        or a file into the prefix cache, where requests that start with its tokens find it."""
        authorize(request)
        if slot_save_path is None:
            raise ApiError(501, "slot save/restore is off: start the server with --slot-save-path DIR",
                           kind="not_supported_error")
        if action not in ("save", "restore"):
            raise ApiError(400, f"action: must be 'save' or 'restore', got {action!r}", param="action")
        if not (slot_id.isdigit() and int(slot_id) < engine.n_slots):
            raise ApiError(400, f"id_slot: must be between 0 and {engine.n_slots - 1}, got {slot_id!r}",
                           param="id_slot")
        body = _validated(SlotRequest, await _read_json(request, max_body_bytes))
        path, slot, t0 = slot_save_path / body.filename, int(slot_id), time.perf_counter()
        work = engine.save_slot if action == "save" else engine.restore_slot
        try:
            n_tokens, n_bytes = await asyncio.wrap_future(engine.call(lambda: work(slot, path)))
        except QueueFull as e:
            raise ApiError(503, f"the server is busy: {e}; retry shortly", kind="server_error",
                           headers={"Retry-After": "1"}) from None
        except KilnError as e:
            raise ApiError(404 if isinstance(e, KVFileError) and not path.exists() else 400,
                           str(e).replace(str(slot_save_path) + "/", ""), param="filename") from None
        ms = (time.perf_counter() - t0) * 1e3
        if action == "save":
            return {"id_slot": slot, "filename": body.filename, "n_saved": n_tokens, "n_written": n_bytes,
                    "timings": {"save_ms": ms}}
        return {"id_slot": slot, "filename": body.filename, "n_restored": n_tokens, "n_read": n_bytes,
                "timings": {"restore_ms": ms}}

    @app.get("/v1/models")
    async def models(request: HttpRequest):
        authorize(request)
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": 0, "owned_by": "kiln",
                                            "meta": {"n_ctx": model.n_ctx, "n_vocab": model.n_vocab,
                                                     "n_seq": model.options.n_seq, "path": str(model.path)}}]}

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/metrics")
    def metrics():  # sync: FastAPI runs it in the thread pool, since reading the pool takes the model's lock
        from prometheus_client import CONTENT_TYPE_LATEST
        return Response(engine.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    return app
