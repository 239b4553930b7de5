"""kiln bench and kiln bench-serve: kiln and llama.cpp side by side, in one run."""
from __future__ import annotations

import argparse
import sys

from ..core.errors import KilnError
from ..frontend.registry import BUNDLED, resolve
from ..tools.synthetic_models import SHAPES, WTYPES
from .common import DEFAULT_MODEL, add_build_options, add_model_argument, int_list, log


def run_bench(a: argparse.Namespace) -> None:
    from ..runtime import default_threads, load
    from ..build.targets import kernel_set
    from ..tools.bandwidth import read_bandwidth_c, read_bandwidth_numpy
    from ..tools.bench import (decode_bytes_per_token, decode_kv_bytes_per_token, default_tests, render, run_bench,
                               write_json)

    if a.synthetic:
        from ..tools.synthetic_models import synthetic_model

        if a.model != DEFAULT_MODEL:
            raise KilnError("--synthetic names the model: give no MODEL with it")
        a.model = synthetic_model(a.synthetic, a.wtype, log=log)
    threads = a.threads or default_threads()
    if threads < 1 or a.reps < 1:
        raise KilnError("--threads and --reps must be at least 1")
    batches = int_list(a.batch, "--batch", "sequence counts, such as 1,2,4,8") if a.batch else []
    build = {"target": a.target, "isa": a.isa}  # the kiln build benched: any path, on this CPU
    meta: dict = {"model": str(a.model), "threads": threads, "kv_dtype": a.kv_dtype, **build}
    results = []
    engines: dict = {}  # each rival's version and flags, for the JSON's provenance
    if a.pp_depth < 0 or a.pp < 1:
        raise KilnError("--pp must be at least 1 and --pp-depth at least 0")
    if (a.spec or a.embed or a.page_sizes) and (a.target != "native" or a.isa):
        mode = "--spec" if a.spec else "--embed" if a.embed else "--page-sizes"
        raise KilnError(f"{mode} benches the native build only: --target and --isa apply to the pp/tg tests, "
                        "--batch and --profile")
    if a.spec:
        run_spec_bench(a, threads)
        return
    if a.embed:
        run_embed_bench(a, threads)
        return
    if a.profile:
        from ..tools import profile

        p = profile.run_profile(a.model, threads, a.pp, a.pp_depth, a.reps, a.kv_dtype, log=log, **build)
        sys.stdout.write(profile.render(p))
        if a.json:
            write_json(a.json, [], **profile.as_json(p))
        return
    if a.page_sizes:
        from ..tools.bench_batch import render_page_sizes, run_page_size_sweep

        sizes = int_list(a.page_sizes, "--page-sizes", "page sizes, such as 16,32,64,128")
        sweep = run_page_size_sweep(a.model, sizes, [1024, 4096], a.tg, threads, a.reps, a.kv_dtype, log=log)
        sys.stdout.write(render_page_sizes(sweep, str(a.model), threads, a.tg, a.kv_dtype))
        meta["page_sizes"] = {str(k): {str(d): v for d, v in row.items()} for k, row in sweep.items()}
    elif not a.batch_only:
        tests = default_tests(a.pp, a.tg, a.depth, a.pp_depth)
        ik = _ik_runner(a, "llama-bench")
        results = run_bench(a.model, tests, threads, a.reps, a.kv_dtype, log=log, build=build,
                            bandwidth=lambda: read_bandwidth_c(threads, passes=3, log=log), ik=ik)
        engines["llama.cpp"] = {"flags": {"n_batch": 512, "settings": list(results[0].llamacpp_runs)}}
        if ik is not None:
            from ..tools.ik_llama import bench_kv

            engines["ik_llama.cpp"] = {**ik.describe(), "kv_dtype": bench_kv(a.kv_dtype)}
        m = load(a.model, ctx=max(t.depth + t.n_timed for t in tests) + 1, kv_dtype=a.kv_dtype, **build)
        ext = m.compiled.extension
        meta["kernels"] = kernel_set(ext.sanitize, ext.target, ext.isa)
        meta["decode_bytes_per_token"] = decode_bytes_per_token(m)
        meta["decode_kv_bytes_per_token"] = {t.name: decode_kv_bytes_per_token(m, t) for t in tests if t.n_gen}
        meta["read_bandwidth_numpy_gb_s"] = read_bandwidth_numpy(threads)
        ik_note = ("ik_llama.cpp's llama-bench takes no f32 KV cache (its -ctk knows none): ik held f16"
                   if a.kv_dtype == "f32" else "")
        sys.stdout.write(render(results, str(a.model), threads, meta["decode_bytes_per_token"],
                                meta["read_bandwidth_numpy_gb_s"], meta["kernels"], ik_note,
                                meta["decode_kv_bytes_per_token"]))
    if batches:
        from ..tools.bench_batch import render_batch, run_batch_bench

        ik = _ik_runner(a, "llama-batched-bench")
        batched = run_batch_bench(a.model, batches, a.batch_depth, a.tg, threads, a.reps, a.kv_dtype, log=log,
                                  build=build, ik=ik)
        sys.stdout.write(render_batch(batched, str(a.model), threads, a.batch_depth, a.tg, a.kv_dtype))
        meta["batched"] = [{"batch": r.batch, "kiln_tok_s": r.kiln_tok_s, "llamacpp_tok_s": r.llamacpp_tok_s,
                            "ratio": r.ratio, **({"ik_tok_s": r.ik_tok_s, "ik_ratio": r.ik_ratio,
                                                  "ik_flash_attn": r.ik_flash_attn} if r.ik_tok_s else {})}
                           for r in batched]
        meta["batch_depth"] = a.batch_depth
        if ik is not None:
            engines["ik_llama.cpp batched"] = ik.describe()
    if a.json:
        write_json(a.json, results, engines=engines, **meta)


