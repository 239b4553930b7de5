"""kiln on Ray Serve (`pip install kiln[ray]`): many `kiln serve` engines behind one endpoint.

Two deployments. Each replica of `kiln` owns one Engine, as `kiln serve` runs it (its own threads,
KV pool and radix cache), and serves server.py's FastAPI app to requests the ingress relays to it
(ray_relay.py): the API exists once. The ingress reads each request's prompt as the replica will
tokenize it, names its whole pages by a chain of hashes, and hands it to Ray's router, which for
this deployment is PrefixAffinityRouter (ray_router.py); a replica that dies before output reached
the client has its request sent once more, elsewhere, and Ray restarts it.

Replicas on one node share $KILN_CACHE: the first to start compiles and packs the model under a
file lock, the rest find the build there. Each replica copies its kiln_* metrics into Ray's
metrics export, where Ray Serve labels them with the replica's id.
"""
from __future__ import annotations

import fcntl
import json
import logging
import threading
import time
from contextlib import contextmanager
from typing import Iterator

from ray import serve
from ray.serve.config import RequestRouterConfig
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.routing import Route

from ..core.errors import KilnError
from ..core.paths import cache_dir
from ..frontend.gguf_reader import read_model
from ..frontend.registry import resolve
from ..runtime import load_options
from ..runtime.speculation import Speculation
from ..text.chat import render_chat_spans
from ..text.tokenizer import make_tokenizer
from .engine import Engine
from .http import ApiError, HeaderLimits, check_host, check_key, read_body
from .protocol import ChatRequest, CompletionRequest
from .ray_relay import REPLICA, app_messages, relay, scope_of
from .ray_router import PrefixAffinityRouter, Routed, prefix_blocks
from .ray_settings import Settings, settings_from_args
from .server import HEALTHY_HEARTBEAT, create_app

log = logging.getLogger("kiln.serve")

APP_NAME = "kiln"
ROUTER_CLASS = f"{PrefixAffinityRouter.__module__}:{PrefixAffinityRouter.__name__}"  # imported by name where it runs
METRICS_PERIOD = 5.0  # seconds between copies of a replica's metrics into Ray's (Ray exports every 10 s)
DELETE_BOUND = 300.0  # seconds Ray may take to delete the app on the way out: a bound on a hang, not a speed
INGRESS_MAX_ONGOING = 1024  # requests the ingress holds at once (each mostly waits on a replica)
METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]


@contextmanager
def node_lock() -> Iterator[None]:
    """One loader a node at a time: the first replica compiles and packs into $KILN_CACHE, the
    ones after it wait and then find every stage cached (the stages write atomically anyway)."""
    path = cache_dir() / "locks" / "ray-load.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield  # closing the file releases the lock


class KilnReplica:
    """One engine and the app `kiln serve` runs over it."""

    def __init__(self, s: Settings):
        with node_lock():
            model = load_options(s.model, s.options, s.threads_per_replica, target=s.target, isa=s.isa)
        speculation = Speculation.of(model, s.spec, None, s.spec_max_draft)
        self.engine = Engine(model, max_queue=max(s.max_queue, s.max_ongoing), prefix_cache=s.prefix_cache,
                             context_shift=s.context_shift, sinks=s.keep, speculation=speculation).start()
        self.app = create_app(self.engine, s.server)
        self.id = serve.get_replica_context().replica_id.unique_id
        self.mirror = MetricsMirror(self.engine.metrics.registry)

    async def serve(self, routed: Routed):
        yield {"type": REPLICA, "id": self.id}
        async for message in app_messages(self.app, routed.scope, routed.body):
            yield message

    def check_health(self) -> None:
        """Ray calls it every few seconds; a replica whose engine has died or stuck is restarted."""
        age = self.engine.heartbeat_age()
        if not self.engine.alive or age > HEALTHY_HEARTBEAT:
            raise RuntimeError("the engine has stopped" if not self.engine.alive
                               else f"the engine has not stepped for {age:.0f} s")

    def __del__(self):
        if hasattr(self, "mirror"):
            self.mirror.stop()
        if hasattr(self, "engine"):
            self.engine.stop()


