"""Reading GGUF files into a ModelSpec, on the real bundled models and on broken synthetic ones."""
from __future__ import annotations

import pytest
from gguf import GGMLQuantizationType as Q

from compiler.core.dtypes import DType
from compiler.core.errors import ModelFileError
from compiler.frontend.gguf_reader import read_model


def test_smollm2_hparams_and_tensors(smollm2):
    m = read_model(smollm2)
    hp = m.hparams
    assert m.arch == "llama"
    assert (hp.n_layer, hp.n_embd, hp.n_ff, hp.n_head, hp.n_head_kv, hp.head_dim) == (30, 576, 1536, 9, 3, 64)
    assert hp.n_vocab == 49152 and hp.rope_base == 100000.0 and hp.sliding_window is None
    emb = m.tensors["token_embd.weight"]
    assert (emb.dtype, emb.shape, emb.offset, emb.nbytes) == (DType.Q8_0, (49152, 576), 1785664, 30081024)
    assert m.tensors["blk.0.attn_q.weight"].dtype is DType.Q4_1
    assert len(m.tensors) == 2 + 30 * 9
    assert "output.weight" not in m.tensors  # tied head
    assert m.data_offset <= min(t.offset for t in m.tensors.values())


def test_smollm2_tokenizer_metadata(smollm2):
    tok = read_model(smollm2).tokenizer
    assert (tok.model, tok.pre) == ("gpt2", "smollm")
    assert len(tok.tokens) == 49152 and len(tok.merges) == 48900
    assert (tok.bos_id, tok.eos_id, tok.add_bos) == (1, 2, False)
    assert tok.chat_template.startswith("{% for message in messages %}")


def test_gemma3_hparams(gemma3):
    m = read_model(gemma3)
    hp = m.hparams
    assert m.arch == "gemma3"
    assert (hp.n_layer, hp.n_embd, hp.n_ff, hp.n_head, hp.n_head_kv, hp.head_dim) == (18, 640, 2048, 4, 1, 256)
    assert hp.sliding_window == 512 and hp.rope_base == 1_000_000.0
    assert {t.dtype for t in m.tensors.values()} == {DType.F32, DType.Q8_0, DType.Q5_0, DType.Q4_K, DType.Q6_K}
    tok = m.tokenizer
    assert tok.model == "llama" and len(tok.tokens) == 262144 and tok.add_bos and tok.bos_id == 2
    assert tok.tokens[105] == "<start_of_turn>"


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "gemma3"])
def test_synthetic_archs_read(tiny, arch):
    m = read_model(tiny(arch, wtype=Q.Q8_0))
    assert m.arch == arch and m.hparams.n_layer == 2
    assert m.tensors["blk.1.ffn_up.weight"].dtype is DType.Q8_0
    assert ("blk.0.attn_q.bias" in m.tensors) == (arch == "qwen2")
    assert ("blk.0.attn_q_norm.weight" in m.tensors) == (arch in ("qwen3", "gemma3"))


def test_not_a_gguf(tmp_path):
    p = tmp_path / "model.gguf"
    p.write_bytes(b"PK\x03\x04" + bytes(100))
    with pytest.raises(ModelFileError, match=r"model\.gguf: not a GGUF file"):
        read_model(p)


def test_empty_and_missing_files(tmp_path):
    p = tmp_path / "empty.gguf"
    p.write_bytes(b"")
    with pytest.raises(ModelFileError, match="not a GGUF file"):
        read_model(p)
    with pytest.raises(ModelFileError, match="cannot open model file"):
        read_model(tmp_path / "nope.gguf")


@pytest.mark.parametrize("keep", [0.999, 0.5, 0.05])
def test_truncated(tiny, tmp_path, keep):
    src = tiny("llama").read_bytes()
    p = tmp_path / "cut.gguf"
    p.write_bytes(src[: int(len(src) * keep)])
    with pytest.raises(ModelFileError, match=r"cut\.gguf: .*truncated"):
        read_model(p)


def test_truncated_real_model(smollm2, tmp_path):
    p = tmp_path / "smol-cut.gguf"
    with open(smollm2, "rb") as f:
        p.write_bytes(f.read(40_000_000))
    with pytest.raises(ModelFileError, match=r"smol-cut\.gguf: .*truncated"):
        read_model(p)


def test_unknown_architecture(tiny):
    with pytest.raises(ModelFileError, match=r"unknown architecture 'mamba9'.*supported: bert, gemma-embedding, gemma2, gemma3, gemma4, gpt-oss, granite, jina-bert-v2, llama, nomic-bert, nomic-bert-moe, olmoe, phi3, qwen2, qwen3, qwen35, qwen35moe, qwen3moe, qwen3next, smollm3"):
        read_model(tiny("llama", metadata_arch="mamba9"))


def test_unsupported_quant_type_names_tensor(tiny):
    p = tiny("llama", n_embd=256, types={"blk.1.attn_q.weight": Q.NVFP4})
    with pytest.raises(ModelFileError, match=r"tensor 'blk\.1\.attn_q\.weight' has quant type NVFP4"):
        read_model(p)


def test_head_dim_above_the_kernels_limit_is_refused(tiny):
    p = tiny("llama", n_embd=1024, n_head=1, n_head_kv=1, head_dim=1024, n_ff=64, n_layer=1)
    with pytest.raises(ModelFileError, match=r"head_dim 1024 \(attention\.key_length\) is above 512"):
        read_model(p)


