"""Embeddings and reranking: the bundled all-MiniLM-L6-v2 (converted by kiln) against a float64
forward pass of its safetensors and against llama.cpp's vectors of the same GGUF; synthetic BERTs
(every pooling, a reranker's class head) against a float64 pass of the GGUF; a decoder pooled by
its last token against llama.cpp; and a vector's bits whatever shares its steps."""
from __future__ import annotations

import numpy as np
import pytest

import compiler
from bert_reference import BertReference
from bert_synthetic import write_bert
from compiler.core.errors import OptionError
from compiler.frontend.convert import convert
from compiler.frontend.registry import BUNDLED, fetch, source_folder
from compiler.runtime.status import ModelError
from encoder_reference import GgufBert
from means import skip_for_want_of

# queries, sentences and paragraphs: accents, digits, punctuation, case, one near the 256-token
# length sentence-transformers cuts MiniLM's inputs at
CORPUS = [
    "what is the capital of france?", "Paris is the capital and most populous city of France.",
    "How do I reset my password?", "Click 'Forgot password' on the sign-in page and follow the e-mail link.",
    "A café in Zürich serves crème brûlée; prices rose 12.5% in 2024!", "GPU", "i",
    "The mitochondria is the powerhouse of the cell.", "Python 3.12 adds a per-interpreter GIL (PEP 684).",
    "naïve résumé coöperate façade", "Tokyo, Japan — population 37,400,068 (2018 est.)",
    "UPPER CASE TEXT SHOULD BE LOWERED BY THE TOKENIZER", "emoji 🙂 and symbols ™ ® © are unknown pieces",
    "Retrieval-augmented generation grounds a language model's answers in documents it is given.",
    " ".join(["Vector search finds the documents nearest a query in embedding space."] * 16),
    "The quick brown fox jumps over the lazy dog. " * 5, "1 2 3 4 5 6 7 8 9 10", "?!?!... ;;; ---",
    "Machine learning models are trained on data; inference applies them to new inputs.",
    "Where can I buy a used bicycle in Amsterdam?",
]


