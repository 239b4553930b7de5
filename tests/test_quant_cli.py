"""Every weight type at the command line: `kiln compile` says which kernel each type of the model
runs on (build/kernel_report.py), the layout map shows each tensor's type and bytes, `kiln bench
--wtype` takes every type of the table, and a tensor of a type kiln does not read is refused by
name. The blocks of types gguf cannot quantize are zeros: these tests look at types, not values."""
from __future__ import annotations

import json
import math
import re

import pytest
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as Q

from compiler.build.kernel_report import describe
from compiler.build.runtime import runtime_kernels
from compiler.build.targets import kernels_reported
from compiler.cli.main import main
from compiler.core.dtypes import WEIGHT_DTYPES, X8_DTYPES, DType
from compiler.core.errors import KilnError
from compiler.core.options import CompileOptions
from compiler.frontend.gguf_reader import read_model
from compiler.planner.plan import plan
from compiler.tools.synthetic import tensor_qtype, tensor_shapes
from compiler.tools.synthetic_models import SHAPES, WTYPES, synthetic_spec
from synthetic import TinySpec, write_tiny_model

# layer 0 of the new types, one a tensor; layer 1 Q4_K (an x8 type) but for a BF16 matrix, whose dot
# has no SIMD twin; the tied embedding IQ4_NL (an x8 type, as attn_v is) with 259 rows, which no x8
# copy takes (not 8 a group)
MIXED = {"blk.0.attn_q.weight": Q.IQ2_XXS, "blk.0.attn_k.weight": Q.Q2_K, "blk.0.attn_v.weight": Q.IQ4_NL,
         "blk.0.attn_output.weight": Q.MXFP4, "blk.0.ffn_gate.weight": Q.TQ2_0, "blk.0.ffn_up.weight": Q.IQ3_S,
         "blk.0.ffn_down.weight": Q.IQ1_M, "blk.1.attn_q.weight": Q.BF16, "token_embd.weight": Q.IQ4_NL}
SHAPE = dict(arch="llama", wtype=Q.Q4_K, n_embd=256, n_head=4, n_head_kv=2, n_ff=512)  # rows of whole super-blocks
LINE = re.compile(r"^kiln:   (\w+): (\d+) tensors?, ([\d.]+ [KM]iB): (.*)$", re.M)


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("quant") / "mixed.gguf", TinySpec(**SHAPE, types=MIXED))


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def by_type(path):
    tensors: dict[DType, list] = {}
    for t in read_model(path).tensors.values():
        tensors.setdefault(t.dtype, []).append(t)
    return tensors


def test_compile_prints_the_kernel_of_each_weight_type(capsys, mixed):
    code, out, err = run(capsys, "compile", mixed, "--ctx", "64")
    assert code == 0, err
    lines = {name: (int(n), size, kernel) for name, n, size, kernel in LINE.findall(err)}
    tensors = by_type(mixed)
    assert set(lines) == {d.name for d in tensors}, err  # one line a type the model holds, and no other
    rt = runtime_kernels()
    paths = set(kernels_reported(rt))
    x8 = bool(paths & {"KILN_HAVE_VNNI", "KILN_HAVE_X8_AVX2"})
    simd = "KILN_HAVE_AVX2" in paths or "KILN_HAVE_NEON" in paths
    for d, ts in tensors.items():
        n, size, kernel = lines[d.name]
        assert n == len(ts) and size == f"{sum(t.nbytes for t in ts) / 1024:.1f} KiB", (d, lines[d.name])
        if d is DType.F32:  # the norms
            assert kernel.startswith("vectors of elementwise ops"), kernel
            continue
        has_dot = bool(rt.lib.kiln_simd_kernels(d.value.value) & rt.lib.KILN_SIMD_DOT)
        # nothing falls back to the scalar loop without a word: the line says it exactly where it does
        assert ("scalar reference" in kernel) == (not has_dot or not simd), (d, kernel)
        if d in X8_DTYPES or not (simd and has_dot):
            continue
        assert "rows on the GGUF layout" in kernel, (d, kernel)  # the new types keep the GGUF rows
        assert ("no x8 layout for this type" in kernel) == x8, (d, kernel)
        assert ("unpacked once per tile" in kernel) == (d.block_elems == 256), (d, kernel)
        lut_tiles = d in (DType.IQ4_NL, DType.MXFP4) and "KILN_HAVE_AVX2" in paths and "KILN_HAVE_VNNI" in paths
        assert ("interleaved once per tile in prefill" in kernel) == lut_tiles, (d, kernel)
    # BF16 runs AVX2/NEON rows where the build has them (the scalar reference on a scalar build)
    assert ("scalar reference" in lines["BF16"][2]) == (not simd), lines["BF16"][2]
    q4k, iq4nl = lines["Q4_K"][2], lines["IQ4_NL"][2]
    if x8:  # six matrices packed; of IQ4_NL's, attn_v, not the embedding's 259 rows (not 8 a group)
        assert q4k.endswith("on the x8 layout"), q4k
        lut_tiles = "KILN_HAVE_AVX2" in paths and "KILN_HAVE_VNNI" in paths
        assert "1 tensor: " in iq4nl and "on the x8 layout" in iq4nl and (
            f"rows on the GGUF layout ({'interleaved once per tile in prefill; ' if lut_tiles else ''}this shape "
            "has no x8 copy)") in iq4nl, iq4nl


