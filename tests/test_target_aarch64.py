"""The aarch64 targets, cross-compiled here and run under qemu-aarch64: each build's logits are the
x86 scalar build's bit for bit on the golden tiny model (a prompt in one chunk, token by token, and
beside another sequence's rows, then 32 greedy steps), and its 32 greedy tokens on SmolLM2 are the
x86 builds'. Emulation says nothing of speed.

`make test` installs Debian's gcc-aarch64-linux-gnu and qemu-user (`make cross`); without them the
module is skipped, naming what is missing.
"""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from compiler.build.targets import TARGETS, cc
from compiler.core.errors import BuildError
from compiler.core.options import CompileOptions
from compiler.core.paths import RUNTIME_DIR
from compiler.driver import compile_c_library, compile_model
from compiler.runtime import load_options
from synthetic import TinySpec, write_tiny_model

ARM = [name for name, t in TARGETS.items() if t.family == "aarch64"]
QEMU = shutil.which("qemu-aarch64")
SYSROOT = Path("/usr/aarch64-linux-gnu")
PROGRAM = Path(__file__).parent / "c" / "logits.c"
STEPS = 32
TINY_IDS = [1, 5, 9, 44, 100, 200, 31, 7, 250, 3, 66]

missing = [what for what, ok in (("qemu-aarch64 (apt-get install qemu-user)", QEMU),
                                 ("aarch64-linux-gnu-gcc (apt-get install gcc-aarch64-linux-gnu)",
                                  shutil.which("aarch64-linux-gnu-gcc")),
                                 (f"the aarch64 C library in {SYSROOT}", SYSROOT.is_dir())) if not ok]
if missing:
    pytest.skip(f"no aarch64 cross build here: missing {', '.join(missing)} (make cross installs them)",
                allow_module_level=True)


def arm_logits(path: Path, target: str, opts: CompileOptions, ids: list[int], workdir: Path) -> dict[str, np.ndarray]:
    """logits.c's blocks, from the target's plain C library run under qemu."""
    lib = compile_c_library(compile_model(path, opts, target=target))
    exe, ids_file, out = workdir / f"logits-{target}", workdir / "prompt.ids", workdir / f"logits-{target}.bin"
    shutil.copy2(lib, workdir / lib.name)
    subprocess.run(cc(target) + ["-O2", "-Wall", "-Werror", f"-I{RUNTIME_DIR}", str(PROGRAM),
                                 f"-L{workdir}", "-lkiln_model", "-Wl,-rpath,$ORIGIN", "-o", str(exe)], check=True)
    ids_file.write_text(" ".join(map(str, ids)))
    run = subprocess.run([QEMU, "-L", str(SYSROOT), str(exe), str(path), str(ids_file), str(STEPS), str(out), "2"],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    rows = np.fromfile(out, dtype=np.float32).reshape(3 * len(ids) + STEPS, -1)
    n = len(ids)
    return {"chunk": rows[:n], "one_by_one": rows[n:2 * n], "beside": rows[2 * n:3 * n], "steps": rows[3 * n:]}


def x86_logits(path: Path, opts: CompileOptions, ids: list[int]) -> dict[str, np.ndarray]:
    """The same blocks from the x86 scalar build, through Python."""
    m = load_options(path, opts, threads=1, target="x86-64")
    chunk = m.prefill(ids, logits="all")
    m.reset()
    one_by_one = np.stack([m.decode(t) for t in ids])
    steps, token = [], int(chunk[-1].argmax())
    for _ in range(STEPS):
        steps.append(m.decode(token))
        token = int(steps[-1].argmax())
    return {"chunk": chunk, "one_by_one": one_by_one, "steps": np.stack(steps)}


@pytest.fixture(scope="module")
def tiny_case(tmp_path_factory):
    path = write_tiny_model(tmp_path_factory.mktemp("arm") / "tiny-llama.gguf", TinySpec(arch="llama", wtype=Q.Q8_0))
    opts = CompileOptions(ctx=64, prefill_chunk=16, n_seq=2)
    return path, opts, x86_logits(path, opts, TINY_IDS)


@pytest.mark.parametrize("target", ARM)
def test_golden_model_logits_are_the_x86_scalar_builds_bit_for_bit(tiny_case, target, tmp_path):
    path, opts, want = tiny_case
    got = arm_logits(path, target, opts, TINY_IDS, tmp_path)
    for part in ("chunk", "one_by_one", "steps"):
        np.testing.assert_array_equal(got[part], want[part], err_msg=f"{target}: {part}")
    np.testing.assert_array_equal(got["beside"], got["chunk"], err_msg=f"{target}: batch invariance")


def test_smollm2_greedy_tokens_are_the_x86_builds(smollm2, tmp_path):
    """The widest ARM target on the real model: its greedy tokens are every x86 build's."""
    opts = CompileOptions(ctx=128, n_seq=2)
    m = load_options(smollm2, opts, target="x86-64")
    ids = m.tokenize("Once upon a time, in a small village,")
    want = [int(r.argmax()) for r in x86_logits(smollm2, opts, ids)["steps"]]
    got = arm_logits(smollm2, ARM[-1], opts, ids, tmp_path)
    assert [int(r.argmax()) for r in got["steps"]] == want
    np.testing.assert_array_equal(got["beside"], got["chunk"])


def test_a_library_for_arm_is_refused_by_python_here(tiny_case):
    path, opts, _ = tiny_case
    with pytest.raises(BuildError, match=r"target aarch64 needs the aarch64 architecture"):
        load_options(path, opts, target="aarch64")
