"""Small synthetic BERT GGUFs, written as llama.cpp's converter writes a BertModel (and, with a
class head, a BertForSequenceClassification reranker: cls.weight, cls.bias, cls.output.*), a
NomicBertModel (nomic-bert, and with experts nomic-bert-moe), with the real vocabulary of a
converted model (WordPiece, or nomic-bert-moe's Unigram). Random weights sized so that every part
moves the vectors: non-zero biases, LayerNorm weights away from 1, the token-type row and the
position rows as large as the token rows, a router whose choice varies from token to token."""
from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

from compiler.frontend.gguf_header import read_header

TOKENIZER_KEYS = ("tokenizer.ggml.token_type_count", "tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens", "tokenizer.ggml.token_type",
                  "tokenizer.ggml.scores", "tokenizer.ggml.precompiled_charsmap", "tokenizer.ggml.add_space_prefix",
                  "tokenizer.ggml.remove_extra_whitespaces",
                  "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id", "tokenizer.ggml.unknown_token_id",
                  "tokenizer.ggml.seperator_token_id", "tokenizer.ggml.padding_token_id",
                  "tokenizer.ggml.mask_token_id", "tokenizer.ggml.add_bos_token", "tokenizer.ggml.add_eos_token",
                  "tokenizer.ggml.add_sep_token")


def write_bert(path: Path, vocab_from: Path, n_embd: int = 64, n_layer: int = 2, n_head: int = 4, n_ff: int = 128,
               ctx: int = 128, pooling: int = 1, class_head: bool = False, seed: int = 0,
               causal: bool = False, f16: bool = False, arch: str = "bert") -> Path:
    """arch "nomic-bert": rotary positions (base 1000) and no position_embd, Q, K, V in one attn_qkv,
    a SwiGLU FFN, no biases but the norms' (nomic-embed-text's). "nomic-bert-moe": the same
    attention with biases, a GELU FFN with biases, and in odd layers (moe_every_n_layers 2) a
    router (ffn_gate_inp) over 8 experts without a gate or biases (ffn_up_exps, ffn_down_exps), 2 a
    token (nomic-embed-text-v2-moe's). "jina-bert-v2": BERT's attention with ALiBi in place of
    position_embd, and a GEGLU FFN whose ffn_up (and its bias) holds the gate's rows then up's."""
    rng = np.random.default_rng(seed)
    src = read_header(Path(vocab_from)).fields  # kiln's walk: gguf-py's takes 13 s over 250k pieces
    n_vocab = len(src["tokenizer.ggml.tokens"].raw)
    n_types = src["tokenizer.ggml.token_type_count"].raw if "tokenizer.ggml.token_type_count" in src else 2
    nomic, moe, jina = arch.startswith("nomic-bert"), arch == "nomic-bert-moe", arch == "jina-bert-v2"
    n_expert = 8
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(n_layer)
    w.add_context_length(ctx)
    w.add_embedding_length(n_embd)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_layer_norm_eps(1e-12)
    w.add_causal_attention(causal)
    if nomic:
        w.add_rope_freq_base(1000.0)
    if moe:
        w.add_uint32(f"{arch}.moe_every_n_layers", 2)
        w.add_expert_count(n_expert)
        w.add_expert_used_count(2)
    w.add_pooling_type(gguf.PoolingType(pooling))
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if f16 else gguf.LlamaFileType.ALL_F32)
    for key in TOKENIZER_KEYS:
        if key in src:  # as the file holds it (strings as their bytes)
            w.add_key_value(key, src[key].raw, src[key].type, src[key].elem)

    def mat(*shape: int, scale: float) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    def matrix(name: str, *shape: int) -> None:  # a projection: F16 where asked, as the converter's
        t = mat(*shape, scale=1.0 / np.sqrt(shape[-1]))
        w.add_tensor(name, t.astype(np.float16) if f16 else t)

    def norm(name: str, n: int) -> None:
        w.add_tensor(f"{name}.weight", (1.0 + mat(n, scale=0.2)))
        w.add_tensor(f"{name}.bias", mat(n, scale=0.1))

    matrix("token_embd.weight", n_vocab, n_embd)
    w.add_tensor("token_types.weight", mat(n_types, n_embd, scale=0.5))
    if not nomic and not jina:
        w.add_tensor("position_embd.weight", mat(ctx, n_embd, scale=0.5))
    norm("token_embd_norm", n_embd)
    attention = (("attn_qkv", 3 * n_embd, n_embd),) if nomic else \
        (("attn_q", n_embd, n_embd), ("attn_k", n_embd, n_embd), ("attn_v", n_embd, n_embd))
    gate = (("ffn_gate", n_ff, n_embd),) if arch == "nomic-bert" else ()  # nomic-bert's SwiGLU
    ffn = (("ffn_up", (2 if jina else 1) * n_ff, n_embd), *gate, ("ffn_down", n_embd, n_ff))
    for il in range(n_layer):
        p = f"blk.{il}."
        experts = moe and il % 2 == 1
        for name, rows, cols in attention + (("attn_output", n_embd, n_embd),) + (() if experts else ffn):
            matrix(p + name + ".weight", rows, cols)
            if arch != "nomic-bert":
                w.add_tensor(p + name + ".bias", mat(rows, scale=0.1))
        if experts:  # the router's logits about N(0, 4): each token's two experts its own
            w.add_tensor(p + "ffn_gate_inp.weight", mat(n_expert, n_embd, scale=2.0 / np.sqrt(n_embd)))
            matrix(p + "ffn_up_exps.weight", n_expert, n_ff, n_embd)
            matrix(p + "ffn_down_exps.weight", n_expert, n_embd, n_ff)
        norm(p + "attn_output_norm", n_embd)
        norm(p + "layer_output_norm", n_embd)
    if class_head:
        matrix("cls.weight", n_embd, n_embd)
        w.add_tensor("cls.bias", mat(n_embd, scale=0.1))
        w.add_tensor("cls.output.weight", mat(1, n_embd, scale=1.0))
        w.add_tensor("cls.output.bias", mat(1, scale=0.1))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
