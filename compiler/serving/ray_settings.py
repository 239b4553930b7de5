"""What one kiln app on Ray is made of (serving/ray.py): the model and how it is compiled, the
server's policy, the replicas and the router. From `kiln serve --ray`'s options, or from a
`serve deploy` config's args (the same long options, with underscores), each checked here once,
with errors that name the argument as both spell it. Nothing here needs Ray."""
from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path

from ..core.errors import KilnError
from ..core.options import CompileOptions
from ..frontend.registry import BUNDLED, DEFAULT_MODEL
from .http import ServerConfig

ROUTERS = ("affinity", "power-of-two")  # ours (ray_router.py), or Ray Serve's default


@dataclass(frozen=True)
class Settings:
    model: str
    options: CompileOptions
    server: ServerConfig
    threads_per_replica: int = 1  # each replica's kiln threads, and the CPUs Ray reserves for it
    target: str = "native"
    isa: str | None = None
    replicas: int = 1
    autoscale: tuple[int, int] | None = None  # (min, max) replicas; None: a fixed number
    router: str = "affinity"
    max_queue: int = 256
    prefix_cache: bool = True
    context_shift: bool = False
    keep: int = 4
    spec: str | None = None
    spec_max_draft: int | None = None
    imbalance: int | None = None  # requests more than the least loaded replica (ray_router.py); None: only when full

    def __post_init__(self):
        for name in ("threads_per_replica", "replicas", "max_queue"):
            _positive(name, getattr(self, name))
        if self.imbalance is not None:
            _positive("imbalance", self.imbalance, low=0)
        if self.autoscale is not None:
            object.__setattr__(self, "autoscale", parse_autoscale(self.autoscale))
        if self.router not in ROUTERS:
            raise KilnError(f"{_named('router')} must be one of {', '.join(ROUTERS)}, got {self.router!r}")

    @property
    def max_ongoing(self) -> int:
        """Requests Ray sends a replica at once: a batch running and the next one waiting. Past it,
        requests wait in the ingress's router, which then routes them with fresher loads."""
        return 2 * self.options.n_seq


def parse_autoscale(value) -> tuple[int, int]:
    """'MIN:MAX' (or a pair) as two replica counts, 1 <= MIN <= MAX."""
    try:
        lo, hi = (int(v) for v in (value.split(":") if isinstance(value, str) else value))
    except (TypeError, ValueError):
        raise KilnError(f"{_named('autoscale')} must be MIN:MAX replicas, e.g. 1:4, got {value!r}") from None
    if not 1 <= lo <= hi:
        raise KilnError(f"{_named('autoscale')} {lo}:{hi}: need 1 <= MIN <= MAX")
    return lo, hi


def model_name(model: str) -> str:
    """The model's name in the API when no alias is given: the bundled name, or the file's stem."""
    return model if model in BUNDLED else Path(model).stem


_COMPILE = {f.name for f in fields(CompileOptions)}
_SERVER = {f.name for f in fields(ServerConfig) if f.init} - {"model_name", "slot_save_path", "slot_max_bytes",
                                                             "slot_share"}
_OWN = {f.name for f in fields(Settings)} - {"options", "server"}
_LISTS = ("api_keys", "allowed_hosts")


def settings_from_args(args: dict) -> Settings:
    """A `serve deploy` config's args (docs/cluster.md); an unknown one is refused by name."""
    args = dict(args)
    known = _COMPILE | _SERVER | _OWN | {"alias"}
    unknown = sorted(set(args) - known)
    if unknown:
        raise KilnError(f"{', '.join(unknown)}: not an argument of kiln's Ray app; it takes {', '.join(sorted(known))}")
    model = str(args.pop("model", DEFAULT_MODEL))
    server = {k: v for k, v in args.items() if k in _SERVER}
    for name in _LISTS:
        if name in server:
            value = server[name]
            server[name] = (value,) if isinstance(value, str) else tuple(str(v) for v in value)
    for name, value in server.items():
        if name == "reasoning_format" and value not in ("auto", "none"):
            raise KilnError(f"{_named(name)} must be 'auto' or 'none', got {value!r}")
        if name == "reasoning_budget" and (isinstance(value, bool) or not isinstance(value, int) or value < -1):
            raise KilnError(f"{_named(name)} must be -1 (no bound) or a number of tokens, got {value!r}")
        if name not in (*_LISTS, "metrics_key", "reasoning_format", "reasoning_budget"):
            _positive(name, value, number=name == "request_timeout")
    if "allowed_hosts" in server:
        server["allowed_hosts"] = tuple(h.lower() for h in server["allowed_hosts"])
    config = ServerConfig(model_name=args.pop("alias", None) or model_name(model), **server)
    return Settings(model=model, options=CompileOptions(**{k: v for k, v in args.items() if k in _COMPILE}),
                    server=config, **{k: v for k, v in args.items() if k in _OWN})


def _positive(name: str, value, low: int = 1, number: bool = False) -> None:
    kinds = (int, float) if number else (int,)
    if isinstance(value, bool) or not isinstance(value, kinds) or value < low or (number and not value > 0):
        what = "a positive number" if number else "a positive integer" if low else "a whole number >= 0"
        raise KilnError(f"{_named(name)} must be {what}, got {value!r}")


def _named(arg: str) -> str:
    """An argument as a config file and the command line name it: `replicas (--replicas)`."""
    return f"{arg} (--{arg.replace('_', '-')})"
