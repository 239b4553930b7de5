"""EmbeddingGemma (`gemma-embedding`) on a synthetic file: Gemma 3's body as a bidirectional encoder
whose sliding layers see p - window/2 .. p + window/2 (llama.cpp's LLAMA_SWA_TYPE_SYMMETRIC), mean
pooling, then sentence-transformers' two Dense layers (dense_2, dense_3). Against a float64 forward
pass of the same GGUF (tests/exact.py) and against llama.cpp's vectors; with negative controls
that show the test sees the mask, the window and the Dense layers."""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

import compiler
from exact import ExactForward, gelu_fp16_table
from test_embeddings import _cos, llama_rows

N_EMBD, N_DENSE, WINDOW = 64, 160, 8
TEXTS = ["what is the capital of france?",
         "Paris is the capital and most populous city of France, on the Seine, with two million people.",
         "a", "Sliding windows see only their neighbours; global layers see the whole input at once. " * 2]


def _spec(**kw) -> dict:
    rng = np.random.default_rng(5)
    dense = {"dense_2.weight": (rng.standard_normal((N_DENSE, N_EMBD)) / np.sqrt(N_EMBD)).tolist(),
             "dense_3.weight": (rng.standard_normal((N_EMBD, N_DENSE)) / np.sqrt(N_DENSE)).tolist()}
    meta = {"pooling_type": 1, "dense_2_feat_in": N_EMBD, "dense_2_feat_out": N_DENSE,
            "dense_3_feat_in": N_DENSE, "dense_3_feat_out": N_EMBD}
    return dict(n_layer=6, n_embd=N_EMBD, n_head=4, n_head_kv=2, head_dim=32, n_ff=128, sliding_window=WINDOW,
                norm_mean=1.0, context_length=256, extra_meta=meta, extra_tensors=dense) | kw


@pytest.fixture(scope="module")
def gemma_embedding(tiny, smollm2):
    return tiny("gemma-embedding", tokenizer_from=smollm2, **_spec())


def _exact(path, ids, causal: bool = False, window: int | None = WINDOW, dense: bool = True) -> np.ndarray:
    """Mean-pooled float64 vectors, then the Dense layers; a control's mask or window where asked.
    The GELU is ggml's fp16 table, as kiln's and llama.cpp's are (the same tokens as llama.cpp): the
    table alone puts both 1e-4 from the exact GELU's vectors, and would hide all the rest."""
    ref = ExactForward(path)
    ref.bidirectional, ref.window = not causal, window if window is not None else 10 ** 6
    ref.gelu = gelu_fp16_table
    pooled = np.stack([h.mean(0) for h in ref.hidden(ids)])
    if dense:
        pooled = pooled @ ref.weight("dense_2.weight").T @ ref.weight("dense_3.weight").T
    return pooled


def test_against_float64_and_llamacpp(gemma_embedding):
    """kiln's vectors within 1e-5 of the largest float64 value, no further from float64 than
    llama.cpp's on any input, and at cosine >= 0.9999 to llama.cpp's (which applies the Dense layers in its graph).
    The controls: the float64 pass made causal, without the window, or without the Dense layers,
    each lies far from kiln's vectors, so the test would see each feature lost."""
    m = compiler.load(gemma_embedding, n_seq=4)
    ids = [m.tokenize(t) for t in TEXTS]
    assert max(map(len, ids)) > 4 * WINDOW  # the window cuts what most rows see
    exact = _exact(gemma_embedding, ids)
    mine = m.embed(TEXTS, normalize=-1).astype(np.float64)
    scale = np.abs(exact).max()
    err = np.abs(mine - exact).max(1) / scale
    assert err.max() < 1e-5, err
    theirs = np.stack(llama_rows(gemma_embedding, ids, 1))
    assert _cos(mine, theirs).min() >= 0.9999
    assert (err <= np.abs(theirs - exact).max(1) / scale).all(), (err, np.abs(theirs - exact).max(1) / scale)
    for control in (dict(causal=True), dict(window=None), dict(dense=False)):
        wrong = _exact(gemma_embedding, ids, **control)
        assert np.abs(mine - wrong).max() / scale > 1e-2, control


def test_matryoshka_dimensions_and_pooling(gemma_embedding):
    """dimensions=d: the first d of the projected vector, renormalized (EmbeddingGemma's 768, 512, 256,
    128); pooling none: each token's row through the Dense layers, as llama.cpp's build_dense_out
    applies them to t_embd when nothing is pooled."""
    m = compiler.load(gemma_embedding, n_seq=4)
    full = m.embed(TEXTS, normalize=-1).astype(np.float64)
    for d in (48, 16):
        cut = m.embed(TEXTS, dimensions=d).astype(np.float64)
        want = full[:, :d] / np.linalg.norm(full[:, :d], axis=1, keepdims=True)
        np.testing.assert_allclose(cut, want, rtol=1e-6, atol=1e-7)
    rows = m.embed(TEXTS[:1], pooling="none", normalize=-1)[0].astype(np.float64)
    np.testing.assert_allclose(rows.mean(0), full[0], rtol=1e-5, atol=1e-6)  # the projection is linear


def test_a_vector_is_the_same_bits_however_it_is_batched(gemma_embedding):
    """One input alone, among others in the same steps, reversed, at one and two threads."""
    texts = TEXTS + [f"filler sentence number {i} about nothing much" for i in range(12)]
    one = compiler.load(gemma_embedding, n_seq=8, threads=1)
    two = compiler.load(gemma_embedding, n_seq=8, threads=2)
    together = two.embed(texts)
    assert together[::-1].tobytes() == two.embed(texts[::-1]).tobytes()
    assert together.tobytes() == one.embed(texts).tobytes()
    for i in (0, 3, 9):
        assert one.embed([texts[i]]).tobytes() == together[i:i + 1].tobytes()


def test_the_layout_holds_the_whole_input_in_one_group(gemma_embedding, tmp_path):
    """A bidirectional model's pool lives one step: its sliding layers share the full group (the
    window is attention's mask), and the step takes the longest input the model accepts."""
    m = compiler.load(gemma_embedding, n_seq=2)
    assert m.windows == (0,) and m.options.batch_tokens >= m.n_ctx == 256
    q8 = compiler.load(gemma_embedding, n_seq=2, kv_dtype="q8_0")  # a quantized cache, read the same way
    assert _cos(q8.embed(TEXTS).astype(np.float64), m.embed(TEXTS).astype(np.float64)).min() > 0.999


def test_a_quantized_file(tiny, smollm2):
    """Q8_0 weights: the same mask and window, within Q8_0's error of the F32 file's vectors."""
    f32 = compiler.load(tiny("gemma-embedding", tokenizer_from=smollm2, **_spec()), n_seq=4).embed(TEXTS)
    q8 = compiler.load(tiny("gemma-embedding", tokenizer_from=smollm2, **_spec(wtype=Q.Q8_0)), n_seq=4).embed(TEXTS)
    assert _cos(f32.astype(np.float64), q8.astype(np.float64)).min() > 0.999
