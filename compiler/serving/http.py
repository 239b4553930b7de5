"""What every route of `kiln serve` shares at the HTTP level: the error body, the limits a
request is held to before any work is done for it (its Host, its Content-Type, its body's size,
depth and numbers), the API keys, and the pipe that carries the engine's events to the event loop.
"""
from __future__ import annotations

import asyncio
import json
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from fastapi import Request as HttpRequest
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from .types import Event

MAX_BODY_BYTES = 4 << 20
MAX_JSON_DEPTH = 64
MAX_BACKLOG = 1024  # events a client has not taken: past this it is not reading, and its request ends


@dataclass(frozen=True)
class ServerConfig:
    """The server's policy: who may call it, and every bound a request is held to."""
    model_name: str
    api_keys: tuple[str, ...] = ()  # none: open (then Host and Content-Type checks stop browser attacks)
    allowed_hosts: tuple[str, ...] | None = None  # Host header values (without port); None: any
    max_body_bytes: int = MAX_BODY_BYTES
    max_tokens: int = 4096  # the most tokens one request may generate
    request_timeout: float = 600.0  # seconds a request may take, queueing included
    slot_save_path: Path | None = None
    slot_max_bytes: int = 1 << 30
    slot_share: bool = False  # restored caches enter the shared prefix cache
    metrics_key: str | None = None
    max_header_bytes: int = 16 << 10  # a request's header block, names and values together
    max_headers: int = 100
    reasoning_format: str = "auto"  # "none": a reasoning model's thinking stays in the content
    reasoning_budget: int = -1  # thinking tokens a request may take unless it says (-1: no bound)
    hide_cached_tokens: bool = field(init=False)

    def __post_init__(self):
        # with several tenants, cached_tokens would tell one whether another's prompt is cached
        object.__setattr__(self, "hide_cached_tokens", len(self.api_keys) > 1)


def h11_header_bound(max_header_bytes: int) -> int:
    """The bound h11 holds a request's unparsed header block to. h11 past its bound drops the
    connection while the client is still sending, which the client sees as a reset, not an answer;
    4x our own bound lets HeaderLimits answer 431 however the block arrives in pieces, and still
    bounds what one connection can make the server buffer."""
    return 4 * max_header_bytes


class HeaderLimits:
    """ASGI middleware: a request with more than max_headers headers, or more than max_header_bytes
    of them, gets 431 before any route sees it (vLLM's CVE-2025-48956 was the unbounded kind)."""

    def __init__(self, app, config: ServerConfig):
        self.app, self.config = app, config

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            headers = scope.get("headers") or []
            size = sum(len(k) + len(v) for k, v in headers)
            if len(headers) > self.config.max_headers or size > self.config.max_header_bytes:
                error = ApiError(431, f"the request has {len(headers)} headers of {size:,} bytes; the limits are "
                                      f"{self.config.max_headers} and {self.config.max_header_bytes:,} bytes "
                                      "(--max-header-bytes)")
                await error.response()(scope, receive, send)
                return
        await self.app(scope, receive, send)


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error", headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind
        self.headers = headers

    def response(self) -> JSONResponse:
        body = {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}
        return JSONResponse(body, status_code=self.status, headers=self.headers)


def busy(reason: str) -> ApiError:
    return ApiError(503, f"the server is busy: {reason}; retry shortly", kind="server_error",
                    headers={"Retry-After": "1"})


def check_key(request: HttpRequest, keys: tuple[str, ...], header: str = "authorization") -> str | None:
    """The caller's key (None when the server has none); 401 unless it is one of them."""
    if not keys:
        return None
    given = request.headers.get(header, "")
    token = given[7:] if given.startswith("Bearer ") else ""
    found = None
    for key in keys:  # every key is compared, so the time taken does not say which one nearly matched
        if secrets.compare_digest(token.encode(), key.encode()):
            found = key
    if found is None:
        raise ApiError(401, "invalid or missing API key: send the header 'Authorization: Bearer <key>'",
                       kind="authentication_error", code="invalid_api_key")
    return found


