"""The `kiln` command line. Every expected failure is a KilnError: one line on stderr, exit 1."""
from __future__ import annotations

import argparse
import sys
from contextlib import contextmanager

from ..core.version import __version__
from ..core.dtypes import KV_DTYPES
from ..core.errors import KilnError
from ..ir.graph import Mode, format_graph
from ..core.options import CompileOptions
from ..driver import plan
from ..planner.reports.text import render_json, render_text
from ..frontend.registry import BUNDLED, DEFAULT_MODEL, cache_dir, fetch, is_cached, lookup, model_path


def _log(msg: str) -> None:
    print(f"kiln: {msg}", file=sys.stderr)


@contextmanager
def _progress(every_stage: bool):
    """The stages of making a model ready, shown on standard error (progress.py): all of them
    (kiln compile), or only when one does real work (run, serve, chat: a cached start is quiet)."""
    from ..core.progress import reporter

    p = reporter(every_stage)
    try:
        yield p
    finally:
        p.close()


def _load(a: argparse.Namespace, opts: CompileOptions):
    from ..runtime.model import load_options

    with _progress(every_stage=False) as p:
        return load_options(a.model, opts, a.threads, log=p)


def _add_model_options(p: argparse.ArgumentParser, with_mode: bool = False, n_seq: int = 1) -> None:
    p.add_argument("model", nargs="?", default=DEFAULT_MODEL,
                   help=f"GGUF path or bundled model name (default {DEFAULT_MODEL})")
    p.add_argument("--ctx", type=int, default=CompileOptions.ctx, help="context length in tokens")
    p.add_argument("--kv-dtype", default="f32", help=f"KV cache dtype of K and V: {', '.join(KV_DTYPES)}")
    p.add_argument("--kv-dtype-k", "-ctk", default=None, help="K's dtype, if not --kv-dtype (llama.cpp's -ctk)")
    p.add_argument("--kv-dtype-v", "-ctv", default=None, help="V's dtype, if not --kv-dtype (llama.cpp's -ctv)")
    p.add_argument("--no-kv-rotation", action="store_true",
                   help="hold a quantized K/V as it is, not in Hadamard blocks (llama.cpp's LLAMA_ATTN_ROT_DISABLE=1)")
    p.add_argument("--prefill-chunk", type=int, default=CompileOptions.prefill_chunk,
                   help="tokens per prefill step")
    p.add_argument("--n-seq", type=int, default=n_seq, help="sequences live at once, sharing the KV pool")
    p.add_argument("--page-size", type=int, default=CompileOptions.page_size, help="positions per KV page")
    p.add_argument("--kv-pages", type=int, default=None,
                   help="pages in the full-context KV pool (default: enough for n-seq x ctx)")
    p.add_argument("--batch-tokens", type=int, default=None, help="rows one step takes (default: the prefill chunk)")
    if with_mode:
        p.add_argument("--mode", choices=[m.value for m in Mode], default=Mode.DECODE.value,
                       help="which step graph to show")


def _add_sampling_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--temp", type=float, default=0.8, help="temperature; 0 is greedy")
    p.add_argument("--top-k", type=int, default=40)
    p.add_argument("--top-p", type=float, default=0.95)
    p.add_argument("--min-p", type=float, default=0.05)
    p.add_argument("--repeat-penalty", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=None)


def _add_shift_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--context-shift", action="store_true",
                   help="when a sequence fills its context, drop half of it after the sinks and go on "
                        "(StreamingLLM; llama.cpp's --context-shift) instead of stopping")
    p.add_argument("--keep", type=int, default=4,
                   help="attention sinks a context shift keeps (plus the BOS token, as llama.cpp does)")


def _check_keep(a: argparse.Namespace) -> None:
    if not 0 <= a.keep < a.ctx:
        raise KilnError(f"--keep must be between 0 and ctx - 1 = {a.ctx - 1}, got {a.keep}")


def _options(a: argparse.Namespace) -> CompileOptions:
    return CompileOptions(ctx=a.ctx, kv_dtype=a.kv_dtype, prefill_chunk=a.prefill_chunk, n_seq=a.n_seq,
                          page_size=a.page_size, kv_pages=a.kv_pages, batch_tokens=a.batch_tokens,
                          kv_dtype_k=a.kv_dtype_k, kv_dtype_v=a.kv_dtype_v, kv_rotation=not a.no_kv_rotation)


