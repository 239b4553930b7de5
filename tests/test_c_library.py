"""The plain C library (`kiln compile -o DIR --c-lib`): built by cc alone, used from C by the
example program, whose greedy ids must equal the Python wrapper's; and `kiln tokenize` /
`kiln detokenize`, which carry text across to it."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from compiler import load
from compiler.cli.main import main

CTX = 256
PROMPT = "The capital of France is Paris. The capital of Germany is"
N_GEN = 24


def kiln(*argv, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "compiler", *argv], input=stdin, capture_output=True, text=True)


@pytest.fixture(scope="module")
def c_lib(smollm2, tmp_path_factory):
    out = tmp_path_factory.mktemp("clib")
    assert main(["compile", str(smollm2), "--ctx", str(CTX), "-o", str(out), "--c-lib"]) == 0
    return out


@pytest.fixture(scope="module")
def example(c_lib):
    cc = shutil.which(os.environ.get("CC", "cc"))
    if cc is None:
        pytest.skip("no C compiler on PATH (set CC)")
    exe = c_lib / "generate"
    subprocess.run([cc, "-O2", "-Wall", "-Werror", "-I.", "examples/c/generate.c", "-L.", "-lkiln_model",
                    "-Wl,-rpath,$ORIGIN", "-o", str(exe)], cwd=c_lib, check=True)
    return exe


def test_directory_holds_library_header_and_example(c_lib):
    for name in ("libkiln_model.so", "model.h", "status.h", "model.c", "examples/c/generate.c"):
        assert (c_lib / name).is_file(), name
    assert len(list(c_lib.glob("*.x8"))) == 1  # the packed weights the library reads


def test_library_has_no_python_and_exports_only_the_api(c_lib):
    lib = c_lib / "libkiln_model.so"
    needed = subprocess.run(["readelf", "-d", str(lib)], capture_output=True, text=True, check=True).stdout
    assert "NEEDED" in needed and "python" not in needed.lower()
    undefined = subprocess.run(["nm", "-D", "--undefined-only", str(lib)], capture_output=True, text=True,
                               check=True).stdout
    assert not [s for s in undefined.split() if s.startswith("Py")]
    defined = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True,
                             check=True).stdout.split()
    exported = {s for s in defined[2::3]}
    header = (c_lib / "model.h").read_text() + (c_lib / "status.h").read_text()
    assert {"kiln_open", "kiln_eval", "kiln_step", "kiln_close", "kiln_strerror"} <= exported
    assert all(name.startswith("kiln_") and f"{name}(" in header for name in exported), exported
    assert "kiln_attention" not in exported and "kiln_matmul" not in " ".join(exported)


def test_example_ids_equal_python_greedy(c_lib, example, smollm2, tmp_path):
    tokens = kiln("tokenize", str(smollm2), "-p", PROMPT)
    assert tokens.returncode == 0, tokens.stderr
    ids_file = tmp_path / "prompt.ids"
    ids_file.write_text(tokens.stdout)
    packed = next(c_lib.glob("*.x8"))
    run = subprocess.run([str(example), str(smollm2), str(ids_file), str(N_GEN), str(packed), "2"],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    c_ids = [int(t) for t in run.stdout.split()]

    m = load(smollm2, ctx=CTX)
    prompt = [int(t) for t in tokens.stdout.split()]
    assert prompt == m.tokenize(PROMPT)
    with m.sequence() as seq:
        logits, py_ids = seq.prefill(prompt), []
        for _ in range(N_GEN):
            py_ids.append(int(np.argmax(logits)))
            logits = seq.decode(py_ids[-1])
    assert c_ids == py_ids
    text = kiln("detokenize", str(smollm2), stdin=run.stdout)
    assert text.returncode == 0 and text.stdout == m.generate(prompt, max_tokens=N_GEN, temperature=0) + "\n"


def test_example_refuses_bad_input(c_lib, example, smollm2, tmp_path):
    bad = tmp_path / "bad.ids"
    for content, message in (("1 2 999999", "token id 999999 is outside [0, 49152)"),
                             ("1 two", "expected whitespace-separated token ids"), ("", "found none")):
        bad.write_text(content)
        r = subprocess.run([str(example), str(smollm2), str(bad), "4"], capture_output=True, text=True)
        assert r.returncode != 0 and message in r.stderr, r.stderr
    bad.write_text("1 2 3")
    r = subprocess.run([str(example), str(tmp_path / "missing.gguf"), str(bad), "4"], capture_output=True, text=True)
    assert r.returncode == 1 and "KILN_E_OPEN" in r.stderr
    r = subprocess.run([str(example), str(smollm2), str(bad), str(CTX)], capture_output=True, text=True)
    assert r.returncode == 2 and f"n_ctx = {CTX}" in r.stderr


def test_tokenize_detokenize_round_trip(smollm2, tmp_path):
    text = "Hello, world! Tabs\tand ünïcödé, <|im_start|>special tokens too."
    ids = kiln("tokenize", str(smollm2), "-p", text)
    assert ids.returncode == 0, ids.stderr
    back = kiln("detokenize", str(smollm2), "--special", "-p", ids.stdout)
    assert back.returncode == 0 and back.stdout == text + "\n"
    (tmp_path / "t.txt").write_text(text)
    assert kiln("tokenize", str(smollm2), "-f", str(tmp_path / "t.txt")).stdout == ids.stdout
    assert kiln("tokenize", str(smollm2), stdin=text).stdout == ids.stdout
    pieces = kiln("tokenize", str(smollm2), "-p", "Hello world", "--pieces").stdout.splitlines()
    assert pieces[-1].split(" -> ")[1] == "' world'"


@pytest.mark.parametrize("argv, message", [
    (("detokenize", "-p", "1 -5"), "item 1 ('-5') is not a token id"),
    (("detokenize", "-p", "12 abc"), "item 1 ('abc') is not a token id"),
    (("tokenize", "-f", "/nonexistent.txt"), "--file /nonexistent.txt: cannot read it"),
    (("compile", "--c-lib"), "--c-lib writes a directory: give it with -o DIR"),
])
def test_bad_input_is_named(smollm2, argv, message):
    r = kiln(*argv[:1], str(smollm2), *argv[1:])
    assert r.returncode == 1 and message in r.stderr, r.stderr
