"""jina-embeddings-v2's body (`jina-bert-v2`) on a synthetic file: BERT's post-LayerNorm encoder with
ALiBi in place of learned positions and a GEGLU FFN held in one ffn_up. Against a float64 forward
pass of the same GGUF (tests/encoder_reference.py) and llama.cpp's vectors; the controls show the
test sees the ALiBi bias and the GLU's halves."""
from __future__ import annotations

import numpy as np
import pytest

import compiler
from bert_synthetic import write_bert
from compiler.frontend.registry import BUNDLED, fetch
from encoder_reference import GgufBert
from test_embeddings import _cos, llama_rows

TEXTS = ["what is attention with linear biases?", "a", "ALiBi adds to each score a penalty that grows with the "
         "distance between query and key, one slope a head, so the model needs no learned positions at all.",
         "jina embeddings v2 take inputs of up to 8192 tokens"]


@pytest.fixture(scope="module")
def jina(tmp_path_factory):
    # six heads: past the power of two, the second series of slopes (m1) is used too
    return write_bert(tmp_path_factory.mktemp("jina") / "jina.gguf", fetch(BUNDLED["minilm"]), n_embd=96, n_head=6,
                      arch="jina-bert-v2", pooling=1)


def _exact(path, ids, max_bias: float = 8.0, swap_halves: bool = False) -> np.ndarray:
    ref = GgufBert(path)
    ref.max_bias = max_bias
    if swap_halves:  # the control: up's rows taken as the gate's
        for name in [n for n in ref.t if n.endswith("ffn_up.weight") or n.endswith("ffn_up.bias")]:
            ref.t[name] = np.concatenate(np.split(ref.t[name], 2)[::-1])
    return np.stack([ref.hidden(i).mean(0) for i in ids])


def test_against_float64_and_llamacpp(jina):
    """Within 1e-6 of the largest float64 value; cosine >= 0.9999 to llama.cpp's vectors (whose GEGLU
    takes the tanh form, kiln's the erf one jina's code uses: kiln is the nearer to float64). The
    float64 pass without ALiBi, or with the GLU's halves swapped, lies far from kiln's vectors."""
    m = compiler.load(jina, n_seq=4)
    ids = [m.tokenize(t) for t in TEXTS]
    exact = _exact(jina, ids)
    mine = m.embed(TEXTS, normalize=-1).astype(np.float64)
    scale = np.abs(exact).max()
    err = np.abs(mine - exact).max(1) / scale
    assert err.max() < 1e-6, err  # 2e-7 here; llama.cpp 2.7e-4 (its tanh GELU)
    theirs = np.stack(llama_rows(jina, ids, 1))
    assert _cos(mine, theirs).min() >= 0.9999
    assert (err <= np.abs(theirs - exact).max(1) / scale).all()
    for control in (dict(max_bias=0.0), dict(swap_halves=True)):
        wrong = _exact(jina, ids, **control)
        assert np.abs(mine - wrong)[[0, 2, 3]].max() / scale > 1e-3, control  # 1,000 times the bound


def test_a_vector_is_the_same_bits_however_it_is_batched(jina):
    """One input alone, among others in the same steps, reversed, at one and two threads."""
    texts = TEXTS + [f"padding sentence {i}, of no interest" for i in range(10)]
    one, two = compiler.load(jina, n_seq=8, threads=1), compiler.load(jina, n_seq=8, threads=2)
    together = two.embed(texts)
    assert together[::-1].tobytes() == two.embed(texts[::-1]).tobytes()
    assert together.tobytes() == one.embed(texts).tobytes()
    for i in (0, 2, 7):
        assert one.embed([texts[i]]).tobytes() == together[i:i + 1].tobytes()


def test_a_file_whose_ffn_up_is_not_two_halves_is_refused(tmp_path):
    """An older conversion split the GLU into ffn_up and ffn_gate: refused by the tensor's name."""
    path = write_bert(tmp_path / "bert-as-jina.gguf", fetch(BUNDLED["minilm"]), arch="bert")
    import gguf
    r = gguf.GGUFReader(str(path))
    assert r.fields["general.architecture"].contents() == "bert"
    from compiler.core.errors import ModelFileError
    bad = tmp_path / "jina-split.gguf"
    w = gguf.GGUFWriter(str(bad), "jina-bert-v2")
    for f in r.fields.values():
        if f.name.startswith("bert."):
            w.add_key_value(f.name.replace("bert.", "jina-bert-v2.", 1), f.contents(), f.types[0],
                            f.types[1] if f.types[0] == gguf.GGUFValueType.ARRAY else None)
        elif f.name.startswith("tokenizer."):
            w.add_key_value(f.name, f.contents(), f.types[0], f.types[1] if f.types[0] == gguf.GGUFValueType.ARRAY else None)
    for t in r.tensors:
        if t.name != "position_embd.weight":
            w.add_tensor(t.name, np.asarray(t.data).reshape(tuple(reversed([int(d) for d in t.shape]))))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ModelFileError, match=r"ffn_up.weight' has 128 rows.*jina-bert-v2"):
        compiler.load(bad)