def cmd_models(a: argparse.Namespace) -> None:
    if a.action == "fetch":
        names = list(BUNDLED) if a.all else a.names
        if not names:
            raise KilnError("models fetch: name a model or pass --all")
        for name in names:
            m = lookup(name)
            was_cached = is_cached(m)
            with _progress(every_stage=True) as p, p.stage("fetch"):
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


def cmd_layout(a: argparse.Namespace) -> None:
    p = plan(a.model, _options(a), Mode(a.mode), _log)
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


def cmd_compile(a: argparse.Namespace) -> None:
    import shutil
    from pathlib import Path

    from ..build.cc import RUNTIME_DIR, build_c_library
    from ..runtime.model import compile_model
    from ..planner.reports.text import render_text

    if a.c_lib and not a.output:
        raise KilnError("--c-lib writes a directory: give it with -o DIR")
    with _progress(every_stage=True) as p:
        c = compile_model(a.model, _options(a), log=p)
        lib = Path(c.module.__file__)
        if a.c_lib:  # the same C, built by cc alone: no cffi, no Python
            with p.stage("cc -shared"):
                lib = build_c_library(c.c_source, (RUNTIME_DIR / "status.h", c.source_dir / "model.h"), p)
                p.note(str(lib))
    if not a.output:
        print(lib)
        return
    out = Path(a.output)
    out.mkdir(parents=True, exist_ok=True)
    texts = {"model.c": c.source.model_c, "model.h": c.source.model_h,
             "layout_decode.txt": render_text(c.decode.layout), "layout_prefill.txt": render_text(c.prefill.layout)}
    copies = [lib] + ([c.packed_path] if c.packed_path else [])  # kiln_open(..., packed_path, ...) maps it
    if a.c_lib:
        copies.append(RUNTIME_DIR / "status.h")  # model.h includes it
        texts["examples/c/generate.c"] = (RUNTIME_DIR / "examples" / "generate.c").read_text()
    for name, text in texts.items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_text(text)
    for path in copies:
        shutil.copy2(path, out / path.name)
    print(f"{out}: {', '.join([*texts, *(p.name for p in copies)])}")
    if a.c_lib:
        packed = c.packed_path.name if c.packed_path else "-"
        print(f"build the example:  cd {out} && cc -O2 -I. examples/c/generate.c -L. -lkiln_model "
              f"-Wl,-rpath,'$ORIGIN' -o generate\n"
              f"run it:             kiln tokenize {a.model} -p 'Once upon a time' > prompt.ids && "
              f"./generate {c.decode.spec.path} prompt.ids 32 {packed} | kiln detokenize {a.model}")


def _tokenizer(model: str):
    from ..frontend.gguf_reader import read_model
    from ..frontend.registry import resolve
    from ..text.tokenizer import make_tokenizer

    spec = read_model(resolve(model, _log))
    return spec, make_tokenizer(spec.tokenizer, str(spec.path))


def _input_text(a: argparse.Namespace) -> str:
    """-p TEXT, -f FILE, or standard input."""
    if a.prompt is not None:
        return a.prompt
    if a.file:
        return _read_text(a.file, None, "--file")[0]
    return sys.stdin.read()


def cmd_tokenize(a: argparse.Namespace) -> None:
    _, tok = _tokenizer(a.model)
    ids = tok.tokenize(_input_text(a), add_special=not a.no_bos, parse_special=not a.no_parse_special)
    if a.pieces:  # llama-tokenize's view: one token a line
        for i in ids:
            print(f"{i:>6} -> {tok.token_bytes(i, True).decode('utf-8', errors='replace')!r}")
    else:
        print(" ".join(map(str, ids)))


def cmd_detokenize(a: argparse.Namespace) -> None:
    spec, tok = _tokenizer(a.model)
    words = _input_text(a).split()
    n_vocab = len(spec.tokenizer.tokens)
    ids = []
    for i, w in enumerate(words):
        try:
            t = int(w)
        except ValueError:
            t = -1
        if not 0 <= t < n_vocab:
            raise KilnError(f"detokenize: item {i} ({w!r}) is not a token id in [0, {n_vocab}) of {spec.path.name}")
        ids.append(t)
    sys.stdout.write(tok.detokenize(ids, special=a.special) + "\n")


