"""kiln models: the bundled models, and fetching them."""
from __future__ import annotations

import argparse

from ..core.errors import KilnError
from ..core.paths import cache_dir
from ..frontend.registry import BUNDLED, fetch, is_cached, lookup, model_path
from .common import progress


def run(a: argparse.Namespace) -> None:
    if a.action == "fetch":
        names = list(BUNDLED) if a.all else a.names
        if not names:
            raise KilnError("models fetch: name a model or pass --all")
        for name in names:
            m = lookup(name)
            was_cached = is_cached(m)
            with progress(every_stage=True) as p, p.stage("fetch"):
                path = fetch(m, p)
            print(f"{name}: {path}" + (" (already cached)" if was_cached else ""))
        return
    print(f"cache: {cache_dir()}")
    print(f"{'name':<14} {'size':>10}  {'cached':<6}  {'source':<42} description")
    for m in BUNDLED.values():
        cached = "yes" if is_cached(m) else "no"
        print(f"{m.name:<14} {m.size / 1e6:>7.1f} MB  {cached:<6}  {m.source:<42} {m.description}")
        if a.verbose:
            print(f"{'':<14} file {model_path(m)}  sha256 {m.sha256}")


def register(sub) -> None:
    p = sub.add_parser("models", help="list or fetch the bundled models", epilog="docs: docs/models.md")
    p.add_argument("action", nargs="?", choices=["list", "fetch"], default="list")
    p.add_argument("names", nargs="*", help="models to fetch")
    p.add_argument("--all", action="store_true", help="fetch every bundled model")
    p.add_argument("-v", "--verbose", action="store_true", help="show cache paths and checksums")
    p.set_defaults(run=run)