def _ik_runner(a: argparse.Namespace, tool: str):
    """ik_llama.cpp's `tool` as --ik and the kiln target find it, or None (a missing build is one line)."""
    from ..tools import ik_llama

    binary = ik_llama.find(a.ik, tool, a.target, "--ik", log=log)
    return ik_llama.Runner(binary) if binary else None


def run_spec_bench(a: argparse.Namespace, threads: int) -> None:
    """kiln bench --spec: one stream with and without prompt lookup, beside llama.cpp's (tools/bench_spec.py)."""
    from ..tools import bench_spec

    if a.tg < 2:
        raise KilnError(f"--tg must be at least 2 with --spec, got {a.tg}")
    if a.spec_max_draft is not None and not 1 <= a.spec_max_draft <= 64:
        raise KilnError(f"--spec-max-draft must be between 1 and 64, got {a.spec_max_draft}")
    rows = bench_spec.run_spec_bench(a.model, threads, a.tg, a.reps, a.spec_max_draft, log=log, which=a.spec_workloads)
    sys.stdout.write(bench_spec.render(rows, str(a.model), threads, a.tg))
    if a.json:
        from ..tools.bench import write_json

        write_json(a.json, bench_spec.as_json(rows), model=str(a.model), threads=threads, n_gen=a.tg)


def run_embed_bench(a: argparse.Namespace, threads: int) -> None:
    """kiln bench --embed: an embedding model's throughput and query latency beside llama.cpp's."""
    from ..tools import bench_embed

    path = resolve("minilm" if a.model == DEFAULT_MODEL else a.model, log)
    rows = bench_embed.run(path, threads, a.reps, log=log)
    sys.stdout.write(bench_embed.render(rows, str(path), threads))
    if a.json:
        from ..tools.bench import write_json

        write_json(a.json, bench_embed.as_json(rows), model=str(path), threads=threads)


