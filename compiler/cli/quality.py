"""kiln kv-quality and kiln perplexity: what a KV dtype costs, and a text's perplexity."""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, replace

from ..core.errors import KilnError
from ..core.options import CompileOptions
from .common import add_build_options, add_model_argument, add_model_options, add_threads, load, log, options, read_text


def run_kv_quality(a: argparse.Namespace) -> None:
    from ..tools.kv_quality import DEFAULT_TEXT, measure, parse_pair, render

    dtypes = [d for d in a.kv_dtype.split(",") if d.strip()]
    for d in dtypes:
        parse_pair(d)  # an unknown dtype fails before anything is compiled
    text, path = read_text(a.text, DEFAULT_TEXT)
    rows = measure(a.model, dtypes, text, ctx=a.ctx, prefill_chunk=a.prefill_chunk, llamacpp=a.llamacpp, log=log)
    if a.json:
        print(json.dumps([asdict(r) for r in rows], indent=1))
    else:
        sys.stdout.write(render(rows, str(a.model), str(path)))


def run_perplexity(a: argparse.Namespace) -> None:
    from ..tools import perplexity

    if a.mode == "stream" and not 1 <= a.batch <= a.ctx // 2:
        raise KilnError(f"--batch must be between 1 and ctx / 2 = {a.ctx // 2}, got {a.batch}")
    if a.discard is not None and not 1 <= a.discard < a.ctx:
        raise KilnError(f"--discard must be between 1 and ctx - 1 = {a.ctx - 1}, got {a.discard}")
    text, path = read_text(a.text, perplexity.DEFAULT_TEXT)
    source = str(path) if a.text else perplexity.DEFAULT_TEXT_SOURCE
    o = options(a)
    if a.mode == "chunks":  # one chunk a step, with every row's logits
        o = replace(o, prefill_chunk=min(o.ctx, 512), batch_tokens=min(o.ctx, 512))
    m = load(a, o)
    r = perplexity.measure(m, text, a.mode, a.sinks, a.batch, a.discard, a.policy)
    if a.json:
        print(json.dumps({"model": str(a.model), "text": source, **r.as_json()}))
    else:
        sys.stdout.write(perplexity.render([r], str(a.model), source))


def register(sub) -> None:
    p = sub.add_parser("kv-quality", help="KL and top-1 of each KV dtype against the f32 cache, and the bytes saved",
                       epilog="docs: docs/long-context.md")
    add_model_argument(p)
    p.add_argument("--kv-dtype", default="f16,q8_0",
                   help="comma-separated dtypes to measure, K/V for a pair such as q8_0/q4_0 (default f16,q8_0)")
    p.add_argument("--llamacpp", action="store_true",
                   help="measure llama.cpp's caches of the same types too, against its own f32 cache")
    p.add_argument("--text", help="text file to read (default: a built-in text of about 1,500 tokens)")
    p.add_argument("--ctx", type=int, default=CompileOptions.ctx, help="context; the text is cut to it")
    p.add_argument("--prefill-chunk", type=int, default=CompileOptions.prefill_chunk)
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=run_kv_quality)

    p = sub.add_parser("perplexity", help="perplexity of a text: llama-perplexity's chunks, or streamed through "
                                          "a fixed cache with context shift", epilog="docs: docs/long-context.md")
    add_model_options(p)
    add_build_options(p)
    p.add_argument("--text", help="UTF-8 text file (default: a public-domain story of about 10,000 tokens)")
    p.add_argument("--mode", choices=["chunks", "stream"], default="chunks",
                   help="chunks: ctx-token chunks, second halves scored; stream: the whole text through one "
                        "cache of ctx positions, shifted when full")
    p.add_argument("--sinks", type=int, default=4,
                   help="stream: positions a shift keeps (plus BOS, as llama.cpp); 0 for a plain window")
    p.add_argument("--discard", type=int, default=None, help="stream: positions a shift drops (default: half)")
    p.add_argument("--policy", choices=["window", "h2o"], default="window",
                   help="stream: what a full cache keeps besides the sinks: the most recent positions (window), "
                        "or half recent, half heavy hitters by accumulated attention (h2o)")
    p.add_argument("--batch", type=int, default=32, help="stream: tokens read per step")
    add_threads(p)
    p.add_argument("--json", action="store_true", help="one JSON object: mode, ctx, sinks, kv_dtype_k, "
                                                       "kv_dtype_v, n_scored, ppl, nll, n_shifts, model, text")
    p.set_defaults(run=run_perplexity)
