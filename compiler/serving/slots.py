"""llama-server's slot save and restore (POST /slots/{id}?action=save|restore): a slot's KV cache
to a file under --slot-save-path, and back.

Both run on the engine thread (it owns the model), taking a place in the queue like a request.
A save refuses to overwrite a file unless asked, and a cache larger than --slot-max-bytes; a
restore refuses a file larger than that before reading it. A restored cache is the slot's own:
only a request that names the slot (`id_slot`) starts from it, and what it computes on top never
enters the shared prefix cache, since the file's KV is only as trustworthy as whoever wrote it.
With --slot-share it goes into the shared prefix cache instead, as llama-server does.
"""
from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path

from fastapi import FastAPI, Request as HttpRequest

from ..core.errors import KilnError
from ..runtime.kv_file import KVFileError
from .engine import Engine
from .http import ApiError, ServerConfig, busy, check_host, check_json_content_type, check_key, read_json, validated
from .protocol import SlotRequest
from .types import QueueFull


def save_slot(engine: Engine, slot: int, path: Path, limit: int, overwrite: bool) -> tuple[int, int]:
    """On the engine thread: the cache of the last request slot `slot` served, rebuilt from the
    prefix cache and a prefill of the rest, into a file. (tokens, bytes written)."""
    tokens = engine.slots.get(slot)
    if not tokens:
        raise KilnError(f"slot {slot} has served no request yet: nothing to save")
    if path.exists() and not overwrite:
        raise KVFileError(f"{path.name} exists: send \"overwrite\": true to replace it")
    held = engine.cache.match(tokens) if engine.cache else None
    seq = None
    try:
        seq = engine.open_sequence(lambda: engine.model.sequence(held.pages, held.tokens) if held
                                   else engine.model.sequence())
        if seq.n_past < len(tokens):
            seq.prefill(tokens[seq.n_past:])
        if seq.state_size() > limit:
            raise KVFileError(f"the slot's cache is {seq.state_size():,} bytes, over --slot-max-bytes {limit:,}")
        return len(tokens), seq.save(path)
    finally:
        if seq is not None:
            seq.close()
        if held:
            engine.cache.release(held)


def restore_slot(engine: Engine, slot: int, path: Path, limit: int, share: bool) -> tuple[int, int]:
    """On the engine thread: a saved cache into the slot's own pages (or, shared, into the prefix
    cache), and into the slot's record. (tokens, bytes read)."""
    size = path.stat().st_size
    if size > limit:
        raise KVFileError(f"{path.name} is {size:,} bytes, over --slot-max-bytes {limit:,}")
    seq = engine.open_sequence(lambda: engine.model.sequence_from(path))
    try:
        if share and engine.cache and seq.exact:
            engine.cache.release(engine.cache.insert(seq, None))
        elif seq.exact:
            n_blocks = seq.n_past // engine.model.page_size
            engine.keep_private(slot, list(seq.tokens[:n_blocks * engine.model.page_size]), seq.share(0, n_blocks))
        engine.slots[slot] = list(seq.tokens)
        return seq.n_past, size
    finally:
        seq.close()


_SLOT_ID = re.compile(r"[0-9]{1,9}")  # ASCII digits: "²" is a digit to str.isdigit, not to int()


def add_slot_routes(app: FastAPI, engine: Engine, config: ServerConfig) -> None:
    @app.post("/slots/{slot_id}")
    async def slots(request: HttpRequest, slot_id: str, action: str = ""):
        check_host(request, config.allowed_hosts)
        check_key(request, config.api_keys)
        if config.slot_save_path is None:
            raise ApiError(501, "slot save/restore is off: start the server with --slot-save-path DIR",
                           kind="not_supported_error")
        if action not in ("save", "restore"):
            raise ApiError(400, f"action: must be 'save' or 'restore', got {action!r}", param="action")
        if not (_SLOT_ID.fullmatch(slot_id) and int(slot_id) < engine.n_slots):
            raise ApiError(400, f"id_slot: must be between 0 and {engine.n_slots - 1}, got {slot_id!r}",
                           param="id_slot")
        if not engine.has_room():
            raise busy("the queue is full (--max-queue)")
        check_json_content_type(request)
        body = validated(SlotRequest, await read_json(request, config.max_body_bytes))
        path, slot, t0 = config.slot_save_path / body.filename, int(slot_id), time.perf_counter()
        if action == "save":
            def work():
                return save_slot(engine, slot, path, config.slot_max_bytes, body.overwrite)
        else:
            def work():
                return restore_slot(engine, slot, path, config.slot_max_bytes, config.slot_share)
        try:
            n_tokens, n_bytes = await asyncio.wait_for(asyncio.wrap_future(engine.call(work)),
                                                       config.request_timeout)
        except QueueFull as e:
            raise busy(str(e)) from None
        except asyncio.TimeoutError:
            raise ApiError(504, f"the slot action took longer than {config.request_timeout:g} s", kind="server_error")
        except FileNotFoundError:
            raise ApiError(404, f"filename: {body.filename} does not exist", param="filename") from None
        except (KilnError, OSError) as e:
            text = str(e) if isinstance(e, KilnError) else f"{body.filename}: {e.strerror}"
            raise ApiError(404 if isinstance(e, KVFileError) and not path.exists() else 400,
                           text.replace(str(config.slot_save_path) + "/", ""), param="filename") from None
        ms = (time.perf_counter() - t0) * 1e3
        if action == "save":
            return {"id_slot": slot, "filename": body.filename, "n_saved": n_tokens, "n_written": n_bytes,
                    "timings": {"save_ms": ms}}
        return {"id_slot": slot, "filename": body.filename, "n_restored": n_tokens, "n_read": n_bytes,
                "timings": {"restore_ms": ms}}

