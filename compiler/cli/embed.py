"""kiln embed: one JSON vector a line for each input of a file (a line of text each, or with
--jsonl one JSON string each), as Model.embed computes them."""
from __future__ import annotations

import argparse
import json
import sys

from ..core.errors import KilnError
from ..runtime.embedding import MAX_NORM, POOLING
from .common import add_build_options, add_model_options, add_threads, load, options, read_text


def inputs(a: argparse.Namespace) -> list[str]:
    text, path = read_text(a.file, None, "-f")
    if not a.jsonl:
        lines = [line for line in text.splitlines() if line.strip()]
    else:
        lines = []
        for k, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
            except json.JSONDecodeError as e:
                raise KilnError(f"-f {path}: line {k} is not JSON ({e.msg}); --jsonl reads one JSON string a line") \
                    from None
            if not isinstance(item, str) or not item:
                raise KilnError(f"-f {path}: line {k} is not a non-empty JSON string")
            lines.append(item)
    if not lines:
        raise KilnError(f"-f {path}: no input in it")
    return lines


def run(a: argparse.Namespace) -> None:
    texts = inputs(a)
    m = load(a, options(a))
    vectors = m.embed(texts, pooling=a.pooling, normalize=a.normalize, dimensions=a.dimensions)
    out = sys.stdout
    for v in vectors:
        out.write(json.dumps(v.tolist()) + "\n")


def register(sub) -> None:
    p = sub.add_parser("embed", help="embed each line of a file: one JSON vector a line (an embedding model)",
                       epilog="docs: docs/retrieval.md")
    add_model_options(p)
    add_build_options(p)
    p.add_argument("-f", "--file", required=True, help="the inputs: a line of text each (--jsonl: a JSON string each)")
    p.add_argument("--jsonl", action="store_true", help="read one JSON string a line (texts may hold newlines)")
    p.add_argument("--pooling", choices=[k for k in POOLING if k != "rank"], default=None,
                   help="how a text's token vectors become one (default: the model file's pooling_type); "
                        "none writes a list of vectors a text")
    p.add_argument("--normalize", type=int, default=2, metavar=f"-1..{MAX_NORM}",
                   help="llama.cpp's --embd-normalize: -1 none, 0 max-abs (int16), 1 taxicab, 2 Euclidean (default), p")
    p.add_argument("--dimensions", type=int, default=None,
                   help="keep the first N dimensions, then normalize (Matryoshka models)")
    add_threads(p)
    p.set_defaults(run=run)
