"""Progress of making a model ready (progress.py): one line a stage with its time off a terminal,
rich's spinners and bars on one (a pseudo-terminal here), and a quiet start once cached."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from gguf import GGMLQuantizationType as Q

from compiler.build.runtime import runtime_kernels, runtime_library
from synthetic import TinySpec, write_tiny_model

STAGES = ("fetch", "plan", "generate", "cc", "pack")
LINE = re.compile(r"^kiln: (fetch|plan|generate|cc|pack) +(\d+\.\d\d)s  (.*)$", re.M)


def kiln(*argv, cache):
    return subprocess.run([sys.executable, "-m", "compiler", *argv], capture_output=True, text=True,
                          env={**os.environ, "KILN_CACHE": str(cache)})


@pytest.fixture
def fresh(tmp_path, smollm2):
    """A tiny llama (SmolLM2's tokenizer) and an empty kiln cache: its first run builds everything."""
    model = write_tiny_model(tmp_path / "tiny.gguf", TinySpec(arch="llama", wtype=Q.Q8_0, tokenizer_from=smollm2))
    return model, tmp_path / "cache"


def test_lines_per_stage_off_a_terminal(fresh):
    model, cache = fresh
    first = kiln("run", str(model), "-p", "hello", "-n", "2", "--temp", "0", "--ctx", "64", cache=cache)
    assert first.returncode == 0, first.stderr
    lines = LINE.findall(first.stderr)
    assert [name for name, _, _ in lines] == list(STAGES)
    notes = dict((name, note) for name, _, note in lines)
    assert notes["cc"].startswith("compiling _kiln_model_") and "model.c" in notes["cc"] and notes["fetch"] == str(model)
    # a cached start says nothing: not a line on standard error
    again = kiln("run", str(model), "-p", "hello", "-n", "2", "--temp", "0", "--ctx", "64", cache=cache)
    assert again.returncode == 0 and again.stderr == "" and again.stdout == first.stdout
    # kiln compile shows every stage, cached or not
    compiled = kiln("compile", str(model), "--ctx", "64", cache=cache)
    notes = dict((name, note) for name, _, note in LINE.findall(compiled.stderr))
    assert list(notes) == list(STAGES) and notes["cc"].startswith("cached: _kiln_model_") \
        and notes["cc"].endswith("the runtime for native was cached")


def test_spinners_and_bars_on_a_terminal(smollm2, tmp_path):
    """SmolLM2 in a cache that holds only its GGUF and the runtime (this suite's own build; the test
    above watches a runtime being built): compiled and packed (92 MiB, long enough for a bar)."""
    pexpect = pytest.importorskip("pexpect", reason="pexpect (a dev dependency) drives the pseudo-terminal")
    cache = tmp_path / "cache"
    (cache / "models").mkdir(parents=True)
    (cache / "models" / smollm2.name).symlink_to(smollm2)
    runtime, _ = runtime_library()
    (cache / "build").mkdir()
    (cache / "build" / runtime.parent.name).symlink_to(runtime.parent)
    child = pexpect.spawn(sys.executable, ["-m", "compiler", "compile", "smollm2-135m", "--ctx", "64"], encoding="utf-8",
                          timeout=300, env={**os.environ, "KILN_CACHE": str(cache), "TERM": "xterm-256color"},
                          dimensions=(40, 160))
    child.expect(pexpect.EOF)
    child.close()
    out = child.before
    assert child.exitstatus == 0, out
    assert re.search("[⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏]", out)  # rich's spinner ran
    assert "━" in out
    if runtime_kernels().lib.kiln_x8_kernels():  # a build without the x8 kernels packs nothing
        assert re.search(r"pack .*\d+(\.\d+)?/96\.4 MB", out)  # the packing bar, in bytes
    finished = re.findall(r"kiln: (fetch|plan|generate|cc|pack) +\d+\.\d\ds", out)
    assert finished == list(STAGES)
