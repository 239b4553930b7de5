"""kiln serve --ray: replicas of `kiln serve` on a Ray cluster behind one endpoint (serving/ray.py;
docs/cluster.md). Ray itself is an extra: pip install kiln[ray]."""
from __future__ import annotations

import argparse
import os

from ..core.errors import KilnError
from ..core.options import CompileOptions
from .common import log

RAY_ONLY = ("replicas", "autoscale", "threads_per_replica", "ray_address")


def add_ray_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("on a Ray cluster (pip install kiln[ray]; docs/cluster.md)")
    g.add_argument("--ray", action="store_true", help="serve replicas of this server on Ray Serve behind one ingress, "
                                                     "routed by prompt prefix")
    g.add_argument("--replicas", type=int, default=None, metavar="N", help="replicas (default 1)")
    g.add_argument("--autoscale", default=None, metavar="MIN:MAX",
                   help="between MIN and MAX replicas, aiming at --n-seq requests a replica")
    g.add_argument("--threads-per-replica", type=int, default=None, metavar="T",
                   help="each replica's threads, and the CPUs Ray reserves for it (default 1)")
    g.add_argument("--ray-address", default=None, metavar="ADDRESS",
                   help="join this cluster (`ray start --head` prints it; 'auto' finds a local one); "
                        "default: start a cluster of this machine")
    g.add_argument("--router", choices=["affinity", "power-of-two"], default="affinity",
                   help="affinity: to the replica that likely holds the prompt's prefix; power-of-two: Ray's default")


def ray_requested(a: argparse.Namespace) -> bool:
    """--ray, with the options that need it refused without it."""
    if not a.ray:
        given = [name for name in RAY_ONLY if getattr(a, name) is not None]
        if given:
            raise KilnError(f"--{given[0].replace('_', '-')} needs --ray")
    return a.ray


def serve_on_ray(a: argparse.Namespace, opts: CompileOptions, keys: tuple[str, ...], hosts, loopback: bool) -> None:
    if a.replicas is not None and a.autoscale is not None:
        raise KilnError("--replicas and --autoscale: give one (a fixed count, or MIN:MAX)")
    if a.threads is not None:
        raise KilnError("--threads: under --ray each replica's threads are --threads-per-replica")
    if a.slot_save_path:
        raise KilnError("--slot-save-path: a slot is one engine's; under --ray save and restore are off")
    from ..serving.http import ServerConfig
    from ..serving.ray_settings import Settings, model_name

    config = ServerConfig(a.alias or model_name(a.model), keys, hosts, a.max_body_bytes, a.max_tokens,
                          a.request_timeout, None, a.slot_max_bytes, False, a.metrics_key, a.max_header_bytes,
                          reasoning_format=a.reasoning_format, reasoning_budget=a.reasoning_budget)
    settings = Settings(a.model, opts, config, 1 if a.threads_per_replica is None else a.threads_per_replica,
                        a.target, a.isa, 1 if a.replicas is None else a.replicas, a.autoscale, a.router, a.max_queue,
                        not a.no_prefix_cache, a.context_shift, a.keep, a.spec, a.spec_max_draft)
    if a.ray_address is None and loopback:
        # Ray's switch for a cluster of one machine: every Ray address is then 127.0.0.1, not the LAN's
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    try:
        from ..serving.ray import serve_forever
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] != "ray":
            raise
        raise KilnError("--ray needs Ray Serve, an extra of kiln's: pip install 'kiln[ray]'") from None
    serve_forever(settings, a.host, a.port, a.ray_address, say=log)
