"""kiln serve: the OpenAI-compatible HTTP server (serving/)."""
from __future__ import annotations

import argparse
import os
from pathlib import Path

from ..core.errors import KilnError
from ..frontend.registry import BUNDLED
from .common import (add_build_options, add_model_options, add_shift_options, add_spec_options, add_threads, check_keep,
                     load, log, options, speculation)
from .serve_ray import add_ray_options, ray_requested, serve_on_ray


LOOPBACK = ("127.0.0.1", "localhost", "::1")


def api_keys(a: argparse.Namespace) -> tuple[str, ...]:
    """--api-key, then each line of --api-key-file, then $KILN_API_KEY: every key the server takes."""
    keys = [a.api_key] if a.api_key else []
    if a.api_key_file:
        try:
            lines = Path(a.api_key_file).read_text().splitlines()
        except OSError as e:
            raise KilnError(f"--api-key-file {a.api_key_file}: {e.strerror}") from None
        keys += [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]
        if len(keys) == (1 if a.api_key else 0):
            raise KilnError(f"--api-key-file {a.api_key_file}: no keys in it (one a line)")
    if os.environ.get("KILN_API_KEY"):
        keys.append(os.environ["KILN_API_KEY"])
    return tuple(dict.fromkeys(keys))


def allowed_hosts(a: argparse.Namespace) -> tuple[str, ...] | None:
    """The Host names requests may carry: --allowed-hosts; by default the loopback names when the
    server listens on loopback (so a DNS-rebound page cannot reach it), any otherwise."""
    if a.allowed_hosts:
        return tuple(h.strip().lower() for h in a.allowed_hosts.split(",") if h.strip())
    return LOOPBACK if a.host in LOOPBACK else None


def positive(name: str, value, low=1) -> None:
    if value < low:
        raise KilnError(f"{name} must be at least {low}, got {value}")


def run(a: argparse.Namespace) -> None:
    import uvicorn

    from ..serving.engine import Engine
    from ..serving.state_cache import Snapshots
    from ..serving.http import ServerConfig, h11_header_bound
    from ..serving.server import create_app
    from ..runtime.speculation import Speculation

    if not 1 <= a.port <= 65535:
        raise KilnError(f"--port must be between 1 and 65535, got {a.port}")
    for name, value in (("--max-queue", a.max_queue), ("--max-body-bytes", a.max_body_bytes),
                        ("--max-tokens", a.max_tokens), ("--max-connections", a.max_connections),
                        ("--max-header-bytes", a.max_header_bytes), ("--slot-max-bytes", a.slot_max_bytes)):
        positive(name, value)
    for name, value in (("--request-timeout", a.request_timeout), ("--keep-alive-timeout", a.keep_alive_timeout)):
        if not value > 0:
            raise KilnError(f"{name} must be a positive number of seconds, got {value}")
    o = options(a)
    check_keep(a)
    slot_dir = None
    if a.slot_save_path:
        slot_dir = Path(a.slot_save_path)
        if not slot_dir.is_dir():
            raise KilnError(f"--slot-save-path {slot_dir}: not a directory; create it first")
    if a.reasoning_budget < -1:
        raise KilnError(f"--reasoning-budget: -1 (no bound) or a number of tokens, got {a.reasoning_budget}")
    keys = api_keys(a)
    if ray_requested(a):  # replicas of this server on a Ray cluster, each loading the model itself
        return serve_on_ray(a, o, keys, allowed_hosts(a), a.host in LOOPBACK)
    m = load(a, o)
    spec = speculation(a, m)
    name = a.alias or (a.model if a.model in BUNDLED else m.path.stem)
    config = ServerConfig(name, keys, allowed_hosts(a), a.max_body_bytes, a.max_tokens, a.request_timeout, slot_dir,
                          a.slot_max_bytes, a.slot_share, a.metrics_key, a.max_header_bytes,
                          reasoning_format=a.reasoning_format, reasoning_budget=a.reasoning_budget)
    if a.snapshot_interval < 1 or a.snapshot_mib < 0:
        raise KilnError("--snapshot-interval must be at least 1 token and --snapshot-mib at least 0")
    engine = Engine(m, max_queue=a.max_queue, prefix_cache=not a.no_prefix_cache, context_shift=a.context_shift,
                    sinks=a.keep, speculation=Speculation.of(m, spec.get("speculative"), None, spec.get("max_draft")),
                    snapshots=Snapshots(a.snapshot_interval, a.snapshot_mib << 20)).start()
    stats = m.kv_stats()
    log(f"serving '{name}' on http://{a.host}:{a.port}/v1: {o.n_seq} sequences, ctx {m.n_ctx}, "
        f"{stats['pages_total']} KV pages of {o.page_size} positions, {m.n_threads} threads"
        + (f"; speculative decoding by prompt lookup, up to {engine.speculation.max_draft} drafts a step"
           if engine.speculation else "")
        + ("" if keys else "; no API key (see docs/serving.md, Security)"))
    try:
        # h11 bounds a request's header block (count and size together); httptools would not
        uvicorn.run(create_app(engine, config), host=a.host, port=a.port, log_level=a.log_level, http="h11",
                    h11_max_incomplete_event_size=h11_header_bound(a.max_header_bytes), limit_concurrency=a.max_connections,
                    timeout_keep_alive=a.keep_alive_timeout, timeout_graceful_shutdown=2)
    finally:
        engine.stop()


