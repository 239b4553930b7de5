"""From a model argument and options to a validated, planned graph: the front half of kiln."""
from __future__ import annotations

import os
from dataclasses import dataclass

from .builders import build_decode, build_prefill
from .errors import GraphError
from .gguf_model import ModelSpec, read_model
from .ir import Graph, Mode
from .options import CompileOptions
from .passes import PassContext, run_passes
from .planner.kv_plan import plan_kv
from .planner.layout import Layout, plan_layout
from .registry import resolve
from .templates import Template, load_template


@dataclass(frozen=True)
class Planned:
    spec: ModelSpec
    template: Template
    options: CompileOptions
    graph: Graph
    layout: Layout


def build_graph(spec: ModelSpec, tmpl: Template, opts: CompileOptions, mode: Mode) -> Graph:
    if mode is Mode.DECODE:
        return build_decode(spec, tmpl)
    return build_prefill(spec, tmpl, opts.batch_tokens)


def plan(model: str | os.PathLike[str], opts: CompileOptions, mode: Mode = Mode.DECODE,
         log=lambda s: None) -> Planned:
    spec = read_model(resolve(model, log))
    tmpl = load_template(spec.arch)
    kv = plan_kv(spec.hparams, tmpl, opts)
    try:
        graph = run_passes(build_graph(spec, tmpl, opts, mode), PassContext(spec, kv))
    except GraphError as e:  # the file's tensors do not make the graph its template describes
        raise GraphError(f"{spec.path}: {e}") if str(spec.path) not in str(e) else e from None
    return Planned(spec, tmpl, opts, graph, plan_layout(graph, spec, tmpl, opts, kv))
