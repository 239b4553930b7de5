"""compiler.load: compile (or reuse the cached build of) a model and open it."""
from __future__ import annotations

import os

from ..build.targets import check_runs_here
from ..core.errors import OptionError
from ..core.options import CompileOptions
from ..driver import compile_model
from .model import Model


def load(model: str | os.PathLike[str], ctx: int = CompileOptions.ctx, kv_dtype: str = "f32",
         threads: int | None = None, prefill_chunk: int = CompileOptions.prefill_chunk, n_seq: int = 1,
         page_size: int = CompileOptions.page_size, kv_pages: int | None = None, batch_tokens: int | None = None,
         kv_dtype_k: str | None = None, kv_dtype_v: str | None = None, kv_rotation: bool = True,
         target: str = "native", isa: str | None = None, sanitize: bool = False, embedding: bool = False,
         log=lambda s: None) -> Model:
    """Compile `model` (or reuse its cached build) and open one instance of it.

    model          a GGUF path, or a bundled model's name ("smollm2-135m", "gemma3-270m"), fetched on first use
    ctx            context length: the positions each sequence holds (its global layers' KV)
    kv_dtype       the KV cache's element type, K and V: "f32", "f16", "q8_0", "q5_0", "q4_1" or "q4_0"
    kv_dtype_k, kv_dtype_v   K's or V's own type (llama.cpp's -ctk / -ctv); None: kv_dtype
    kv_rotation    hold a quantized K or V in Hadamard blocks of 64, as llama.cpp does (ir/kv.py)
    threads        this instance's thread pool; None: the physical cores this process may use.
                   Any count gives bit-identical logits
    prefill_chunk  tokens of one sequence a prefill step takes (clamped to ctx and batch_tokens)
    n_seq          sequences that can be open at once, sharing the KV pool (m.sequence())
    page_size      positions per KV page (a multiple of 8)
    kv_pages       pages in the full-context pool; None: enough for n_seq x ctx
    batch_tokens   rows one step takes (m.step); None: the prefill chunk
    target         the CPU the C is built for: "native", an x86-64 level ("x86-64", "x86-64-v2",
                   "x86-64-v3", "x86-64-v4"), "avx512-vnni" or "amx" (build/targets.py); every target gives
                   the same logits. One this CPU cannot run is refused, naming the features it lacks
    isa            extensions of the target to leave out, e.g. "no-amx" or "no-amx,no-avx512" (AVX2 is
                   then the widest); None: $KILN_ISA, else none. Any path can so be measured on one CPU
    sanitize       build with AddressSanitizer and UBSan (for tests)
    embedding      steps return hidden states for m.embed / m.rerank, not logits (an encoder, such as
                   a bert GGUF, always does); its LM head is not read
    log            a callable taking progress messages, or a core.progress.Progress

    Bad options raise OptionError naming the option; a foreign or unsupported GGUF raises
    ModelFileError naming the file and what is wrong with it.
    """
    opts = CompileOptions(ctx=ctx, kv_dtype=kv_dtype, prefill_chunk=prefill_chunk, n_seq=n_seq, page_size=page_size,
                          kv_pages=kv_pages, batch_tokens=batch_tokens, kv_dtype_k=kv_dtype_k, kv_dtype_v=kv_dtype_v,
                          kv_rotation=kv_rotation, embedding=embedding)
    return load_options(model, opts, threads, sanitize, log, target=target, isa=isa)


def load_options(model: str | os.PathLike[str], opts: CompileOptions, threads: int | None = None,
                 sanitize: bool = False, log=lambda s: None, profile: bool = False, target: str = "native",
                 isa: str | None = None) -> Model:
    """`load` with the options already checked (the CLI builds them once for every command)."""
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise OptionError(f"threads must be a positive integer, got {threads!r}")
    check_runs_here(target)  # before any work: a build this CPU cannot run is refused by what it lacks
    return Model(compile_model(model, opts, sanitize, log, profile, target, isa), threads=threads)