def test_each_path_is_described_from_its_facts(mixed):
    """The one function, with the facts of builds this CPU may not have: a scalar build, AVX2 on
    the x8 layout, and an aarch64 library that cannot be loaded here to ask."""
    p = plan(mixed, CompileOptions(ctx=64))

    def lines(paths, simd_dot, arch=""):
        return {line.split(":")[0]: line for line in describe(p.spec, p.graph, paths, simd_dot, arch)}

    scalar = lines((), lambda d: False)
    assert all("scalar reference (a build without SIMD kernels)" in scalar[d.name] for d in map(DType.__getitem__, (
        "Q4_K", "BF16", "IQ2_XXS", "MXFP4")))
    avx2 = lines(("KILN_HAVE_AVX2", "KILN_HAVE_X8_AVX2"), lambda d: d is not DType.BF16)
    assert "AVX2 on the x8 layout" in avx2["Q4_K"] and "AMX" not in avx2["Q4_K"]
    assert avx2["IQ1_M"].endswith("AVX2 rows on the GGUF layout (unpacked once per tile; no x8 layout for this type)")
    assert "1 tensor: AVX2 on the x8 layout" in avx2["IQ4_NL"] and (
        "1 tensor: AVX2 rows on the GGUF layout (this shape has no x8 copy)") in avx2["IQ4_NL"], avx2["IQ4_NL"]
    vnni = lines(("KILN_HAVE_AVX2", "KILN_HAVE_VNNI", "KILN_HAVE_AVX512"), lambda d: True)
    assert vnni["MXFP4"].endswith("1 tensor, 34.0 KiB: AVX-512 VNNI on the x8 layout"), vnni["MXFP4"]
    # the table types' rows without an x8 copy interleave their prefill's tiles where vpdpbusd is
    assert "1 tensor: AVX-512 VNNI on the x8 layout" in vnni["IQ4_NL"] and ("1 tensor: AVX2 rows on the GGUF layout "
                                                                           "(interleaved once per tile in prefill; this "
                                                                           "shape has no x8 copy)") in vnni["IQ4_NL"]
    assert avx2["BF16"].endswith("the scalar reference (this build has no SIMD dot for BF16)")
    # AMX in prefill: the super-block types' tiles but Q2_K's (its minimums), not the K-quants' kx8 blocks
    amx = lines(("KILN_HAVE_AVX2", "KILN_HAVE_VNNI", "KILN_HAVE_AVX512", "KILN_HAVE_AMX"), lambda d: True)
    assert amx["IQ2_XXS"].endswith("AVX2 rows on the GGUF layout (unpacked once per tile, AMX tiles in prefill; no x8 "
                                   "layout for this type)"), amx["IQ2_XXS"]
    assert "AMX" not in amx["Q2_K"] and amx["Q4_K"].endswith("AVX-512 VNNI on the x8 layout"), (amx["Q2_K"], amx["Q4_K"])
    assert amx["MXFP4"].endswith("AVX-512 VNNI on the x8 layout (AMX tiles in prefill, where its rows fit the tiles)")
    arm = lines(("KILN_HAVE_NEON", "KILN_HAVE_DOTPROD"), None, "aarch64")
    assert "NEON rows on the GGUF layout" in arm["Q4_K"] and "x8" not in arm["Q4_K"]
    assert arm["TQ2_0"].endswith("NEON rows on the GGUF layout (unpacked once per tile), if the library has a "
                                 "SIMD dot for TQ2_0")
    assert any("an aarch64 library cannot be loaded on this CPU" in line for line in arm.values())