def run_bench_serve(a: argparse.Namespace) -> None:
    from ..runtime import default_threads
    from ..tools import bench_serve

    for flag, value in (("--requests", a.requests), ("--concurrency", a.concurrency), ("--system-words", a.system_words),
                        ("--turns", a.turns)):
        if value < 1:
            raise KilnError(f"{flag} must be at least 1, got {value}")
    from ..tools.bench import write_json

    w = bench_serve.Workload(a.requests, a.concurrency, a.system_words, turns=a.turns)
    threads = a.threads or default_threads()
    binary = None if a.llama_server == "none" else bench_serve.find_llama_server(a.llama_server)
    name = a.model if a.model in BUNDLED else None
    path = resolve(a.model, log)
    if a.embed:
        from ..runtime import load
        from ..runtime.embedding import default_pooling
        from ..tools import bench_serve_embed

        if a.model == DEFAULT_MODEL:
            name, path = "minilm", resolve("minilm", log)
        m = load(path, ctx=512)
        rows = bench_serve_embed.run(path, name or path.stem, a.threads or default_threads(), a.concurrency,
                                     a.llama_server, m.tokenize, m.n_ctx, default_pooling(m), log=log)
        print(bench_serve_embed.render(rows, a.concurrency))
        if a.json:
            write_json(a.json, rows, llama_server=binary, model=str(path), threads=threads, embed=True)
        return
    if a.constrained:
        from ..tools import bench_constrained

        rows = bench_constrained.run(path, name or path.stem, a.threads or default_threads(), a.ctx, a.kv_dtype,
                                     a.llama_server, log=log)
        print(bench_constrained.render(rows))
        if a.json:
            write_json(a.json, rows, llama_server=binary, model=str(path), threads=threads,
                       schema=bench_constrained.SCHEMA)
        return
    from ..tools import ik_llama

    ik = ik_llama.find(a.ik_server, "llama-server", None, "--ik-server", log=log)
    rows = bench_serve.run(path, name or path.stem, w, a.threads or default_threads(), a.ctx, a.kv_dtype,
                           a.llama_server, log=log, spec=a.spec, ik_server=ik, ik_rtr=a.ik_rtr)
    print(bench_serve.render(rows, w))
    if a.spec:
        plain, spec = rows[0], rows[1]
        print(f"kiln serve --spec ngram / kiln serve: output tok/s "
              f"{spec['output_tok_per_s'] / plain['output_tok_per_s']:.2f}x")
    if a.json:
        engines = {"ik_llama.cpp": {"sdist": ik_llama.SDIST, "binary": str(ik), **ik_llama.version(ik)}} if ik else None
        write_json(a.json, rows, llama_server=binary, engines=engines, model=str(path), threads=threads, ctx=a.ctx,
                   kv_dtype=a.kv_dtype, workload=vars(w))