def _cos(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def llama_rows(path, ids_list, pooling: int, causal: bool = False) -> list[np.ndarray]:
    """llama.cpp's pooled output of each token id list, one sequence at a time (llama-cpp-python's
    own calls, fed ids rather than text)."""
    import llama_cpp

    lm = llama_cpp.Llama(model_path=str(path), embedding=True, pooling_type=pooling, n_ctx=512, n_batch=512,
                         n_ubatch=512, verbose=False)
    out = []
    for ids in ids_list:
        lm._batch.reset()
        lm._ctx.kv_cache_clear()
        lm._batch.add_sequence(ids, 0, True)
        lm._ctx.decode(lm._batch)
        out.append(np.array(llama_cpp.llama_get_embeddings_seq(lm._ctx.ctx, 0)[:lm.n_embd()], np.float64))
    lm.close()
    return out


@pytest.fixture(scope="module")
def minilm():
    return fetch(BUNDLED["minilm"])


@pytest.fixture(scope="module")
def minilm_f32(minilm, tmp_path_factory):
    return convert(source_folder(BUNDLED["minilm"]), tmp_path_factory.mktemp("minilm") / "minilm-f32.gguf", "f32")


@pytest.fixture(scope="module")
def reference(minilm):
    return BertReference(source_folder(BUNDLED["minilm"]))


@pytest.mark.parametrize("which", ["f32", "f16"])
def test_minilm_matches_float64_and_llamacpp(which, minilm, minilm_f32, reference):
    """Every text: cosine >= 0.9999 to the float64 vectors (mean pooling, L2, as sentence-transformers)
    and to llama.cpp's; from F32 weights kiln is nearer exact than llama.cpp, by orders of magnitude."""
    path = minilm_f32 if which == "f32" else minilm
    m = compiler.load(path, n_seq=8)
    ids = [m.tokenize(t) for t in CORPUS]
    assert max(map(len, ids)) > 200
    mine = m.embed(CORPUS).astype(np.float64)
    exact = np.stack([reference.embed([i])[0] for i in ids])
    theirs = np.stack([v / np.linalg.norm(v) for v in llama_rows(path, ids, 1)])
    assert _cos(mine, exact).min() >= 0.9999 and _cos(theirs, exact).min() >= 0.9999
    assert _cos(mine, theirs).min() >= 0.9999
    err, their_err = np.abs(mine - exact).max(), np.abs(theirs - exact).max()
    print(f"{which}: max |kiln - exact| {err:.3g}, |llama.cpp - exact| {their_err:.3g}")
    assert err < their_err / (100 if which == "f32" else 1.5)
    if which == "f32":
        assert err < 1e-6  # float32 rounding, and nothing else


def test_a_vector_is_the_same_bits_whatever_shares_its_steps(minilm):
    """One input alone, among 31 others (several steps of several sequences each), in reverse
    order, and at 1 and 2 threads: the same bytes."""
    texts = CORPUS + [f"document number {i} about topic {i % 5}" for i in range(12)]
    assert len(texts) == 32
    alone = {t: compiler.load(minilm, n_seq=1, threads=t).embed([CORPUS[3]])[0] for t in (1, 2)}
    for threads in (1, 2):
        m = compiler.load(minilm, n_seq=8, threads=threads)
        together, backwards = m.embed(texts), m.embed(texts[::-1])
        assert together[3].tobytes() == alone[1].tobytes() == alone[threads].tobytes()
        assert together.tobytes() == backwards[::-1].tobytes()


@pytest.fixture(scope="module")
def bert(minilm, tmp_path_factory):
    """A synthetic BERT with a reranker's class head, mean pooling in its file."""
    return write_bert(tmp_path_factory.mktemp("bert") / "bert.gguf", minilm, class_head=True, pooling=1)


def test_every_pooling_against_float64(bert):
    m = compiler.load(bert, n_seq=4)
    ref = GgufBert(bert)
    texts = ["hello world", "a longer sentence about bidirectional attention in encoders", "x"]
    ids = [m.tokenize(t) for t in texts]
    hidden = [ref.hidden(i) for i in ids]
    for kind, pick in (("mean", lambda h: h.mean(0)), ("cls", lambda h: h[0]), ("last", lambda h: h[-1])):
        got = m.embed(texts, pooling=kind, normalize=-1)
        want = np.stack([pick(h) for h in hidden])
        assert np.abs(got - want).max() < 1e-4 * np.abs(want).max(), kind
    rows = m.embed(texts, pooling="none", normalize=-1)
    for got, h in zip(rows, hidden):
        assert got.shape == h.shape and np.abs(got - h).max() < 1e-4 * np.abs(h).max()
    mean = np.stack([h.mean(0) for h in hidden])
    for p in (0, 1, 2, 3):
        got = m.embed(texts, pooling="mean", normalize=p)
        norm = np.abs(mean).max(1) / 32760 if p == 0 else (np.abs(mean) ** p).sum(1) ** (1 / p)
        assert np.abs(got - mean / norm[:, None]).max() < 1e-5 * np.abs(mean / norm[:, None]).max(), p
    cut = m.embed(texts, dimensions=8)
    want = mean[:, :8] / np.linalg.norm(mean[:, :8], axis=1, keepdims=True)
    assert cut.shape == (3, 8) and np.abs(cut - want).max() < 1e-5


def test_attention_sees_the_whole_input(bert):
    """An encoder's first token depends on the last one: the CLS vectors of two inputs that differ
    only in their last word differ (a causal mask would make them equal)."""
    m = compiler.load(bert)
    a, b = m.embed(["the cat sat on the mat", "the cat sat on the hat"], pooling="cls")
    assert np.abs(a - b).max() > 1e-3


def test_rank_head_against_float64_and_llamacpp(bert):
    """Scores within 1e-4 of the float64 head; llama.cpp's (its GELU is ggml's tanh form, looked up
    in f16) are further from exact than kiln's on every pair."""
    m = compiler.load(bert, n_seq=4)
    query, docs = "what do cats eat", ["cats eat fish and mice", "the stock market fell", "kittens drink milk"]
    scores = m.rerank(query, docs)
    ids = [m.tokenize(query) + m.tokenize(d)[1:] for d in docs]  # [CLS] q [SEP] d [SEP]
    from compiler.runtime.embedding import rerank_ids
    assert [rerank_ids(m, query, d) for d in docs] == ids
    ref = GgufBert(bert)
    exact = np.array([ref.score(i) for i in ids])
    theirs = np.array([v[0] for v in llama_rows(bert, ids, 4)])
    assert np.abs(scores - exact).max() < 1e-4
    assert (np.abs(scores - exact) < np.abs(theirs - exact)).all()
    assert np.abs(theirs - exact).max() < 1e-2


def test_a_decoder_pooled_by_its_last_token_matches_llamacpp(tiny, smollm2):
    """Qwen3-Embedding's recipe on a synthetic qwen3: embedding=True, last-token pooling, L2;
    against llama.cpp's LAST pooling of the same file. A causal input longer than a step is taken
    in chunks, with the same bits as in one step."""
    path = tiny("qwen3", tokenizer_from=smollm2)
    m = compiler.load(path, embedding=True, n_seq=4, batch_tokens=64)
    ids = [[(7 * i + 3) % 200 + 3 for i in range(n)] for n in (5, 17, 40)]
    mine = m.embed(ids, pooling="last")
    theirs = np.stack([v / np.linalg.norm(v) for v in llama_rows(path, ids, 3, causal=True)])
    assert _cos(mine.astype(np.float64), theirs).min() >= 0.9999
    small = compiler.load(path, embedding=True, n_seq=4, batch_tokens=16, prefill_chunk=16)
    assert small.embed(ids, pooling="last").tobytes() == mine.tobytes()


def test_a_qwen3_reranker_scores_as_llamacpp(tiny, smollm2):
    """Qwen3-Reranker's recipe on a synthetic qwen3: rank pooling of the last token through its two-row
    cls.output (yes, no) and a softmax; the score, p(yes), within 1e-5 of llama.cpp's."""
    rng = np.random.default_rng(3)
    path = tiny("qwen3", tokenizer_from=smollm2, extra_meta={"pooling_type": 4, "classifier.output_labels": ["yes", "no"]},
                extra_tensors={"cls.output.weight": (rng.standard_normal((2, 64)) * 0.5).tolist()})
    m = compiler.load(path, embedding=True, n_seq=4)
    docs = ["cats eat fish", "the stock market fell", "kittens drink milk"]
    scores = m.rerank("what do cats eat", docs)
    from compiler.runtime.embedding import rerank_ids
    theirs = np.array([v[0] for v in llama_rows(path, [rerank_ids(m, "what do cats eat", d) for d in docs], 4)])
    assert 0 < scores.min() and scores.max() < 1 and np.abs(scores - theirs).max() < 1e-5, (scores, theirs)


def test_nomic_bert_against_float64_and_llamacpp(minilm, tmp_path):
    """nomic-embed-text's body on a synthetic file: rotary positions, fused QKV, SwiGLU, post-LN,
    bidirectional; mean pooling. Near float64 (1e-5 of the largest value), and llama.cpp's vectors at
    cosine >= 0.9999."""
    path = write_bert(tmp_path / "nomic.gguf", minilm, arch="nomic-bert", pooling=1)
    m = compiler.load(path, n_seq=4)
    texts = ["search_query: what is a rotary embedding", "search_document: rotary embeddings rotate q and k",
             "a"]
    ids = [m.tokenize(t) for t in texts]
    ref = GgufBert(path)
    exact = np.stack([ref.hidden(i).mean(0) for i in ids])
    mine = m.embed(texts, normalize=-1).astype(np.float64)
    assert np.abs(mine - exact).max() < 1e-5 * np.abs(exact).max()
    theirs = np.stack(llama_rows(path, ids, 1))
    assert _cos(mine, theirs).min() >= 0.9999


@pytest.fixture(scope="module")
def nomic_vocab():
    """nomic-embed-text-v2-moe's Unigram vocabulary (llama.cpp's ggml-vocab-nomic-bert-moe.gguf)."""
    from test_tokenizer_ugm import NOMIC
    if not NOMIC.is_file():
        skip_for_want_of(f"llama.cpp's vocabularies at {NOMIC.parent}", "`make vocab` unpacks them", apt=False)
    return NOMIC


def test_nomic_bert_moe_against_float64_and_llamacpp(nomic_vocab, tmp_path):
    """nomic-embed-text-v2-moe's body on a synthetic file with its Unigram vocabulary: nomic-bert's
    attention with biases, GELU FFNs with biases in even layers, and in odd ones (moe_every_n_layers
    2) a softmax router's top 2 of 8 experts without a gate (up, GELU, down), weighted by their
    probabilities as they are; mean pooling. Near float64 (cosine >= 0.9999, within 1e-6 of the
    largest value: float32 rounding, a hundredth of llama.cpp's error, whose GELU is ggml's tanh form
    from an f16 table), llama.cpp's vectors at cosine >= 0.9999, and the same bits at 1 and 2 threads."""
    path = write_bert(tmp_path / "nomic-moe.gguf", nomic_vocab, arch="nomic-bert-moe", n_layer=4, pooling=1)
    m = compiler.load(path, n_seq=4, threads=2)
    texts = ["search_query: what is a mixture of experts", "search_document: a router picks two experts a token",
             "a", "Где находится Эйфелева башня?", "東京は日本の首都です。"]
    ids = [m.tokenize(t) for t in texts]
    ref = GgufBert(path)
    exact = np.stack([ref.hidden(i).mean(0) for i in ids])
    assert len(set(ref.routed)) > 2  # the router's choice varies from token to token
    mine = m.embed(texts, normalize=-1).astype(np.float64)
    theirs = np.stack(llama_rows(path, ids, 1))
    err, their_err = (np.abs(v - exact).max() / np.abs(exact).max() for v in (mine, theirs))
    print(f"\nnomic-bert-moe: kiln vs float64 cosine {_cos(mine, exact).min():.9f}, max error {err:.2e} of the largest; "
          f"llama.cpp vs float64 {_cos(theirs, exact).min():.9f}, {their_err:.2e}; kiln vs llama.cpp "
          f"{_cos(mine, theirs).min():.9f}")
    assert _cos(mine, exact).min() >= 0.9999 and err < 1e-6 and err < their_err / 100
    assert _cos(mine, theirs).min() >= 0.9999
    one = compiler.load(path, n_seq=4, threads=1).embed(texts, normalize=-1)
    assert one.tobytes() == mine.astype(np.float32).tobytes()


def test_bad_input_is_refused_by_name(bert, tiny):
    m = compiler.load(bert)
    for bad, words in (([], "expected"), ([""], r"input\[0\]: the input is empty"), (["ok", ""], r"input\[1\]"),
                       ([[1] * 200], "at most 128")):
        with pytest.raises(ModelError, match=words):
            m.embed(bad)
    with pytest.raises(OptionError, match="pooling must be one of"):
        m.embed(["x"], pooling="max")
    with pytest.raises(OptionError, match="dimensions must be an integer from 1 to the model's 64"):
        m.embed(["x"], dimensions=65)
    with pytest.raises(OptionError, match="normalize"):
        m.embed(["x"], normalize=99)
    with pytest.raises(ModelError, match="documents"):
        m.rerank("q", [])
    plain = compiler.load(tiny("llama"))
    with pytest.raises(ModelError, match="embedding=True"):
        plain.embed(["x"])
