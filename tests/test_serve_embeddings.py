"""Retrieval in a real `kiln serve`: the `openai` client's embeddings.create against the bundled
MiniLM, bit for bit Model.embed's vectors (base64 and float, texts and token ids, dimensions);
concurrent requests packed into shared steps, a text's vector the same whatever it shared them
with; /v1/rerank against a synthetic reranker; every bad field a 400 that names it, and the
server clean after."""
from __future__ import annotations

import base64
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import compiler
from bert_synthetic import write_bert
from compiler.frontend.registry import BUNDLED, fetch
from server_process import KEY, Server

ALIAS = "minilm"
TEXTS = ["what is the capital of france?", "Paris is the capital of France.", "How do I reset my password?",
         "A café in Zürich serves crème brûlée; prices rose 12.5% in 2024!"]


@pytest.fixture(scope="module")
def minilm():
    return fetch(BUNDLED["minilm"])


@pytest.fixture(scope="module")
def server(minilm):
    s = Server("--n-seq", "8", "--api-key", KEY, "--alias", ALIAS, model=str(minilm))
    yield s
    s.stop()


@pytest.fixture(scope="module")
def local(minilm):
    return compiler.load(minilm, n_seq=8)


def _vectors(response) -> np.ndarray:
    return np.array([d.embedding for d in response.data], np.float32)


def test_the_openai_client_gets_model_embed_bit_for_bit(server, local):
    c = server.client()
    got = c.embeddings.create(model=ALIAS, input=TEXTS)  # the client asks for base64 and decodes it
    assert [d.index for d in got.data] == list(range(len(TEXTS)))
    assert got.usage.prompt_tokens == sum(len(local.tokenize(t)) for t in TEXTS) == got.usage.total_tokens
    want = local.embed(TEXTS)
    assert _vectors(got).tobytes() == want.tobytes()
    floats = c.embeddings.create(model=ALIAS, input=TEXTS[0], encoding_format="float")
    assert _vectors(floats).tobytes() == want[:1].tobytes()
    cut = c.embeddings.create(model=ALIAS, input=TEXTS, dimensions=128)
    assert _vectors(cut).tobytes() == local.embed(TEXTS, dimensions=128).tobytes()
    ids = [local.tokenize(t) for t in TEXTS]
    assert _vectors(c.embeddings.create(model=ALIAS, input=ids)).tobytes() == want.tobytes()
    assert _vectors(c.embeddings.create(model=ALIAS, input=ids[1])).tobytes() == want[1:2].tobytes()
    raw = server.http.post(server.url + "/v1/embeddings", headers={"Authorization": f"Bearer {KEY}"},
                           json={"model": ALIAS, "input": TEXTS[2], "encoding_format": "base64"}).json()
    assert np.frombuffer(base64.b64decode(raw["data"][0]["embedding"]), "<f4").tobytes() == want[2].tobytes()


def test_concurrent_requests_share_steps_and_change_no_bit(server, local):
    """Twelve requests at once, each with the same probe text among others of its own: every copy
    of the probe's vector is the same bits as alone, and the metrics count every input."""
    before = server.metric("kiln_embedding_inputs_total")
    probe = TEXTS[3]
    bodies = [[f"request {i} sentence {j} about topic {i * j % 7}" for j in range(i % 4 + 1)] + [probe]
              for i in range(12)]
    with ThreadPoolExecutor(12) as pool:
        got = list(pool.map(lambda b: _vectors(server.client().embeddings.create(model=ALIAS, input=b)), bodies))
    alone = local.embed([probe])[0].tobytes()
    assert all(v[-1].tobytes() == alone for v in got)
    for body, v in zip(bodies, got):
        assert v.tobytes() == local.embed(body).tobytes()
    assert server.metric("kiln_embedding_inputs_total") - before == sum(map(len, bodies))
    server.assert_clean()


@pytest.mark.parametrize("body, field", [
    ({"input": []}, "input"),
    ({"input": ""}, "input"),
    ({"input": ["ok", ""]}, "input"),
    ({"input": ["x"] * 2049}, "input"),
    ({"input": [[]]}, "input"),
    ({"input": [[1, 2, 99999999]]}, "input"),
    ({"input": [[101] * 600]}, "input"),
    ({"input": "word " * 700}, "input"),
    ({"input": "x", "dimensions": 385}, "dimensions"),
    ({"input": "x", "dimensions": 0}, "dimensions"),
    ({"input": "x", "encoding_format": "hex"}, "encoding_format"),
    ({"input": "x", "embd_normalize": 99}, "embd_normalize"),
    ({"input": 7}, "input"),
])
def test_bad_fields_are_400s_that_name_them(server, body, field):
    r = server.http.post(server.url + "/v1/embeddings", headers={"Authorization": f"Bearer {KEY}"},
                         json={"model": ALIAS, **body})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == field or field in r.json()["error"]["message"], r.text


def test_routes_the_model_cannot_serve_say_so(server):
    h = {"Authorization": f"Bearer {KEY}"}
    r = server.http.post(server.url + "/v1/embeddings", headers=h, json={"model": "other", "input": "x"})
    assert r.status_code == 404
    r = server.http.post(server.url + "/v1/chat/completions", headers=h,
                         json={"model": ALIAS, "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 400 and "/v1/embeddings" in r.json()["error"]["message"]
    r = server.http.post(server.url + "/v1/rerank", headers=h, json={"query": "q", "documents": ["d"]})
    assert r.status_code == 400 and "classification head" in r.json()["error"]["message"]
    assert server.http.post(server.url + "/v1/embeddings", json={"model": ALIAS, "input": "x"}).status_code == 401
    server.assert_clean()


def test_rerank_sorted_scores_of_the_class_head(minilm, tmp_path):
    path = write_bert(tmp_path / "reranker.gguf", minilm, class_head=True, pooling=4)
    docs = ["cats eat fish and mice", "the stock market fell", "kittens drink milk", "a dog chased a cat"]
    want = compiler.load(path, n_seq=4).rerank("what do cats eat", docs)
    s = Server("--n-seq", "4", "--alias", "reranker", model=str(path))
    try:
        for route in ("/v1/rerank", "/rerank"):
            r = s.http.post(s.url + route, json={"query": "what do cats eat", "documents": docs, "top_n": 3,
                                                 "return_documents": True}).json()
            order = list(np.argsort(-want, kind="stable")[:3])
            assert [x["index"] for x in r["results"]] == order
            assert [x["relevance_score"] for x in r["results"]] == [float(want[i]) for i in order]
            assert [x["document"]["text"] for x in r["results"]] == [docs[i] for i in order]
        for bad, field in (({"documents": []}, "documents"), ({"documents": [""]}, "documents"),
                           ({"query": ""}, "query"), ({"top_n": 0}, "top_n"), ({"model": "other"}, "model")):
            r = s.http.post(s.url + "/v1/rerank", json={"query": "q", "documents": ["d"], **bad})
            assert r.status_code in (400, 404) and (r.json()["error"]["param"] == field
                                                    or field in r.json()["error"]["message"]), r.text
        s.assert_clean()
    finally:
        s.stop()
