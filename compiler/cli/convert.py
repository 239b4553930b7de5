"""kiln convert: a sentence-transformers BERT folder to a GGUF, as llama.cpp's converter writes it."""
from __future__ import annotations

import argparse
import time
from pathlib import Path

from ..frontend.convert import OUTTYPES, convert
from .common import log


def run(a: argparse.Namespace) -> None:
    start = time.perf_counter()
    out = convert(Path(a.folder), Path(a.output), a.outtype)
    log(f"{a.folder} -> {out} ({a.outtype}, {out.stat().st_size / 1e6:.1f} MB) in {time.perf_counter() - start:.1f} s")
    print(out)


def register(sub) -> None:
    p = sub.add_parser("convert", help="convert a Hugging Face BERT folder (safetensors, tokenizer.json) to GGUF",
                       epilog="docs: docs/retrieval.md")
    p.add_argument("folder", metavar="DIR", help="the model folder: config.json, model.safetensors, tokenizer.json "
                                                  "and, for sentence-transformers, modules.json")
    p.add_argument("-o", "--output", metavar="OUT.gguf", required=True, help="the GGUF to write")
    p.add_argument("--outtype", choices=list(OUTTYPES), default="f16",
                   help="the matrices' type; norms, biases and the small embeddings stay f32 (default f16)")
    p.set_defaults(run=run)