def cmd_run(a: argparse.Namespace) -> None:
    from ..text.chat import render_chat
    from ..frontend.gguf_reader import read_model
    from ..frontend.registry import resolve

    o = _options(a)
    _check_keep(a)
    prompt = a.prompt
    if a.chat:  # before compiling, so that a model with no template fails at once
        prompt = render_chat(read_model(resolve(a.model, _log)), [{"role": "user", "content": a.prompt}])
    m = _load(a, o)
    ids = m.prompt_ids(prompt)  # tokenized and checked against the context before any output
    if not a.chat:
        sys.stdout.write(a.prompt)
    for piece in m.generate(ids, max_tokens=a.n, temperature=a.temp, top_k=a.top_k, top_p=a.top_p,
                            min_p=a.min_p, repeat_penalty=a.repeat_penalty, seed=a.seed, stream=True,
                            context_shift=a.context_shift, n_keep=a.keep):
        sys.stdout.write(piece)
        sys.stdout.flush()
    sys.stdout.write("\n")


def cmd_chat(a: argparse.Namespace) -> None:
    from ..text.chat import chat_template
    from ..runtime.conversation import ChatSession, repl
    from ..frontend.gguf_reader import read_model
    from ..frontend.registry import resolve
    from ..runtime.sampling import SamplingParams

    if a.n < 1:
        raise KilnError(f"-n must be at least 1, got {a.n}")
    template = chat_template(read_model(resolve(a.model, _log)))  # before compiling: no template fails at once
    m = _load(a, _options(a))
    session = ChatSession(m, SamplingParams(a.temp, a.top_k, a.top_p, a.min_p, a.repeat_penalty, seed=a.seed), a.n)
    session.system = a.system or ""
    repl(session, f"kiln chat: {m.path.name}, ctx {m.n_ctx}, chat template from {template.origin}. "
                  "/help for commands, Ctrl-C stops a reply, Ctrl-D leaves.")


def cmd_serve(a: argparse.Namespace) -> None:
    import uvicorn

    from ..frontend.registry import BUNDLED
    from ..serving.engine import Engine
    from ..serving.server import create_app

    if not 1 <= a.port <= 65535:
        raise KilnError(f"--port must be between 1 and 65535, got {a.port}")
    if a.max_queue < 1:
        raise KilnError(f"--max-queue must be at least 1, got {a.max_queue}")
    o = _options(a)
    _check_keep(a)
    slot_dir = None
    if a.slot_save_path:
        from pathlib import Path
        slot_dir = Path(a.slot_save_path)
        if not slot_dir.is_dir():
            raise KilnError(f"--slot-save-path {slot_dir}: not a directory; create it first")
    m = _load(a, o)
    name = a.alias or (a.model if a.model in BUNDLED else m.path.stem)
    engine = Engine(m, max_queue=a.max_queue, prefix_cache=not a.no_prefix_cache, context_shift=a.context_shift,
                    n_keep=a.keep).start()
    stats = m.kv_stats()
    _log(f"serving '{name}' on http://{a.host}:{a.port}/v1: {o.n_seq} sequences, ctx {m.n_ctx}, "
         f"{stats['pages_total']} KV pages of {o.page_size} positions, {m.n_threads} threads")
    try:
        uvicorn.run(create_app(engine, name, api_key=a.api_key, slot_save_path=slot_dir), host=a.host, port=a.port,
                    log_level=a.log_level, timeout_graceful_shutdown=2)
    finally:
        engine.stop()


def cmd_bench_serve(a: argparse.Namespace) -> None:
    import json

    from ..tools import bench_serve
    from ..runtime.model import default_threads
    from ..frontend.registry import resolve

    for flag, value in (("--requests", a.requests), ("--concurrency", a.concurrency), ("--system-words", a.system_words)):
        if value < 1:
            raise KilnError(f"{flag} must be at least 1, got {value}")
    w = bench_serve.Workload(a.requests, a.concurrency, a.system_words)
    name = a.model if a.model in BUNDLED else None
    path = resolve(a.model, _log)
    rows = bench_serve.run(path, name or path.stem, w, a.threads or default_threads(), a.ctx, a.kv_dtype,
                           a.llama_server, log=_log)
    print(bench_serve.render(rows, w))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"workload": vars(w), "results": rows}, f, indent=2)


def _read_text(given: str | None, default, option: str = "--text"):
    """The file an option names (or the default one) as UTF-8, and its path."""
    from pathlib import Path

    path = Path(given) if given else default
    try:
        return path.read_text(encoding="utf-8"), path
    except (OSError, UnicodeDecodeError) as e:
        reason = e.strerror if isinstance(e, OSError) else f"not UTF-8 text ({e.reason} at byte {e.start})"
        raise KilnError(f"{option} {path}: cannot read it ({reason})") from None


