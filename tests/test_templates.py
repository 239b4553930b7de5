"""Architecture loading: every shipped template is valid; malformed ones fail by field name."""
from __future__ import annotations

import json

import pytest

from compiler.core.errors import ArchitectureError
from compiler.core.paths import ARCH_DIR
from compiler.frontend.architecture import (AttnVariant, EmbeddingScale, LayerKind, RopeFactors, RopeLayout,
                                            RopeScaling, Scalar, Stage)
from compiler.frontend.architecture_file import available_archs, load_architecture, parse_architecture_file


def test_shipped_templates():
    assert available_archs() == ("bert", "gemma-embedding", "gemma2", "gemma3", "gemma4", "gpt-oss", "granite", "jina-bert-v2", "llama", "nomic-bert", "nomic-bert-moe", "olmoe", "phi3", "qwen2", "qwen3", "qwen35", "qwen35moe", "qwen3moe", "qwen3next", "smollm3")
    llama, qwen2, qwen3, gemma3 = (load_architecture(a) for a in ("llama", "qwen2", "qwen3", "gemma3"))
    assert llama.rope_layout is RopeLayout.PAIRWISE and not llama.qkv_bias and not llama.qk_norm
    assert qwen2.rope_layout is RopeLayout.NEOX and qwen2.qkv_bias
    assert qwen3.qk_norm and not qwen3.qkv_bias
    assert gemma3.qk_norm and gemma3.post_norms and gemma3.attn_variant is AttnVariant.HYBRID_SLIDING
    assert gemma3.rope_base_local == 10000.0
    assert llama.rope_factors is RopeFactors.FREQS and set(llama.rope_scaling) == {RopeScaling.LINEAR, RopeScaling.YARN}
    assert gemma3.rope_scaling == () and gemma3.final_softcap is None


def test_new_architectures_say_what_they_need():
    granite, phi3, gemma2 = (load_architecture(a) for a in ("granite", "phi3", "gemma2"))
    assert granite.embedding_scale is EmbeddingScale.METADATA and granite.residual_scale is Scalar.METADATA
    assert granite.logit_scale is Scalar.METADATA and granite.attention_scale.rule == "metadata"
    assert granite.metadata_keys() == {"embedding_scale", "residual_scale", "attention.scale", "logit_scale"}
    assert dict(granite.requires) == {"rope.scaling.finetuned": (True,)}
    assert phi3.fused_qkv and phi3.fused_ffn_up and phi3.rope_factors is RopeFactors.LONG_SHORT
    assert phi3.rope_scaling == (RopeScaling.LONGROPE,) and phi3.rope_layout is RopeLayout.NEOX
    assert gemma2.attn_softcap == 50.0 and gemma2.final_softcap == 30.0 and not gemma2.qk_norm and gemma2.post_norms
    assert gemma2.rope_base_local is None and gemma2.attention_scale.layers == 46
    assert [gemma2.layer_kind(il) for il in range(4)] == [LayerKind.LOCAL, LayerKind.GLOBAL] * 2  # even ones slide
    # a template that reads no key leaves every one of them to the refusal by name
    assert load_architecture("gemma3").metadata_keys() == frozenset()


def test_gemma3_layer_pattern_every_sixth_is_global():
    t = load_architecture("gemma3")
    kinds = [t.layer_kind(il) for il in range(18)]
    assert [il for il, k in enumerate(kinds) if k is LayerKind.GLOBAL] == [5, 11, 17]
    assert kinds.count(LayerKind.LOCAL) == 15


def test_smollm3_every_fourth_layer_has_no_rope():
    t = load_architecture("smollm3")
    assert [il for il in range(12) if not t.rotates(il)] == [3, 7, 11]
    assert all(load_architecture("llama").rotates(il) for il in range(12))


def _variant(tmp_path, base="llama", **changes):
    raw = json.loads((ARCH_DIR / f"{base}.json").read_text())
    for k, v in changes.items():
        if v is KeyError:
            del raw[k]
        else:
            raw[k] = v
    p = tmp_path / f"{base}.json"
    p.write_text(json.dumps(raw))
    return p


