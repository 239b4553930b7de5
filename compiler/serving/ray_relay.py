"""An HTTP request carried from kiln's Ray ingress to a replica and its answer carried back, so
that every replica serves `kiln serve`'s own FastAPI app (server.py) and nothing of the API is
written twice.

On the replica, app_messages runs the app on the request, as uvicorn would, and yields what the
app sends (ASGI messages: the status and headers, then the body in pieces; a stream's events as
they come). The ingress takes those messages through a Ray streaming handle and holds them until
one carries output: until then nothing has reached the client, so if the replica dies the request
is sent once more, to another replica. A stream that dies after output reached the client ends
with an OpenAI-shaped error event and [DONE], never a hang; the client's going away reaches the
replica as http.disconnect, which cancels the request on its engine.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import replace
from typing import AsyncIterator

from ray.exceptions import RayActorError, RayError
from starlette.requests import Request as HttpRequest
from starlette.responses import Response

from .http import ApiError
from .ray_router import Routed

DISCONNECT_GRACE = 5.0  # seconds an app has to wind a request up once its client is gone
SCOPE_KEYS = ("type", "http_version", "method", "scheme", "path", "raw_path", "root_path", "query_string", "headers",
              "client", "server")
REPLICA = "kiln.replica"  # the first message of every answer: which replica took the request


def scope_of(request: HttpRequest) -> dict:
    """The request's ASGI scope, less what cannot travel (the app, the router, state). ASGI 2.3:
    a streamed response then listens for http.disconnect (server.py's cancel on disconnect)."""
    return {**{k: request.scope[k] for k in SCOPE_KEYS if k in request.scope},
            "asgi": {"version": "3.0", "spec_version": "2.3"}}


async def app_messages(app, scope: dict, body: bytes) -> AsyncIterator[dict]:
    """On the replica: what `app` sends for this request, message by message. Closing the iterator
    early (the ingress cancelled it: its client left) tells the app its client has disconnected and
    gives it DISCONNECT_GRACE seconds to cancel the request on the engine."""
    sent: asyncio.Queue = asyncio.Queue()
    gone = asyncio.Event()
    body_taken = False

    async def receive() -> dict:
        nonlocal body_taken
        if not body_taken:
            body_taken = True
            return {"type": "http.request", "body": body, "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        await sent.put(message)

    task = asyncio.ensure_future(app(scope, receive, send))
    task.add_done_callback(lambda _: sent.put_nowait(None))
    try:
        while (message := await sent.get()) is not None:
            yield message
        task.result()  # an exception the app did not turn into a response
    finally:
        gone.set()
        if not task.done():
            await asyncio.wait({task}, timeout=DISCONNECT_GRACE)
            task.cancel()


def served_headers(served_by: str | None, routed: Routed) -> list[tuple[bytes, bytes]]:
    """Which replica answered, and which one died under the request first, if it was retried."""
    out = [(b"x-kiln-replica", served_by.encode())] if served_by else []
    return out + ([(b"x-kiln-retried-from", routed.avoid.encode())] if routed.avoid else [])


def failure(e: BaseException) -> str:
    if isinstance(e, RayActorError):
        return f"the replica serving this request died ({e.__class__.__name__})"
    return f"internal error in the replica ({e.__class__.__name__})"


def error_event(message: str) -> bytes:
    """An SSE event of OpenAI's error shape (what server.py sends when a stream fails), then [DONE]."""
    body = {"error": {"message": message, "type": "server_error", "param": None, "code": None}}
    return f"data: {json.dumps(body)}\n\ndata: [DONE]\n\n".encode()


def carries_output(message: dict, streamed: bool) -> bool:
    """Whether sending this message would show the client something of an answer (after which the
    request can no longer be retried). A whole JSON body does; an SSE chunk does unless all its
    events are empty openers (a chat stream's first chunk: the role, no content)."""
    if message["type"] != "http.response.body":
        return False
    if not streamed or not message.get("more_body", False):
        return True
    for line in message.get("body", b"").decode("utf-8", "replace").splitlines():
        if not line.startswith("data: "):
            continue
        try:
            event = json.loads(line[6:])
        except ValueError:
            return True  # [DONE] or anything else: output
        if not isinstance(event, dict) or "error" in event or event.get("usage"):
            return True
        for c in event.get("choices") or ():
            delta = c.get("delta") or {}
            if c.get("text") or c.get("finish_reason") or c.get("logprobs") or delta.get("content") \
                    or delta.get("tool_calls"):
                return True
    return False


class Relayed(Response):
    """The replica's answer, from the messages held back so far, then the rest as they come."""

    def __init__(self, held: list[dict], rest: AsyncIterator[dict] | None, streamed: bool, cancel):
        self.held, self.rest, self.streamed, self.cancel = held, rest, streamed, cancel
        self.background = None

    async def __call__(self, scope, receive, send) -> None:
        ended = False  # the last body message is sent: nothing may follow it
        try:
            for message in self.held:
                await send(message)
                ended = _last(message)
            if self.rest is None or ended:
                return
            try:
                async for message in self.rest:  # to its end, so that the replica's call ends of itself
                    if not ended:
                        await send(message)
                        ended = _last(message)
            except Exception as e:  # noqa: BLE001 - output has been sent: it cannot be taken back and retried
                if not ended:
                    await send({"type": "http.response.body", "more_body": False,
                                "body": error_event(failure(e)) if self.streamed else b""})
        finally:
            self.cancel()  # a no-op for a finished answer; stops the replica's work for a client that left


def _last(message: dict) -> bool:
    return message["type"] == "http.response.body" and not message.get("more_body", False)


async def relay(call, routed: Routed, assign_timeout: float, retried: bool = False) -> Response:
    """Send `routed` through `call` (routed -> a Ray streaming response of app_messages, after a
    first REPLICA message) and answer with what the replica sends. A replica that dies before any
    output reached the client gets the request sent once more, to another replica."""
    stream = call(routed)
    handed_over, served_by = False, None
    try:
        first = await asyncio.wait_for(stream.__anext__(), assign_timeout)
        served_by = first.get("id") if first.get("type") == REPLICA else None
        held, streamed = [], False
        async for message in stream:
            held.append(message)
            if message["type"] == "http.response.start":
                streamed = any(k.lower() == b"content-type" and v.startswith(b"text/event-stream")
                               for k, v in message.get("headers", ()))
                held[-1] = {**message, "headers": [*message.get("headers", ()), *served_headers(served_by, routed)]}
            elif carries_output(message, streamed):
                handed_over = True
                return Relayed(held, stream, streamed, stream.cancel)
        return Relayed(held, None, streamed, lambda: None)
    except RayActorError as e:
        if not retried:
            return await relay(call, replace(routed, avoid=served_by or "unknown"), assign_timeout, retried=True)
        return ApiError(503, f"{failure(e)}, and so did the one it was retried on; retry shortly",
                        kind="server_error", headers={"Retry-After": "1"}).response()
    except RayError as e:  # the replica's own fault (a bug): no retry, an OpenAI-shaped 500
        return ApiError(500, failure(e), kind="server_error").response()
    except asyncio.TimeoutError:
        return ApiError(503, f"no replica took the request within {assign_timeout:g} s; retry shortly",
                        kind="server_error", headers={"Retry-After": "1"}).response()
    finally:
        if not handed_over:
            with contextlib.suppress(Exception):
                stream.cancel()