def register(sub) -> None:
    p = sub.add_parser("bench", help="pp/tg/tg-at-depth side by side with llama.cpp (same GGUF, same threads)",
                       epilog="docs: docs/benchmarks.md")
    add_model_argument(p)
    p.add_argument("--synthetic", default=None, metavar="SHAPE",
                   help="instead of MODEL, a model of this shape with random weights and SmolLM2's tokenizer, written "
                        f"once into $KILN_CACHE/synthetic: {', '.join(SHAPES)}")
    p.add_argument("--wtype", default="Q4_0", type=str.upper, choices=list(WTYPES), metavar="TYPE",
                   help=f"with --synthetic: the matmul weights' type, one of {', '.join(WTYPES)} (default Q4_0)")
    p.add_argument("--threads", type=int, default=None, help="threads for both engines (default: all cores)")
    p.add_argument("--kv-dtype", default="f32", help="KV cache dtype for both engines")
    p.add_argument("--reps", type=int, default=5, help="timed repetitions after one warm-up")
    p.add_argument("--pp", type=int, default=512, help="prompt tokens for the pp test")
    p.add_argument("--tg", type=int, default=128, help="generated tokens for the tg tests")
    p.add_argument("--depth", type=int, default=1024, help="tokens already in the cache for the tg@depth test")
    p.add_argument("--pp-depth", type=int, default=0,
                   help="also time the pp test on top of this many cached tokens (with --profile: profile that)")
    p.add_argument("--profile", action="store_true",
                   help="instead, time each kernel of kiln's prefill (a profiling build) against the int8 peak "
                        "that runtime_c/bench/vnni_peak.c measures")
    p.add_argument("--batch", help="also decode B sequences at once for each B of this list (e.g. 1,2,4,8,16), "
                                   "against llama.cpp's batched decode")
    p.add_argument("--batch-depth", type=int, default=128, help="tokens in each sequence before the batched decode")
    p.add_argument("--batch-only", action="store_true", help="run only the batched decode")
    p.add_argument("--page-sizes", help="instead, time kiln's decode at depth 1024 and 4096 for each page size of "
                                        "this list (e.g. 16,32,64,128)")
    p.add_argument("--spec", action="store_true",
                   help="instead, one stream's decode with and without speculative decoding (prompt lookup) on "
                        "three workloads (grounded, code, story; --tg tokens), beside llama.cpp's prompt lookup")
    p.add_argument("--spec-max-draft", type=int, default=None, metavar="K", help="with --spec: drafts a step at most")
    p.add_argument("--spec-workloads", default="default", choices=["default", "tuning", "held-out"],
                   help="with --spec: the docs' four workloads, the passages prompt lookup was tuned on, or the "
                        "texts held out from that tuning (compiler/tools/data/spec_heldout)")
    p.add_argument("--ik", default=None, metavar="PATH|none",
                   help="ik_llama.cpp, the third engine: its bin directory (or one of its tools there), or 'none' "
                        "(default: $KILN_IK_LLAMA, then `make ik-llama`'s build/ik-llama/bin, bin-avx2 with "
                        "--target x86-64-v3; missing, the bench runs without it)")
    add_build_options(p)
    p.add_argument("--embed", action="store_true",
                   help="an embedding model (default: the bundled minilm): 512 documents and a 32-token query, "
                        "inputs a second beside llama.cpp's")
    p.add_argument("--json", help="also write the results here")
    p.set_defaults(run=run_bench)

    p = sub.add_parser("bench-serve", help="a serving workload against kiln serve and llama.cpp's llama-server",
                       epilog="docs: docs/benchmarks.md")
    add_model_argument(p)
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--concurrency", type=int, default=8, help="requests in flight; each server gets as many slots")
    p.add_argument("--system-words", type=int, default=385, help="words of the shared system prompt (~1.3 tokens each)")
    p.add_argument("--turns", type=int, default=1,
                   help="requests come as conversations of this many turns, each the whole history and a new question")
    p.add_argument("--ctx", type=int, default=1024, help="context per sequence, on both servers")
    p.add_argument("--kv-dtype", default="f16", help="KV cache dtype on both servers")
    p.add_argument("--threads", type=int, default=None, help="threads for both servers (default: physical cores)")
    p.add_argument("--llama-server", default=None, help="llama-server binary (default: on PATH or beside python); "
                                                         "'none' runs kiln alone")
    p.add_argument("--ik-server", default="auto", metavar="PATH|auto|none",
                   help="ik_llama.cpp's llama-server (or its bin directory), a third server on the same workload; "
                        "auto (default): $KILN_IK_LLAMA, then `make ik-llama`'s, and none if missing")
    p.add_argument("--ik-rtr", action="store_true", help="run ik's llama-server with run-time repack (-rtr)")
    p.add_argument("--spec", action="store_true",
                   help="also run kiln serve --spec ngram on the same workload (speculative decoding by prompt lookup)")
    p.add_argument("--embed", action="store_true",
                   help="an embedding model (default: the bundled minilm) against llama-server --embedding: 512 "
                        "documents in requests of 8, and a 32-token query's latency")
    p.add_argument("--constrained", action="store_true",
                   help="instead, the per-token cost of a JSON schema at B=1 and B=8 (mixed with free requests) "
                        "against the same requests free")
    p.add_argument("--json", help="also write the results here")
    p.set_defaults(run=run_bench_serve)
