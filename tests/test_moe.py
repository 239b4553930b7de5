"""A mixture of experts' two ops, moe_route and moe_ffn (runtime_c/moe_route.c, moe.c), against
references no one here wrote or that share no code with them: ggml's own ops (tests/ggml_ops.py),
which kiln's routing and weighted sum must match bit for bit, as llama.cpp's build_moe_ffn runs
them (softmax, top-k, renormalization; each expert's output times its weight, added in rank
order); libstdc++'s std::sort for the order of tied experts; the scalar reference dots for the
experts' FFNs. The models are compared with llama.cpp in test_archs.py at the control's floor
(qwen3moe and olmoe are FEATURE_MODELS), and here without their routing's feature; their batch
invariance in test_batch.py, their bits on every target in test_targets.py."""
from __future__ import annotations

import json
import shutil
import subprocess

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

import compiler
import compiler.frontend.architecture_file as architecture_file
from compiler.build.runtime import runtime_kernels
from compiler.core.dtypes import DType
from compiler.passes.scratch import moe_scratch_bytes
from ggml_ops import moe_route, moe_sum
from reference import Reference, compare
from test_archs import FLOOR, MISSES, _ids, feature_model
from test_kernels import ptr, quantized, quantized_rows

K = runtime_kernels()
ffi, lib = K.ffi, K.lib

STD_SORT = r"""
#include <algorithm>
#include <cstdio>
#include <vector>
int main() {  // rows of n floats on stdin -> the indices std::sort leaves them in, by v[a] > v[b]
    int rows, n;
    if (std::scanf("%d %d", &rows, &n) != 2) return 1;
    for (int r = 0; r < rows; r++) {
        std::vector<float> v(n);
        std::vector<int> idx(n);
        for (int i = 0; i < n; i++) { std::scanf("%f", &v[i]); idx[i] = i; }
        std::sort(idx.begin(), idx.end(), [&](int a, int b) { return v[a] > v[b]; });
        for (int i = 0; i < n; i++) std::printf("%d%c", idx[i], i + 1 < n ? ' ' : '\n');
    }
}
"""


@pytest.fixture(scope="module")
def std_sort(tmp_path_factory):
    """llama.cpp's CPU argsort is std::sort with `>`: the same call, built by the system's g++."""
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.fail("the argsort test compares with std::sort: install g++")
    d = tmp_path_factory.mktemp("std_sort")
    (d / "sort.cc").write_text(STD_SORT)
    subprocess.run([cxx, "-O2", "-o", str(d / "sort"), str(d / "sort.cc")], check=True)

    def run(rows: np.ndarray) -> np.ndarray:
        text = f"{rows.shape[0]} {rows.shape[1]}\n" + "\n".join(" ".join(repr(float(x)) for x in r) for r in rows)
        out = subprocess.run([str(d / "sort")], input=text, capture_output=True, text=True, check=True).stdout
        return np.array([[int(x) for x in line.split()] for line in out.splitlines()], np.int32)
    return run


@pytest.mark.parametrize("n", [4, 16, 17, 60, 128, 512])
def test_argsort_leaves_ties_where_std_sort_does(std_sort, n):
    """Rows full of ties (a few distinct values) and rows without: every index where std::sort puts
    it, through the introsort's partitions, its insertion sort and (with many ties) its heap sort."""
    rng = np.random.default_rng(n)
    rows = np.concatenate([rng.integers(0, 3, (6, n)).astype(np.float32),  # mostly ties
                           rng.standard_normal((2, n)).astype(np.float32),
                           np.zeros((1, n), np.float32), np.arange(n, dtype=np.float32)[None, :]])
    want = std_sort(rows)
    for r, row in enumerate(rows):
        got = np.zeros(n, np.int32)
        lib.kiln_argsort_desc(ptr(row, "float *"), ptr(got, "int32_t *"), n)
        np.testing.assert_array_equal(got, want[r], err_msg=f"row {r}")


