"""kiln layout and kiln ir: the planned memory map, and the IR after all passes."""
from __future__ import annotations

import argparse
import sys

from ..core.errors import KilnError
from ..ir.printer import format_graph
from ..planner.plan import plan
from ..planner.reports.text import render_json, render_text
from .common import add_model_options, log, options


def run_layout(a: argparse.Namespace) -> None:
    p = plan(a.model, options(a), log)
    if a.html:
        from ..planner.reports.html import render_html

        try:
            with open(a.html, "w", encoding="utf-8") as f:
                f.write(render_html(p.layout))
        except OSError as e:
            raise KilnError(f"--html {a.html}: cannot write it ({e.strerror})") from None
        print(a.html)
        return
    sys.stdout.write(render_json(p.layout) if a.json else render_text(p.layout))


def run_ir(a: argparse.Namespace) -> None:
    sys.stdout.write(format_graph(plan(a.model, options(a), log).graph))


def register(sub) -> None:
    p = sub.add_parser("layout", help="print the planned memory layout", epilog="docs: docs/architecture.md")
    add_model_options(p)
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="emit JSON instead of the text map")
    fmt.add_argument("--html", metavar="FILE", help="write the map drawn to scale as one self-contained HTML page")
    p.set_defaults(run=run_layout)

    p = sub.add_parser("ir", help="print the IR after all passes: the head, the layer body once, the tail, "
                                  "and what each layer binds", epilog="docs: docs/architecture.md")
    add_model_options(p)
    p.set_defaults(run=run_ir)
