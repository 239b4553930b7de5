"""kiln tokenize and kiln detokenize: text to token ids and back, with no model compiled; a
vocab-only GGUF (llama.cpp's ggml-vocab-*.gguf) is enough. `--jsonl` lets another tool check
kiln's tokenizer line by line without importing kiln."""
from __future__ import annotations

import argparse
import json
import sys

from ..core.errors import KilnError
from ..frontend.gguf_reader import read_vocab
from ..frontend.registry import resolve
from ..text.tokenizer import make_tokenizer
from .common import add_model_argument, log, read_text


def _tokenizer(model: str):
    path = resolve(model, log)
    vocab = read_vocab(path)
    return vocab, make_tokenizer(vocab, str(path))


def _input_text(a: argparse.Namespace) -> str:
    """-p TEXT, -f FILE, or standard input."""
    if a.prompt is not None:
        return a.prompt
    if a.file:
        return read_text(a.file, None, "--file")[0]
    return sys.stdin.read()


def run_tokenize(a: argparse.Namespace) -> None:
    _, tok = _tokenizer(a.model)
    flags = dict(add_special=not a.no_bos, parse_special=not a.no_parse_special)
    if a.jsonl:  # one JSON string a line in, one JSON array of ids a line out
        lines = (open(a.file, encoding="utf-8") if a.file else sys.stdin) if a.prompt is None else [a.prompt]
        for n, line in enumerate(lines, 1):
            try:
                text = json.loads(line) if a.prompt is None else line
            except json.JSONDecodeError as e:
                raise KilnError(f"tokenize --jsonl: line {n} is not JSON ({e.msg}); each line must be one JSON string")
            if not isinstance(text, str):
                raise KilnError(f"tokenize --jsonl: line {n} is a JSON {type(text).__name__}, not a string")
            print(json.dumps(tok.tokenize(text, **flags)), flush=True)
        return
    ids = tok.tokenize(_input_text(a), **flags)
    if a.pieces:  # llama-tokenize's view: one token a line
        for i in ids:
            print(f"{i:>6} -> {tok.token_bytes(i, True).decode('utf-8', errors='replace')!r}")
    else:
        print(" ".join(map(str, ids)))


def run_detokenize(a: argparse.Namespace) -> None:
    vocab, tok = _tokenizer(a.model)
    words = _input_text(a).split()
    n_vocab = len(vocab.tokens)
    ids = []
    for i, w in enumerate(words):
        try:
            t = int(w)
        except ValueError:
            t = -1
        if not 0 <= t < n_vocab:
            raise KilnError(f"detokenize: item {i} ({w!r}) is not a token id in [0, {n_vocab}) of {a.model}")
        ids.append(t)
    sys.stdout.write(tok.detokenize(ids, special=a.special) + "\n")


def register(sub) -> None:
    for name, helptext in (("tokenize", "text to token ids, space-separated on one line (as examples/c/generate.c "
                                         "reads them)"),
                           ("detokenize", "token ids (whitespace-separated) to text")):
        p = sub.add_parser(name, help=helptext, epilog="docs: docs/c-library.md")
        add_model_argument(p)
        src = p.add_mutually_exclusive_group()
        src.add_argument("-p", "--prompt", help="the text (tokenize) or ids (detokenize); default: standard input")
        src.add_argument("-f", "--file", help="read it from this file")
        if name == "tokenize":
            p.add_argument("--no-bos", action="store_true", help="do not add the BOS token the GGUF asks for")
            p.add_argument("--no-parse-special", action="store_true",
                           help="read special-token text such as <|im_start|> as plain text")
            p.add_argument("--pieces", action="store_true", help="one 'id -> piece' a line (llama-tokenize's view)")
            p.add_argument("--jsonl", action="store_true",
                           help="each input line is one JSON string; each output line the JSON array of its ids")
            p.set_defaults(run=run_tokenize)
        else:
            p.add_argument("--special", action="store_true", help="render special tokens as their text")
            p.set_defaults(run=run_detokenize)