@serve.ingress()
class KilnIngress:
    """The endpoint: reads a request's prompt for the router and relays the request to a replica."""

    def __init__(self, replicas, s: Settings):
        with node_lock():
            path = resolve(s.model)
        self.spec = read_model(path)
        self.tokenizer = make_tokenizer(self.spec.tokenizer, str(path))
        self.settings = s
        self.replicas = replicas.options(stream=True)

    def __serve_build_asgi_app__(self):
        async def api_error(request, exc: ApiError):
            return exc.response()

        app = Starlette(routes=[Route("/{path:path}", self.endpoint, methods=METHODS)],
                        exception_handlers={ApiError: api_error})
        app.add_middleware(HeaderLimits, config=self.settings.server)
        return app

    async def endpoint(self, request):
        path, config = request.scope["path"], self.settings.server
        if path == "/metrics":
            raise ApiError(404, "kiln's metrics are each replica's, in Ray's metrics export (ray_kiln_*, labelled "
                                "by replica): see docs/cluster.md", kind="not_found_error")
        check_host(request, config.allowed_hosts)
        if path != "/health":  # the one route server.py answers without a key
            check_key(request, config.api_keys)  # before the body is read or tokenized, as server.py does
        body = await read_body(request, config.max_body_bytes)
        blocks = await run_in_threadpool(self.blocks, request.scope["path"], body)
        return await relay(self.replicas.serve.remote, Routed(scope_of(request), body, blocks), config.request_timeout)

    def blocks(self, path: str, body: bytes) -> tuple[int, ...]:
        """The prompt's page hashes, tokenized as the replica will (server.py); none for a request
        that is not a completion or is malformed, which the replica then refuses, naming the field.
        Only routing depends on this: a wrong guess costs a prefill, never a wrong answer."""
        try:
            if path.endswith("/chat/completions"):
                req = ChatRequest.model_validate(json.loads(body))
                text, plain = render_chat_spans(self.spec, req.chat_messages(), tools=req.tool_list())
                ids = self.tokenizer.tokenize(text, plain=plain)
            elif path.endswith("/completions"):
                prompt = CompletionRequest.model_validate(json.loads(body)).prompt
                ids = list(prompt) if isinstance(prompt, list) and prompt and isinstance(prompt[0], int) \
                    else self.tokenizer.tokenize(prompt[0] if isinstance(prompt, list) else prompt)
            else:
                return ()
        except Exception:  # noqa: BLE001 - any request the replica will refuse
            return ()
        return prefix_blocks(ids, self.settings.options.page_size)


class MetricsMirror:
    """A replica's kiln_* metrics copied into Ray's metrics every METRICS_PERIOD seconds, sample by
    sample, where Ray Serve adds the deployment, replica and application tags: counters stay
    counters (Ray's, advanced by what is new); gauges and a histogram's series (_bucket by le,
    _sum, _count) arrive as gauges holding the replica's own values."""

    def __init__(self, registry, period: float = METRICS_PERIOD):
        self.registry, self.period = registry, period
        self._metrics: dict = {}
        self._counted: dict = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kiln-ray-metrics", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            try:
                self.copy()
            except Exception:  # noqa: BLE001 - metrics never take a replica down
                log.exception("copying the metrics into Ray's failed")

    def copy(self) -> None:
        from ray.serve.metrics import Counter, Gauge

        for family in self.registry.collect():
            for sample in family.samples:
                if sample.name.endswith("_created"):
                    continue
                tags = dict(sample.labels)
                key = (sample.name, tuple(sorted(tags.items())))
                if family.type == "counter":
                    metric = self._metric(Counter, family.name, family.documentation, tags)
                    new = sample.value - self._counted.get(key, 0.0)
                    if new > 0:
                        metric.inc(new, tags=tags or None)
                        self._counted[key] = sample.value
                else:
                    self._metric(Gauge, sample.name, family.documentation, tags).set(sample.value, tags=tags or None)

    def _metric(self, kind, name: str, doc: str, tags: dict):
        if name not in self._metrics:
            self._metrics[name] = kind(name, description=doc, tag_keys=tuple(sorted(tags)))
        return self._metrics[name]