@pytest.mark.parametrize("normalize", [0, 1])
def test_route_is_softmax_then_top_k(normalize):
    """Each row's experts are the top k by probability, best first; their weights the
    probabilities, divided by their sum where the template says so (qwen3moe)."""
    rng = np.random.default_rng(3 + normalize)
    rows, n_expert, k = 9, 16, 4
    logits = rng.standard_normal((rows, n_expert)).astype(np.float32) * 3
    ids, weights = np.zeros((rows, k), np.int32), np.zeros((rows, k), np.float32)
    lib.kiln_moe_route(ptr(ids, "int32_t *"), ptr(weights, "float *"), ptr(logits, "float *"), rows, n_expert, k,
                       normalize, 0)
    p = np.exp(logits.astype(np.float64) - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    top = np.argsort(-p, axis=1, kind="stable")[:, :k]
    np.testing.assert_array_equal(ids, top)
    want = np.take_along_axis(p, top, 1)
    if normalize:
        want /= want.sum(1, keepdims=True)
    np.testing.assert_allclose(weights, want, rtol=1e-6)


@pytest.mark.parametrize("normalize", [0, 1])
@pytest.mark.parametrize("n_expert,k", [(8, 2), (8, 3), (16, 4), (60, 4), (64, 8), (128, 8)])
def test_routing_is_ggmls_bit_for_bit(n_expert, k, normalize):
    """ggml_soft_max, ggml_argsort_top_k, ggml_get_rows and, renormalizing, ggml_sum_rows, ggml_clamp
    and ggml_div, as build_moe_ffn chains them: the same experts and the same weights, to the bit.
    Blocks of 16 experts take ggml_v_expf and a tree sum, the rest libm's expf (so both are
    here); logits near 0 to far apart (an exp that underflows), and rows of two tied experts."""
    rng = np.random.default_rng(n_expert * 10 + k + normalize)
    rows = 96
    logits = (rng.standard_normal((rows, n_expert)) * rng.choice([0.01, 1.0, 4.0, 40.0], (rows, 1))).astype(np.float32)
    logits[::5, 3] = logits[::5, 1]
    ids, weights = np.zeros((rows, k), np.int32), np.zeros((rows, k), np.float32)
    lib.kiln_moe_route(ptr(ids, "int32_t *"), ptr(weights, "float *"), ptr(logits, "float *"), rows, n_expert, k,
                       normalize, 0)
    want_ids, want_weights = moe_route(logits, k, bool(normalize))
    np.testing.assert_array_equal(ids, want_ids, err_msg="the experts chosen")
    np.testing.assert_array_equal(weights, want_weights, err_msg="their weights")


class Experts:
    """n_expert experts' gate, up and down as the GGUF's 3-D tensors, with x8 copies where this
    build has the x8 kernels, and the scalar reference of their FFN (kiln_vec_dot_ref on each
    (row, output) pair, kiln_swiglu_ref, the activations quantized one row at a time). A gate type
    None: experts without a gate (nomic-bert-moe's), kiln_gelu(up) in place of the SwiGLU."""

    def __init__(self, types: tuple[Q | None, Q, Q], n_expert: int, n_ff: int, n_embd: int, seed: int, packed: bool):
        rng = np.random.default_rng(seed)
        self.types, self.n_expert, self.n_ff, self.n_embd = types, n_expert, n_ff, n_embd
        self.gated = types[0] is not None
        shapes = ((n_ff, n_embd), (n_ff, n_embd), (n_embd, n_ff))
        self.raw = [None if t is None else np.stack([quantized(rng, *shape, t)[1] for _ in range(n_expert)])
                    for t, shape in zip(types, shapes)]
        self.packed = [None] * 3
        if packed and all(t is None or lib.kiln_x8_supported(int(t), *s) for t, s in zip(types, shapes)):
            self.packed = []
            for t, (n_out, n_in), raw in zip(types, shapes, self.raw):
                one = lib.kiln_x8_bytes(int(t), n_out, n_in) if t is not None else 0
                out = np.zeros(n_expert * one, np.uint8)
                for e in range(n_expert if t is not None else 0):
                    lib.kiln_pack_x8(int(t), ptr(raw[e]), ptr(out[e * one:]), n_out, n_in)
                self.packed.append(out if t is not None else None)
        self.weights = [ffi.NULL if t is None else ffi.new("kiln_weight *", {"type": int(t), "data": ptr(raw),
                                                                              "packed": ffi.NULL if p is None else ptr(p)})
                        for t, raw, p in zip(types, self.raw, self.packed)]
        self.extra = ffi.NULL if self.gated else ffi.new("kiln_moe_extra *", {"act": lib.KILN_ACT_GELU})

    def run(self, x: np.ndarray, ids: np.ndarray, w: np.ndarray, threads: int = 2) -> tuple[np.ndarray, np.ndarray]:
        rows, k = ids.shape
        y = np.zeros_like(x)
        reads = np.zeros((self.n_expert, 3), np.int32)
        g, u, d = self.types
        scratch = np.zeros(lib.kiln_moe_scratch_bytes(int(g if self.gated else u), int(u), int(d), rows, self.n_expert,
                                                      k, self.n_ff, self.n_embd), np.uint8)
        status = lib.kiln_moe_ffn(ptr(y, "float *"), ptr(x, "float *"), ptr(ids, "int32_t *"), ptr(w, "float *"),
                                  *self.weights, self.extra, rows, self.n_expert, k, self.n_ff, self.n_embd,
                                  ptr(scratch), threads, ptr(reads, "int32_t *"))
        assert status == 0
        return y, reads

    def reference(self, x: np.ndarray, ids: np.ndarray, w: np.ndarray) -> np.ndarray:
        """Each chosen expert's output from the reference dots, weighted and summed by ggml's ops."""
        g, u, d = self.types
        ys = np.zeros((len(x), ids.shape[1], self.n_embd), np.float32)
        for r in range(len(x)):
            xu = quantized_rows(u, x[r:r + 1])[0]
            for j, e in enumerate(ids[r]):
                up = np.array([lib.kiln_vec_dot_ref(int(u), self.n_embd, ptr(row), ptr(xu)) for row in self.raw[1][e]],
                              np.float32)
                h = np.zeros(self.n_ff, np.float32)
                if not self.gated:  # the plain FFN's erf GELU, element by element
                    lib.kiln_gelu(ptr(h, "float *"), ptr(up, "float *"), self.n_ff)
                    xh = quantized_rows(d, h[None, :])[0]
                    ys[r, j] = [lib.kiln_vec_dot_ref(int(d), self.n_ff, ptr(row), ptr(xh)) for row in self.raw[2][e]]
                    continue
                xg = quantized_rows(g, x[r:r + 1])[0]
                gate = np.array([lib.kiln_vec_dot_ref(int(g), self.n_embd, ptr(row), ptr(xg)) for row in self.raw[0][e]],
                                np.float32)
                lib.kiln_swiglu_ref(ptr(h, "float *"), ptr(gate, "float *"), ptr(up, "float *"), self.n_ff)
                xh = quantized_rows(d, h[None, :])[0]
                ys[r, j] = [lib.kiln_vec_dot_ref(int(d), self.n_ff, ptr(row), ptr(xh)) for row in self.raw[2][e]]
        return moe_sum(ys, w)


def _routing(rng, rows: int, n_expert: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    ids = np.array([rng.choice(n_expert, k, replace=False) for _ in range(rows)], np.int32)
    return ids, rng.uniform(0.05, 1.0, (rows, k)).astype(np.float32)


@pytest.mark.parametrize("types", [(Q.Q4_0,) * 3, (Q.Q8_0,) * 3, (Q.Q4_K, Q.Q4_K, Q.Q6_K), (Q.Q4_K, Q.Q8_0, Q.Q4_1),
                                   (None, Q.Q8_0, Q.Q8_0), (None, Q.Q4_K, Q.Q6_K)],
                         ids=lambda ts: "-".join(t.name if t else "nogate" for t in ts))
@pytest.mark.parametrize("packed", [True, False], ids=["x8", "gguf"])
def test_experts_are_the_reference_bits_and_read_once_a_step(types, packed):
    """Eight rows (a batched decode) choosing 4 of 16 experts each: the scalar reference's bits, row
    for row; each chosen expert's gate, up and down rows read once for all the rows that chose it
    (the kernel counts them), the others not at all; each row alone, and the rows at another
    thread count, the same bits. Mixed types: Q4_K_M's Q6_K down, an up whose activations are in
    another format than gate's; and experts without a gate (up, kiln_gelu, down), no gate row read."""
    n_expert, k, n_ff, n_embd, rows = 16, 4, 256, 256, 8
    ex = Experts(types, n_expert, n_ff, n_embd, seed=sum(int(t or 0) for t in types) + packed, packed=packed)
    rng = np.random.default_rng(11)
    x = rng.standard_normal((rows, n_embd)).astype(np.float32)
    ids, w = _routing(rng, rows, n_expert, k)
    y, reads = ex.run(x, ids, w)
    np.testing.assert_array_equal(y, ex.reference(x, ids, w))
    chosen = np.isin(np.arange(n_expert), ids)
    assert (reads[chosen] == [n_ff if ex.gated else 0, n_ff, n_embd]).all() and (reads[~chosen] == 0).all()
    for r in range(rows):
        alone, _ = ex.run(x[r:r + 1], ids[r:r + 1], w[r:r + 1], threads=1)
        np.testing.assert_array_equal(alone[0], y[r], err_msg=f"row {r} alone")
    np.testing.assert_array_equal(ex.run(x[::-1].copy(), ids[::-1].copy(), w[::-1].copy(), threads=3)[0], y[::-1])


@pytest.mark.parametrize("types", [(DType.Q4_0,) * 3, (DType.Q4_K, DType.Q4_K, DType.Q6_K),
                                   (DType.Q4_K, DType.Q8_0, DType.Q4_1), (DType.F32, DType.F16, DType.Q8_0)],
                         ids=lambda ts: "-".join(t.name for t in ts))
@pytest.mark.parametrize("rows,n_expert,k", [(1, 8, 2), (8, 16, 4), (256, 128, 8)])
def test_the_planner_gives_moe_the_scratch_the_kernel_carves(types, rows, n_expert, k):
    """compiler/passes/scratch.py sizes the scratch the planner places; runtime_c/moe.c carves it."""
    n_ff, n_embd = 768, 2048
    want = lib.kiln_moe_scratch_bytes(*(t.value.value for t in types), rows, n_expert, k, n_ff, n_embd)
    assert moe_scratch_bytes(*types, rows, n_expert, k, n_ff, n_embd) == want


@pytest.fixture
def routing_switched(tmp_path, monkeypatch):
    """switch(arch): kiln reads arch's template with its renormalization of the top k weights the
    other way round (the templates' directory copied, that one flag flipped)."""
    def switch(arch: str) -> None:
        shutil.copytree(architecture_file.ARCH_DIR, tmp_path / "templates")
        path = tmp_path / "templates" / f"{arch}.json"
        template = json.loads(path.read_text())
        template["moe"]["normalize_top_k"] = not template["moe"]["normalize_top_k"]
        path.write_text(json.dumps(template))
        monkeypatch.setattr(architecture_file, "ARCH_DIR", tmp_path / "templates")
    return switch


@pytest.mark.parametrize("name", ["qwen3moe", "olmoe"])
def test_without_its_routing_a_mixture_misses_llamacpp(tiny, smollm2, routing_switched, name):
    """The negative control of test_archs.py's floor: the same model, its weights renormalized where
    llama.cpp takes them as they are (olmoe) or left as they are where it renormalizes (qwen3moe),
    lands far from llama.cpp (measured 3.2e-2 and 1.2e-2)."""
    path = feature_model(tiny, smollm2, name, Q.F32, raised=True)
    ids = _ids(70)
    ref = Reference(path, n_ctx=128).logits(ids)
    routing_switched(name)
    a = compare(ref, compiler.load(path, ctx=128, prefill_chunk=16).prefill(ids, logits="all"))
    print(f"\n{name}, its routing switched: mean KL {a.mean_kl:.2e}, top-1 {a.top1:.1%}")
    assert a.mean_kl >= MISSES > FLOOR, f"{name}: its routing switched, the model still lands {a.mean_kl:.2e} away"