def cmd_kv_quality(a: argparse.Namespace) -> None:
    import json
    from dataclasses import asdict

    from ..tools.kv_quality import DEFAULT_TEXT, measure, parse_pair, render

    dtypes = [d for d in a.kv_dtype.split(",") if d.strip()]
    for d in dtypes:
        parse_pair(d)  # an unknown dtype fails before anything is compiled
    text, path = _read_text(a.text, DEFAULT_TEXT)
    rows = measure(a.model, dtypes, text, ctx=a.ctx, prefill_chunk=a.prefill_chunk, llamacpp=a.llamacpp, log=_log)
    if a.json:
        print(json.dumps([asdict(r) for r in rows], indent=1))
    else:
        sys.stdout.write(render(rows, str(a.model), str(path)))


def cmd_perplexity(a: argparse.Namespace) -> None:
    import json
    from dataclasses import replace

    from ..tools import perplexity

    if a.mode == "stream" and not 1 <= a.batch <= a.ctx // 2:
        raise KilnError(f"--batch must be between 1 and ctx / 2 = {a.ctx // 2}, got {a.batch}")
    if a.discard is not None and not 1 <= a.discard < a.ctx:
        raise KilnError(f"--discard must be between 1 and ctx - 1 = {a.ctx - 1}, got {a.discard}")
    text, path = _read_text(a.text, perplexity.DEFAULT_TEXT)
    source = str(path) if a.text else perplexity.DEFAULT_TEXT_SOURCE
    o = _options(a)
    if a.mode == "chunks":  # one chunk a step, with every row's logits
        o = replace(o, prefill_chunk=min(o.ctx, 512), batch_tokens=min(o.ctx, 512))
    m = _load(a, o)
    r = perplexity.measure(m, text, a.mode, a.sinks, a.batch, a.discard, a.policy)
    if a.json:
        print(json.dumps({"model": str(a.model), "text": source, **r.as_json()}))
    else:
        sys.stdout.write(perplexity.render([r], str(a.model), source))


def cmd_bench(a: argparse.Namespace) -> None:
    from ..tools.bench import decode_bytes_per_token, default_tests, read_bandwidth_gb_s, render, run_bench, write_json
    from ..runtime.model import default_threads, load

    threads = a.threads or default_threads()
    if threads < 1 or a.reps < 1:
        raise KilnError("--threads and --reps must be at least 1")
    batches = _batch_sizes(a.batch) if a.batch else []
    meta: dict = {"model": str(a.model), "threads": threads, "kv_dtype": a.kv_dtype}
    results = []
    if a.pp_depth < 0 or a.pp < 1:
        raise KilnError("--pp must be at least 1 and --pp-depth at least 0")
    if a.profile:
        import json

        from ..tools import profile

        p = profile.run_profile(a.model, threads, a.pp, a.pp_depth, a.reps, a.kv_dtype, log=_log)
        sys.stdout.write(profile.render(p))
        if a.json:
            with open(a.json, "w") as f:
                json.dump(profile.as_json(p), f, indent=1)
        return
    if a.page_sizes:
        from ..tools.bench_batch import render_page_sizes, run_page_size_sweep

        sizes = _int_list(a.page_sizes, "--page-sizes", "page sizes, such as 16,32,64,128")
        sweep = run_page_size_sweep(a.model, sizes, [1024, 4096], a.tg, threads, a.reps, a.kv_dtype, log=_log)
        sys.stdout.write(render_page_sizes(sweep, str(a.model), threads, a.tg, a.kv_dtype))
        meta["page_sizes"] = {str(k): {str(d): v for d, v in row.items()} for k, row in sweep.items()}
    elif not a.batch_only:
        tests = default_tests(a.pp, a.tg, a.depth, a.pp_depth)
        results = run_bench(a.model, tests, threads, a.reps, a.kv_dtype, log=_log)
        m = load(a.model, ctx=max(t.depth + t.n_timed for t in tests) + 1, kv_dtype=a.kv_dtype)
        meta["decode_bytes_per_token"], meta["read_bandwidth_gb_s"] = decode_bytes_per_token(m), read_bandwidth_gb_s(threads)
        sys.stdout.write(render(results, str(a.model), threads, meta["decode_bytes_per_token"],
                                meta["read_bandwidth_gb_s"]))
    if batches:
        from ..tools.bench_batch import render_batch, run_batch_bench

        batched = run_batch_bench(a.model, batches, a.batch_depth, a.tg, threads, a.reps, a.kv_dtype, log=_log)
        sys.stdout.write(render_batch(batched, str(a.model), threads, a.batch_depth, a.tg, a.kv_dtype))
        meta["batched"] = [{"batch": r.batch, "kiln_tok_s": r.kiln_tok_s, "llamacpp_tok_s": r.llamacpp_tok_s,
                            "ratio": r.ratio} for r in batched]
        meta["batch_depth"] = a.batch_depth
    if a.json:
        write_json(a.json, results, **meta)


