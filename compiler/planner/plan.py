"""From a model argument and options to a validated, planned step graph: the front half of kiln.

GGUF -> spec -> architecture -> KV config -> graph -> passes -> layout.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, replace

from ..core.errors import GraphError
from ..core.options import MAX_PREFILL_CHUNK, CompileOptions
from ..core.progress import as_progress
from ..frontend.architecture import Architecture
from ..frontend.architecture_file import load_architecture
from ..frontend.gguf_reader import read_model
from ..frontend.registry import resolve
from ..frontend.spec import ModelSpec
from ..ir.builder import build_graph
from ..ir.graph import Graph
from ..ir.kv import kv_config
from ..passes import PassContext, run_passes
from .layout import Layout, plan_layout


@dataclass(frozen=True)
class Planned:
    spec: ModelSpec
    arch: Architecture
    options: CompileOptions
    graph: Graph
    layout: Layout


def fit_encoder(spec: ModelSpec, arch: Architecture, opts: CompileOptions, log=lambda s: None) -> CompileOptions:
    """A bidirectional model sees each input whole in one step, so that step takes the longest input
    the model accepts: the context is at most its learned positions (absolute ones) or its training
    context, and the step's rows and prefill chunk are the whole context. An input never fails for
    want of a batch. Its KV pool holds one step's rows (unless kv_pages says otherwise)."""
    if spec.hparams.causal:
        return opts
    limit = spec.tensor("position_embd.weight").shape[0] if arch.position_embedding == "absolute" \
        else spec.hparams.n_ctx_train
    ctx = min(opts.ctx, limit, MAX_PREFILL_CHUNK)
    if ctx != opts.ctx:
        as_progress(log).note(f"ctx {ctx}: a bidirectional model's longest input ({limit} positions)")
    batch = max(opts.batch_tokens, ctx)
    # its cache lives for one step: a step's rows, and a part-filled page a sequence, are all it holds
    pages = opts.kv_pages or min(opts.n_seq * -(-ctx // opts.page_size), -(-batch // opts.page_size) + opts.n_seq)
    return replace(opts, ctx=ctx, batch_tokens=batch, prefill_chunk=ctx, kv_pages=pages)


def plan(model: str | os.PathLike[str], opts: CompileOptions, log=lambda s: None) -> Planned:
    spec = read_model(resolve(model, log))
    arch = load_architecture(spec.arch)
    opts = fit_encoder(spec, arch, opts, log)
    kv = kv_config(spec.hparams, opts)
    try:
        graph = run_passes(build_graph(spec, arch, opts.batch_tokens, opts.ctx, opts.embedding), PassContext(spec, kv))
    except GraphError as e:  # the file's tensors do not make the graph its architecture describes
        raise GraphError(f"{spec.path}: {e}") if str(spec.path) not in str(e) else e from None
    return Planned(spec, arch, opts, graph, plan_layout(graph, spec, arch, opts, kv))