def test_layout_map_shows_each_tensors_type_and_bytes(capsys, mixed):
    tensors = read_model(mixed).tensors
    code, out, _ = run(capsys, "layout", mixed, "--ctx", "64", "--json")
    assert code == 0
    weights = {b["name"]: b for b in json.loads(out)["buffers"] if b["region"] == "weights"}
    assert set(weights) >= set(tensors)  # and the tied LM head, a view of the embedding
    assert all(b["note"] == "view of token_embd.weight" for name, b in weights.items() if name not in tensors)
    for name, t in tensors.items():
        assert weights[name]["dtype"] == t.dtype.label and weights[name]["size"] == t.nbytes
        assert t.nbytes == math.prod(t.shape) // t.dtype.block_elems * t.dtype.block_bytes
    code, out, _ = run(capsys, "layout", mixed, "--ctx", "64")
    section = out.split("WEIGHTS (offsets within the GGUF file)")[1].split("\n\n")[0]
    rows = {line.split()[6]: line.split() for line in section.splitlines()[2:]}
    for name, t in tensors.items():  # offset, end, size, shape, dtype, live, name
        assert rows[name][2] == f"{t.nbytes:,}" and rows[name][4] == t.dtype.label, rows[name]


def test_bench_wtype_takes_every_weight_type(capsys):
    assert list(WTYPES) == [d.name for d in WEIGHT_DTYPES]  # the table's, not a list of its own
    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert all(f" {name}," in help_text or f" {name} " in help_text for name in WTYPES), help_text
    with pytest.raises(SystemExit) as e:
        main(["bench", "--synthetic", "llama-1b", "--wtype", "Q9_K"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "argument --wtype: invalid choice: 'Q9_K'" in err and "IQ2_XXS" in err, err
    with pytest.raises(KilnError, match=r"--wtype: 'NVFP4' is not a weight type kiln reads; choose one of .*MXFP4"):
        synthetic_spec("llama-1b", "NVFP4")
    assert synthetic_spec("qwen3moe-small", "MXFP4").wtype is Q.MXFP4
    for shape in SHAPES:  # every shape's matrices are rows of whole blocks of every type, or of its fallback's
        for wtype in WTYPES:
            spec = synthetic_spec(shape, wtype)
            for name, dims in tensor_shapes(spec, 49152).items():
                assert dims[-1] % GGML_QUANT_SIZES[tensor_qtype(spec, name, dims)][0] == 0, (shape, wtype, name, dims)
    # EmbeddingGemma's FFN of 1152 is no whole number of super-blocks: llama-quantize's fallbacks
    gemma = {w: synthetic_spec("embeddinggemma", w) for w in ("Q4_K", "Q6_K", "IQ2_XXS", "Q3_K", "Q8_0")}
    assert {w: tensor_qtype(s, "blk.0.ffn_down.weight", (768, 1152)) for w, s in gemma.items()} == {
        "Q4_K": Q.Q5_0, "Q6_K": Q.Q8_0, "IQ2_XXS": Q.IQ4_NL, "Q3_K": Q.Q4_0, "Q8_0": Q.Q8_0}
    assert tensor_qtype(gemma["Q4_K"], "blk.0.ffn_up.weight", (1152, 768)) is Q.Q4_K


@pytest.mark.parametrize("qtype", [Q.NVFP4, Q.Q1_0], ids=lambda q: q.name)
def test_a_type_kiln_does_not_read_is_refused_by_name(capsys, tmp_path, qtype):
    path = write_tiny_model(tmp_path / "other.gguf", TinySpec(**SHAPE, types={"blk.0.ffn_up.weight": qtype}))
    code, out, err = run(capsys, "compile", path, "--ctx", "64")
    assert code == 1 and out == ""
    assert f"tensor 'blk.0.ffn_up.weight' has quant type {qtype.name}, which kiln does not support" in err, err
    assert "Traceback" not in err