def _int_list(text: str, option: str, what: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise KilnError(f"{option} takes comma-separated positive {what}; got {text!r}")
    return values


def _batch_sizes(text: str) -> list[int]:
    return _int_list(text, "--batch", "sequence counts, such as 1,2,4,8")


def cmd_ir(a: argparse.Namespace) -> None:
    p = plan(a.model, _options(a), Mode(a.mode), _log)
    sys.stdout.write(format_graph(p.graph))


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="kiln", description="Ahead-of-time compiler for CPU LLM inference.")
    ap.add_argument("--version", action="version", version=f"kiln {__version__}")
    sub = ap.add_subparsers(dest="command", required=True)

    p = sub.add_parser("models", help="list or fetch the bundled models")
    p.add_argument("action", nargs="?", choices=["list", "fetch"], default="list")
    p.add_argument("names", nargs="*", help="models to fetch")
    p.add_argument("--all", action="store_true", help="fetch every bundled model")
    p.add_argument("-v", "--verbose", action="store_true", help="show cache paths and checksums")
    p.set_defaults(run=cmd_models)

    p = sub.add_parser("layout", help="print the planned memory layout")
    _add_model_options(p, with_mode=True)
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="emit JSON instead of the text map")
    fmt.add_argument("--html", metavar="FILE", help="write the map drawn to scale as one self-contained HTML page")
    p.set_defaults(run=cmd_layout)

    p = sub.add_parser("compile", help="generate C, build the shared library (cached), optionally copy it out")
    _add_model_options(p)
    p.add_argument("-o", "--output", help="directory to keep model.c, model.h, the layout maps and the library")
    p.add_argument("--c-lib", action="store_true",
                   help="build a plain C library instead of the Python extension: -o DIR gets libkiln_model.so, "
                        "model.h, status.h and examples/c/generate.c")
    p.add_argument("--threads", type=int, default=None,
                   help="accepted for scripts; threads are chosen when the library is loaded (kiln run --threads)")
    p.set_defaults(run=cmd_compile)

    for name, helptext in (("tokenize", "text to token ids, space-separated on one line (as examples/c/generate.c "
                                         "reads them)"),
                           ("detokenize", "token ids (whitespace-separated) to text")):
        p = sub.add_parser(name, help=helptext)
        p.add_argument("model", nargs="?", default=DEFAULT_MODEL, help="GGUF path or bundled model name")
        src = p.add_mutually_exclusive_group()
        src.add_argument("-p", "--prompt", help="the text (tokenize) or ids (detokenize); default: standard input")
        src.add_argument("-f", "--file", help="read it from this file")
        if name == "tokenize":
            p.add_argument("--no-bos", action="store_true", help="do not add the BOS token the GGUF asks for")
            p.add_argument("--no-parse-special", action="store_true",
                           help="read special-token text such as <|im_start|> as plain text")
            p.add_argument("--pieces", action="store_true", help="one 'id -> piece' a line (llama-tokenize's view)")
            p.set_defaults(run=cmd_tokenize)
        else:
            p.add_argument("--special", action="store_true", help="render special tokens as their text")
            p.set_defaults(run=cmd_detokenize)

    p = sub.add_parser("run", help="generate text, streaming it (the model is compiled on first use, then cached)")
    _add_model_options(p)
    p.add_argument("-p", "--prompt", required=True, help="the prompt text")
    p.add_argument("-n", type=int, default=128, help="tokens to generate at most")
    _add_sampling_options(p)
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the chat template: the GGUF's own, or the architecture's built-in one")
    p.add_argument("--threads", type=int, default=None, help="threads (default: physical cores)")
    _add_shift_options(p)
    p.set_defaults(run=cmd_run)

    p = sub.add_parser("chat", help="an interactive conversation in the model's chat template; each turn "
                                    "prefills only the new message")
    _add_model_options(p)
    _add_sampling_options(p)
    p.add_argument("-n", type=int, default=512, help="tokens a reply may take at most")
    p.add_argument("--system", default=None, help="the system message to start with (/system changes it)")
    p.add_argument("--threads", type=int, default=None, help="threads (default: physical cores)")
    p.set_defaults(run=cmd_chat)

    p = sub.add_parser("serve", help="an OpenAI-compatible HTTP server with continuous batching and a prefix cache")
    _add_model_options(p, n_seq=8)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on /v1")
    p.add_argument("--alias", default=None, help="the model's name in the API (default: the bundled name or file stem)")
    p.add_argument("--max-queue", type=int, default=256, help="waiting requests before 503 Retry-After")
    p.add_argument("--no-prefix-cache", action="store_true", help="do not share prompt prefixes across requests")
    p.add_argument("--threads", type=int, default=None, help="threads (default: physical cores)")
    p.add_argument("--log-level", default="warning", choices=["critical", "error", "warning", "info", "debug"])
    p.add_argument("--slot-save-path", default=None,
                   help="directory for POST /slots/{id}?action=save|restore (llama-server's); off without it")
    _add_shift_options(p)
    p.set_defaults(run=cmd_serve)

    p = sub.add_parser("bench-serve", help="a serving workload against kiln serve and llama.cpp's llama-server")
    p.add_argument("model", nargs="?", default=DEFAULT_MODEL, help="GGUF path or bundled model name")
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--concurrency", type=int, default=8, help="requests in flight; each server gets as many slots")
    p.add_argument("--system-words", type=int, default=385, help="words of the shared system prompt (~1.3 tokens each)")
    p.add_argument("--ctx", type=int, default=1024, help="context per sequence, on both servers")
    p.add_argument("--kv-dtype", default="f16", help="KV cache dtype on both servers")
    p.add_argument("--threads", type=int, default=None, help="threads for both servers (default: physical cores)")
    p.add_argument("--llama-server", default=None, help="llama-server binary (default: on PATH or beside python); "
                                                         "'none' runs kiln alone")
    p.add_argument("--json", help="also write the results here")
    p.set_defaults(run=cmd_bench_serve)

    p = sub.add_parser("kv-quality", help="KL and top-1 of each KV dtype against the f32 cache, and the bytes saved")
    p.add_argument("model", nargs="?", default=DEFAULT_MODEL, help="GGUF path or bundled model name")
    p.add_argument("--kv-dtype", default="f16,q8_0",
                   help="comma-separated dtypes to measure, K/V for a pair such as q8_0/q4_0 (default f16,q8_0)")
    p.add_argument("--llamacpp", action="store_true",
                   help="measure llama.cpp's caches of the same types too, against its own f32 cache")
    p.add_argument("--text", help="text file to read (default: a built-in text of about 1,500 tokens)")
    p.add_argument("--ctx", type=int, default=CompileOptions.ctx, help="context; the text is cut to it")
    p.add_argument("--prefill-chunk", type=int, default=CompileOptions.prefill_chunk)
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=cmd_kv_quality)

    p = sub.add_parser("perplexity", help="perplexity of a text: llama-perplexity's chunks, or streamed through "
                                          "a fixed cache with context shift")
    _add_model_options(p)
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
    p.add_argument("--threads", type=int, default=None, help="threads (default: physical cores)")
    p.add_argument("--json", action="store_true", help="one JSON object: mode, ctx, sinks, kv_dtype_k, "
                                                       "kv_dtype_v, n_scored, ppl, nll, n_shifts, model, text")
    p.set_defaults(run=cmd_perplexity)

    p = sub.add_parser("bench", help="pp/tg/tg-at-depth side by side with llama.cpp (same GGUF, same threads)")
    p.add_argument("model", nargs="?", default=DEFAULT_MODEL, help="GGUF path or bundled model name")
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
    p.add_argument("--json", help="also write the results here")
    p.set_defaults(run=cmd_bench)

    p = sub.add_parser("ir", help="print the IR after all passes")
    _add_model_options(p, with_mode=True)
    p.set_defaults(run=cmd_ir)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        args.run(args)
    except KilnError as e:
        print(f"kiln: error: {e}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        return 0
    except KeyboardInterrupt:  # Ctrl-C outside a chat reply: leave quietly, as a shell command does
        print(file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
