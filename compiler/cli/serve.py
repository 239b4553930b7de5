"""kiln serve: the OpenAI-compatible HTTP server (serving/)."""
from __future__ import annotations

import argparse
from pathlib import Path

from ..core.errors import KilnError
from ..frontend.registry import BUNDLED
from .common import add_build_options, add_model_options, add_shift_options, add_threads, check_keep, load, log, options


def run(a: argparse.Namespace) -> None:
    import uvicorn

    from ..serving.engine import Engine
    from ..serving.server import create_app

    if not 1 <= a.port <= 65535:
        raise KilnError(f"--port must be between 1 and 65535, got {a.port}")
    if a.max_queue < 1:
        raise KilnError(f"--max-queue must be at least 1, got {a.max_queue}")
    o = options(a)
    check_keep(a)
    slot_dir = None
    if a.slot_save_path:
        slot_dir = Path(a.slot_save_path)
        if not slot_dir.is_dir():
            raise KilnError(f"--slot-save-path {slot_dir}: not a directory; create it first")
    m = load(a, o)
    name = a.alias or (a.model if a.model in BUNDLED else m.path.stem)
    engine = Engine(m, max_queue=a.max_queue, prefix_cache=not a.no_prefix_cache, context_shift=a.context_shift,
                    sinks=a.keep).start()
    stats = m.kv_stats()
    log(f"serving '{name}' on http://{a.host}:{a.port}/v1: {o.n_seq} sequences, ctx {m.n_ctx}, "
        f"{stats['pages_total']} KV pages of {o.page_size} positions, {m.n_threads} threads")
    try:
        uvicorn.run(create_app(engine, name, api_key=a.api_key, slot_save_path=slot_dir), host=a.host, port=a.port,
                    log_level=a.log_level, timeout_graceful_shutdown=2)
    finally:
        engine.stop()


def register(sub) -> None:
    p = sub.add_parser("serve", help="an OpenAI-compatible HTTP server with continuous batching and a prefix cache")
    add_model_options(p, n_seq=8)
    add_build_options(p)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on /v1")
    p.add_argument("--alias", default=None, help="the model's name in the API (default: the bundled name or file stem)")
    p.add_argument("--max-queue", type=int, default=256, help="waiting requests before 503 Retry-After")
    p.add_argument("--no-prefix-cache", action="store_true", help="do not share prompt prefixes across requests")
    add_threads(p)
    p.add_argument("--log-level", default="warning", choices=["critical", "error", "warning", "info", "debug"])
    p.add_argument("--slot-save-path", default=None,
                   help="directory for POST /slots/{id}?action=save|restore (llama-server's); off without it")
    add_shift_options(p)
    p.set_defaults(run=run)
