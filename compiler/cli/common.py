"""What the commands share: messages, progress, the model and sampling options, loading."""
from __future__ import annotations

import argparse
import sys
from contextlib import contextmanager
from pathlib import Path

from ..core.dtypes import KV_DTYPES
from ..core.errors import KilnError
from ..core.options import CompileOptions
from ..frontend.registry import DEFAULT_MODEL
from ..runtime.sampling import DEFAULTS


def log(msg: str) -> None:
    print(f"kiln: {msg}", file=sys.stderr)


@contextmanager
def progress(every_stage: bool):
    """The stages of making a model ready, shown on standard error (core/progress.py): all of them
    (kiln compile), or only when one does real work (run, serve, chat: a cached start is quiet)."""
    from ..core.progress import reporter

    p = reporter(every_stage)
    try:
        yield p
    finally:
        p.close()


def load(a: argparse.Namespace, opts: CompileOptions):
    from ..runtime import load_options

    with progress(every_stage=False) as p:
        return load_options(a.model, opts, a.threads, log=p, target=a.target, isa=a.isa)


def add_model_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", nargs="?", default=DEFAULT_MODEL,
                   help=f"GGUF path or bundled model name (default {DEFAULT_MODEL})")


def add_model_options(p: argparse.ArgumentParser, n_seq: int = 1) -> None:
    add_model_argument(p)
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
    p.add_argument("--embedding", action="store_true",
                   help="steps return hidden states for embeddings and reranking, not logits (an encoder always does)")


def add_build_options(p: argparse.ArgumentParser) -> None:
    from ..build.targets import ISA_OFF, TARGETS

    p.add_argument("--target", default="native", choices=list(TARGETS),
                   help="the CPU to build for (default: this one); every target gives the same logits")
    p.add_argument("--isa", default=None, metavar="|".join(ISA_OFF),
                   help="leave extensions of the target out, comma-separated (default: $KILN_ISA): every path "
                        "can be measured on one CPU")


def add_threads(p: argparse.ArgumentParser, help: str = "threads (default: physical cores)") -> None:
    p.add_argument("--threads", type=int, default=None, help=help)


def add_sampling_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--temp", type=float, default=DEFAULTS.temperature, help="temperature; 0 is greedy")
    p.add_argument("--top-k", type=int, default=DEFAULTS.top_k)
    p.add_argument("--top-p", type=float, default=DEFAULTS.top_p)
    p.add_argument("--min-p", type=float, default=DEFAULTS.min_p)
    p.add_argument("--repeat-penalty", type=float, default=DEFAULTS.repeat_penalty)
    p.add_argument("--seed", type=int, default=None)


def add_shift_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--context-shift", action="store_true",
                   help="when a sequence fills its context, drop half of it after the sinks and go on "
                        "(StreamingLLM; llama.cpp's --context-shift) instead of stopping")
    p.add_argument("--keep", type=int, default=4,
                   help="attention sinks a context shift keeps (plus the BOS token, as llama.cpp does)")


def add_spec_options(p: argparse.ArgumentParser, draft: bool = True) -> None:
    """Speculative decoding (runtime/speculation.py): the output is what plain decoding gives."""
    p.add_argument("--spec", choices=["ngram", "draft"] if draft else ["ngram"], default=None,
                   help="speculative decoding: ngram drafts by prompt lookup" +
                        (", draft by a draft model (--draft)" if draft else ""))
    if draft:
        p.add_argument("--draft", default=None, metavar="MODEL",
                       help="the draft model for --spec draft (GGUF path or bundled name): a smaller model with "
                            "this model's token list")
    p.add_argument("--spec-max-draft", type=int, default=None, metavar="K",
                   help="tokens drafted for one sequence in a step at most (default 16, or the step's rows - 1)")


def speculation(a: argparse.Namespace, m) -> dict:
    """The generate() keywords --spec asks for, the draft model loaded (with the target's cache
    options) and everything checked, with the flags' names in the errors."""
    from ..runtime.speculation import MAX_DRAFT_LIMIT, Speculation

    draft_name = getattr(a, "draft", None)
    if a.spec is None and (draft_name or a.spec_max_draft is not None):
        raise KilnError("--draft and --spec-max-draft need --spec")
    if a.spec is None:
        return {}
    if a.spec_max_draft is not None and not 1 <= a.spec_max_draft <= min(MAX_DRAFT_LIMIT, m.options.batch_tokens - 1):
        raise KilnError(f"--spec-max-draft must be between 1 and {min(MAX_DRAFT_LIMIT, m.options.batch_tokens - 1)} "
                        f"(a step takes {m.options.batch_tokens} rows, --batch-tokens), got {a.spec_max_draft}")
    if (a.spec == "draft") != bool(draft_name):
        raise KilnError("--spec draft needs --draft MODEL" if draft_name is None
                        else "--draft is used only with --spec draft")
    draft = None
    if draft_name:
        from ..runtime import load_options

        with progress(every_stage=False) as p:
            draft = load_options(draft_name, m.options, a.threads, log=p, target=a.target, isa=a.isa)
    Speculation.of(m, a.spec, draft, a.spec_max_draft)  # the token lists are compared here
    return {"speculative": a.spec, "draft_model": draft, "max_draft": a.spec_max_draft}


def check_keep(a: argparse.Namespace) -> None:
    if not 0 <= a.keep < a.ctx:
        raise KilnError(f"--keep must be between 0 and ctx - 1 = {a.ctx - 1}, got {a.keep}")


def options(a: argparse.Namespace) -> CompileOptions:
    return CompileOptions(ctx=a.ctx, kv_dtype=a.kv_dtype, prefill_chunk=a.prefill_chunk, n_seq=a.n_seq,
                          page_size=a.page_size, kv_pages=a.kv_pages, batch_tokens=a.batch_tokens,
                          kv_dtype_k=a.kv_dtype_k, kv_dtype_v=a.kv_dtype_v, kv_rotation=not a.no_kv_rotation,
                          embedding=getattr(a, "embedding", False))


def read_text(given: str | None, default: Path | None, option: str = "--text") -> tuple[str, Path]:
    """The file an option names (or the default one) as UTF-8, and its path."""
    path = Path(given) if given else default
    try:
        return path.read_text(encoding="utf-8"), path
    except (OSError, UnicodeDecodeError) as e:
        reason = e.strerror if isinstance(e, OSError) else f"not UTF-8 text ({e.reason} at byte {e.start})"
        raise KilnError(f"{option} {path}: cannot read it ({reason})") from None


def int_list(text: str, option: str, what: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise KilnError(f"{option} takes comma-separated positive {what}; got {text!r}")
    return values