def check_host(request: HttpRequest, allowed: tuple[str, ...] | None) -> None:
    """DNS rebinding: a page on evil.example that resolves to 127.0.0.1 still sends its own Host."""
    if allowed is None:
        return
    host = request.headers.get("host", "")
    name = host[1:host.index("]")] if host.startswith("[") and "]" in host else host.rsplit(":", 1)[0]
    if name.lower() not in allowed:
        raise ApiError(400, f"Host: {host!r} is not a name this server answers to (--allowed-hosts)", param="Host")


def check_json_content_type(request: HttpRequest) -> None:
    """A form or text/plain POST is a 'simple' cross-site request a browser sends without asking;
    requiring JSON makes the browser ask first (CORS preflight), which this server never grants."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "application/json":
        raise ApiError(415, f"Content-Type: must be application/json, got {kind or 'none'!r}", param="Content-Type")


async def read_body(request: HttpRequest, limit: int) -> bytes:
    """The body, held to `limit` bytes: a 413 past it, before reading it when it says its size."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ApiError(413, f"the request body is {int(declared):,} bytes; the limit is {limit:,} (--max-body-bytes)")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise ApiError(413, f"the request body is over the limit of {limit:,} bytes (--max-body-bytes)")
    return bytes(body)


async def read_json(request: HttpRequest, limit: int) -> object:
    """The body as JSON, held to `limit` bytes, MAX_JSON_DEPTH levels and Python's bound on an
    integer's digits; a 4xx naming what is wrong otherwise."""
    body = await read_body(request, limit)
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ApiError(400, f"the request body is not valid UTF-8 (byte {e.start})") from None
    if _nesting(text) > MAX_JSON_DEPTH:
        raise ApiError(400, f"the request body nests more than {MAX_JSON_DEPTH} levels deep")
    try:
        return json.loads(text)
    except (json.JSONDecodeError, ValueError, RecursionError) as e:  # ValueError: an integer of too many digits
        raise ApiError(400, f"the request body is not valid JSON: {e}") from None


def _nesting(text: str) -> int:
    """An upper bound on the JSON's depth: brackets outside strings, counted without parsing."""
    depth = deepest = 0
    in_string = escaped = False
    for c in text:
        if in_string:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == '"':
                in_string = False
        elif c == '"':
            in_string = True
        elif c in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif c in "]}":
            depth -= 1
    return deepest


_TYPE_TAGS = {"str", "int", "float", "bool", "list", "dict"}


async def admitted_body(request: HttpRequest, config: ServerConfig, has_room: Callable[[], bool], cls):
    """The checks every request that queues work passes, cheapest first: Host, API key, room in the
    queue, Content-Type, the body's size and shape. The validated request."""
    check_host(request, config.allowed_hosts)
    check_key(request, config.api_keys)
    if not has_room():
        raise busy("the queue is full (--max-queue)")
    check_json_content_type(request)
    return validated(cls, await read_json(request, config.max_body_bytes))


def model_not_found(asked: str | None, served: str) -> ApiError:
    return ApiError(404, f"model '{asked}' does not exist; this server serves '{served}'", param="model",
                    code="model_not_found", kind="not_found_error")


def validated(cls, obj):
    """The request as cls; a 400 naming the field otherwise (every alternative of a union field)."""
    try:
        return cls.model_validate(obj)
    except ValidationError as e:
        def name(loc) -> str:  # without the tags pydantic adds for a union's members ('str', 'list[int]')
            return ".".join(str(p) for p in loc if isinstance(p, int) or p.isidentifier() and p not in _TYPE_TAGS)

        errors = e.errors()
        where = name(errors[0]["loc"])
        text = "; or ".join(dict.fromkeys(err["msg"] for err in errors if name(err["loc"]) == where))
        raise ApiError(400, f"{where}: {text}" if where else text, param=where or None) from None


class Events:
    """The engine's events for one request, handed to the event loop. A client that leaves MAX_BACKLOG
    events untaken is not reading: `stalled` is called (once), and the request is cancelled."""

    def __init__(self, stalled: Callable[[], None]) -> None:
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue[Event] = asyncio.Queue()
        self.stalled = stalled

    def __call__(self, event: Event) -> None:  # on the engine thread
        if self.queue.qsize() > MAX_BACKLOG and self.stalled:  # a length read across threads: near enough
            stalled, self.stalled = self.stalled, None
            stalled()
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, event)
        except RuntimeError:  # the loop has closed: the server is going down
            pass