@pytest.mark.parametrize("arch,meta,match", [
    ("gemma3", {"rope.scaling.type": "linear", "rope.scaling.factor": 4.0}, "gemma3.rope.scaling"),
    ("gemma3", {"rope.scaling.type": "yarn"}, "'gemma3.rope.scaling.type' = 'yarn'"),
    ("llama", {"rope.scaling.type": "longrope"}, "'llama.rope.scaling.type' = 'longrope'.*implements none, linear, yarn"),
    # Llama 3's scaling travels as rope_freqs.weight; llama.cpp itself stops on this type
    ("llama", {"rope.scaling.type": "llama3", "rope.scaling.factor": 8.0}, "'llama.rope.scaling.type' = 'llama3'"),
    ("qwen3", {"rope.scaling.type": "yarn", "rope.scaling.yarn_log_multiplier": 0.1},
     "qwen3.rope.scaling.yarn_log_multiplier"),
    ("llama", {"expert_count": 8, "expert_used_count": 2}, "llama.expert_count"),
    ("llama", {"attn_logit_softcapping": 50.0}, "llama.attn_logit_softcapping"),  # gemma2's, not llama's
    ("llama", {"final_logit_softcapping": 30.0}, "llama.final_logit_softcapping"),
    ("llama", {"embedding_scale": 12.0}, "llama.embedding_scale"),  # granite's
    ("llama", {"attention.scale": 0.125}, "llama.attention.scale"),
    ("phi3", {"rope.scaling.yarn_beta_fast": 16.0}, "phi3.rope.scaling.yarn_beta_fast"),  # yarn's, not longrope's
    ("granite", {"logit_scale": 2.0, "rope.scaling.finetuned": False}, "'granite.rope.scaling.finetuned' = False"),
    ("llama", {"attention.layer_norm_epsilon": 1e-5}, "llama.attention.layer_norm_epsilon"),
])
def test_hyperparameters_kiln_does_not_implement_are_refused(tiny, arch, meta, match):
    with pytest.raises(ModelFileError, match=match) as e:
        read_model(tiny(arch, extra_meta=meta))
    assert "does not implement" in str(e.value) and f"tiny-{arch}.gguf" in str(e.value)


def test_an_architecture_accepts_the_keys_its_template_reads(tiny):
    """The same key, implemented for one architecture and refused for another: Gemma 2's caps, granite's
    scalars, RoPE scaling where the template takes it (with llama.cpp's defaults where absent)."""
    gemma2 = read_model(tiny("gemma2", extra_meta={"attn_logit_softcapping": 5.0, "final_logit_softcapping": 20.0}))
    assert gemma2.hparams.scalar("attn_logit_softcapping") == 5.0 and gemma2.hparams.rope_scaling == "none"
    hp = read_model(tiny("qwen2", extra_meta={"rope.scaling.type": "yarn", "rope.scaling.factor": 4.0})).hparams
    assert (hp.rope_scaling, hp.rope_scaling_factor, hp.rope_n_ctx_orig) == ("yarn", 4.0, 512)  # the training context
    assert (hp.yarn_beta_fast, hp.yarn_beta_slow) == (32.0, 1.0)
    hp = read_model(tiny("llama", extra_meta={"rope.scaling.factor": 2.0})).hparams
    assert (hp.rope_scaling, hp.rope_scaling_factor) == ("linear", 2.0)  # llama.cpp's type when only a factor is set
    hp = read_model(tiny("llama", extra_meta={"rope.scaling.type": "none", "rope.scaling.factor": 2.0})).hparams
    assert (hp.rope_scaling, hp.rope_scaling_factor, hp.rope_scaled) == ("none", 1.0, False)  # none never scales
    with pytest.raises(ModelFileError, match=r"tensor 'rope_freqs\.weight' \(per-dimension rope frequency factors\) "
                                             r"is not implemented by kiln for qwen2"):
        read_model(tiny("qwen2", extra_tensors={"rope_freqs.weight": (1.0,) * 8}))
    with pytest.raises(ModelFileError, match=r"'rope_freqs\.weight' is F32 \[4\]; rope factors are F32 \[8\]"):
        read_model(tiny("llama", extra_tensors={"rope_freqs.weight": (1.0,) * 4}))


def test_neutral_values_of_those_hyperparameters_are_accepted(tiny):
    spec = read_model(tiny("llama", extra_meta={"rope.scaling.type": "none", "rope.scaling.factor": 1.0,
                                                "expert_count": 0, "attention.causal": True}))
    assert spec.hparams.n_layer == 2


@pytest.mark.parametrize("shapes,match", [
    ({"token_embd.weight": (200, 64)}, "'token_embd.weight' is \\[200, 64\\] but the vocabulary has 259"),
    ({"output.weight": (300, 128)}, "'output.weight' is \\[300, 128\\]"),
])
def test_vocabulary_tensors_must_cover_the_vocabulary(tiny, shapes, match):
    # qwen2 writes an untied output.weight (n_embd 128 here)
    path = tiny("qwen2", n_embd=128, shapes=shapes) if "output" in match else tiny("llama", shapes=shapes)
    with pytest.raises(ModelFileError, match=match):
        read_model(path)


def test_block_count_must_match_the_blocks_in_the_file(tiny):
    """The planner loops over block_count: a file claiming more blocks than it holds is refused
    before anything is sized by it."""
    drop = tuple(f"blk.1.{t}.weight" for t in ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm",
                                                 "ffn_gate", "ffn_up", "ffn_down"))
    with pytest.raises(ModelFileError, match="block_count is 2 but the file holds tensors for 1 blocks"):
        read_model(tiny("llama", drop=drop))