@pytest.mark.parametrize("changes, message", [
    ({"rope_scalling": ["yarn"]}, "unknown field 'rope_scalling'"),
    ({"rope_scaling": ["dynamic"]}, "field 'rope_scaling': 'dynamic' is not a valid RopeScaling"),
    ({"rope_scaling": "yarn"}, "field 'rope_scaling': 'yarn' is not a list"),
    ({"attention_scale": "sqrt"}, "field 'attention_scale'"),
    ({"attn_softcap": 50.0}, "field 'attn_softcap'"),
    ({"rope_factors": "long_short"}, "'rope_factors' long_short goes with 'rope_scaling' longrope"),
    ({"moe_block": ["attn_norm", "qkv", "rope", "attention", "attn_output", "attn_residual", "ffn_norm", "ffn_moe",
                    "ffn_residual"]}, "field 'moe_block' needs 'moe'"),
    ({"activation": KeyError}, "missing field 'activation'"),
    ({"activation": "relu"}, "field 'activation': 'relu' is not a valid Activation"),
    ({"qkv_bias": "yes"}, "field 'qkv_bias'"),
    ({"block": ["attn_norm", "qkv", "attention"]}, "field 'block' must contain"),
    ({"block": ["attn_norm", "qkv", "rope", "attention", "attn_output", "attn_residual", "ffn_norm",
                "ffn_glu", "ffn_down", "ffn_residual", "mystery"]}, "field 'block'.*'mystery' is not a valid Stage"),
    ({"layer_pattern": ["local", "global"]}, "field 'layer_pattern'"),
    ({"arch": "qwen2"}, "field 'arch' is 'qwen2'"),
    ({"nope_layer_step": 1}, "field 'nope_layer_step': 1 is not null or an integer of at least 2"),
])
def test_bad_templates_name_the_field(tmp_path, changes, message):
    with pytest.raises(ArchitectureError, match=message):
        parse_architecture_file(_variant(tmp_path, **changes))


def test_not_json(tmp_path):
    p = tmp_path / "llama.json"
    p.write_text("{ nope")
    with pytest.raises(ArchitectureError, match="not valid JSON"):
        parse_architecture_file(p)


def test_unknown_arch_template():
    with pytest.raises(ArchitectureError, match="no template for architecture 'rwkv9'.*supported: bert, gemma-embedding, gemma2, gemma3, gemma4, gpt-oss, granite, jina-bert-v2, llama"):
        load_architecture("rwkv9")


def test_every_stage_is_used_by_some_template():
    used = {s for a in map(load_architecture, available_archs())
            for s in a.block + (a.recurrent_block or ()) + (a.moe_block or ())}
    assert used == set(Stage)


def test_nomic_bert_moe_runs_experts_in_the_layers_the_file_picks(tmp_path):
    """moe_every_n_layers n makes layer il a MoE layer where il % n == 1 (llama.cpp's rule); a MoE
    layer runs moe_block, whose experts take the dense FFN's place and nothing else."""
    t = load_architecture("nomic-bert-moe")
    mask = tuple(il % 2 == 1 for il in range(12))
    assert [t.layer_kind(il, moe=mask) for il in range(4)] == [LayerKind.GLOBAL, LayerKind.MOE] * 2
    assert t.block_of(LayerKind.MOE) == t.moe_block and t.block_of(LayerKind.GLOBAL) == t.block
    assert t.moe is not None and not t.moe.normalize and t.activation.value == "gelu" and t.fused_qkv and t.qkv_bias
    assert "moe_every_n_layers" in t.metadata_keys() and "moe_every_n_layers" not in load_architecture("olmoe").metadata_keys()
    bad = [s for s in t.moe_block if s is not Stage.ATTN_OUT_NORM]
    with pytest.raises(ArchitectureError, match="'moe_block' must be 'block' with ffn_moe in place of its FFN's stages"):
        parse_architecture_file(_variant(tmp_path, "nomic-bert-moe", moe_block=[s.value for s in bad]))