def register(sub) -> None:
    p = sub.add_parser("serve", help="an OpenAI-compatible HTTP server with continuous batching and a prefix cache",
                       epilog="docs: docs/serving.md (on Ray: docs/cluster.md)")
    add_model_options(p, n_seq=8)
    add_build_options(p)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' (visible to ps: prefer the "
                                                    "file or $KILN_API_KEY)")
    p.add_argument("--api-key-file", default=None, help="API keys, one a line (several: one per tenant)")
    p.add_argument("--alias", default=None, help="the model's name in the API (default: the bundled name or file stem)")
    p.add_argument("--max-queue", type=int, default=256, help="waiting requests before 503 Retry-After")
    p.add_argument("--max-tokens", type=int, default=4096, help="the most tokens one request may generate")
    p.add_argument("--max-body-bytes", type=int, default=4 << 20, help="the largest request body (413 past it)")
    p.add_argument("--max-header-bytes", type=int, default=16 << 10, help="the largest request header block")
    p.add_argument("--max-connections", type=int, default=512, help="open connections before 503")
    p.add_argument("--keep-alive-timeout", type=float, default=5.0, help="seconds an idle connection is kept")
    p.add_argument("--request-timeout", type=float, default=600.0, help="seconds a request may take, queueing included")
    p.add_argument("--allowed-hosts", default=None,
                   help="Host header names to answer, comma-separated (default: the loopback names when --host is "
                        "loopback, any otherwise)")
    p.add_argument("--metrics-key", default=None, help="require 'Authorization: Bearer KEY' on /metrics")
    p.add_argument("--no-prefix-cache", action="store_true", help="do not share prompt prefixes across requests")
    p.add_argument("--reasoning-format", default="auto", choices=["auto", "none"],
                   help="auto: a reasoning model's thinking comes back as reasoning_content, apart from the content; "
                        "none: left in the content (llama-server's)")
    p.add_argument("--reasoning-budget", type=int, default=-1,
                   help="thinking tokens a chat request may take unless it sets reasoning_budget; then the end of "
                        "the thinking is forced (-1: no bound)")
    p.add_argument("--snapshot-interval", type=int, default=256,
                   help="a hybrid (qwen35, qwen3next): tokens of a prompt between snapshots of a sequence's whole state, "
                        "which later requests with the same prefix restore (also at each prompt's and request's end)")
    p.add_argument("--snapshot-mib", type=int, default=1024,
                   help="a hybrid's state snapshots are kept within this many MiB, least recently used evicted")
    add_threads(p)
    p.add_argument("--log-level", default="warning", choices=["critical", "error", "warning", "info", "debug"])
    p.add_argument("--slot-save-path", default=None,
                   help="directory for POST /slots/{id}?action=save|restore (llama-server's); off without it")
    p.add_argument("--slot-max-bytes", type=int, default=1 << 30, help="the largest slot file saved or restored")
    p.add_argument("--slot-share", action="store_true",
                   help="a restored slot goes into the shared prefix cache (default: only requests naming the slot)")
    add_shift_options(p)
    add_spec_options(p, draft=False)
    add_ray_options(p)
    p.set_defaults(run=run)