def app_of(s: Settings):
    """The Ray Serve application: the ingress over the kiln replicas."""
    replica = {"ray_actor_options": {"num_cpus": s.threads_per_replica}, "max_ongoing_requests": s.max_ongoing,
               "health_check_period_s": 5.0, "health_check_timeout_s": 30.0}
    if s.autoscale:
        replica["autoscaling_config"] = {"min_replicas": s.autoscale[0], "max_replicas": s.autoscale[1],
                                         "initial_replicas": s.autoscale[0],
                                         "target_ongoing_requests": s.options.n_seq}
    else:
        replica["num_replicas"] = s.replicas
    if s.router == "affinity":
        replica["request_router_config"] = RequestRouterConfig(
            request_router_class=ROUTER_CLASS,
            request_router_kwargs={} if s.imbalance is None else {"imbalance": s.imbalance})
    kiln = serve.deployment(KilnReplica, name="kiln").options(**replica)
    ingress = serve.deployment(KilnIngress, name="ingress").options(
        num_replicas=1, ray_actor_options={"num_cpus": 0}, max_ongoing_requests=INGRESS_MAX_ONGOING)
    return ingress.bind(kiln.bind(s), s)


def build_app(args: dict):
    """`serve deploy`'s application builder (import_path: compiler.serving.ray:build_app)."""
    return app_of(settings_from_args(args))


def serve_forever(s: Settings, host: str, port: int, address: str | None, say=print) -> None:
    """Start a Ray cluster on this machine (address None) or join one, deploy, and serve until
    Ctrl-C or SIGTERM; then take the app down (and the cluster, if this started it)."""
    import faulthandler
    import signal

    import ray

    def stop(signum, frame):
        raise KeyboardInterrupt

    # `kill -USR1` prints every thread's stack: where a shutdown that does not end is waiting
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    ray.init(address=address or "local", logging_level=logging.WARNING)
    # SIGINT as well as SIGTERM, whatever the process inherited: a shell starts a background job
    # with SIGINT ignored, and Python then leaves it ignored (kiln serve, through uvicorn, stops on both)
    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        serve.start(http_options={"host": host, "port": port})
        serve.run(app_of(s), name=APP_NAME, route_prefix="/")
        scale = f"{s.autoscale[0]} to {s.autoscale[1]}" if s.autoscale else str(s.replicas)
        say(f"serving '{s.server.model_name}' on http://{host}:{port}/v1 through Ray Serve: {scale} replicas of "
            f"{s.threads_per_replica} thread(s), {s.options.n_seq} sequences each, the {s.router} router"
            + (f" (cluster {address})" if address else " (a cluster of this machine)"))
        # Timed waits: a signal's Python handler runs in the main thread only when it next runs
        # bytecode, and the kernel may hand SIGINT to one of Ray's threads, which does not end an
        # untimed wait (kiln serve --ray then slept through Ctrl-C)
        while True:
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        try:
            say(f"deleting the app '{APP_NAME}' from the cluster" if address else "shutting Ray Serve down")
            delete_app() if address else serve.shutdown()
        finally:
            say("leaving the cluster" if address else "stopping the cluster")
            ray.shutdown()


def delete_app(bound: float = DELETE_BOUND) -> None:
    """Delete kiln's app from the cluster and wait until Ray has. serve.delete's own wait gives up
    after 60 s, leaving the app half deleted, and on a busy machine its replicas' graceful shutdown
    (each winding its engine down) can take longer: here only a hang fails."""
    serve.delete(APP_NAME, _blocking=False)
    start = time.monotonic()
    while APP_NAME in serve.status().applications:
        if time.monotonic() - start > bound:
            raise KilnError(f"Ray has not deleted the app '{APP_NAME}' {bound:g} s after it was asked to "
                            "(`serve status` shows where it is stuck)")
        time.sleep(0.5)
