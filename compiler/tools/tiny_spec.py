"""What a tiny synthetic model is made of (synthetic.py writes it): its architecture, shape, weight
types, tokenizer, and the tensors a test sets or leaves out."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from gguf import GGMLQuantizationType as Q


@dataclass
class TinySpec:
    arch: str = "llama"
    wtype: Q = Q.F32  # type of every 2-D weight
    n_layer: int = 2
    n_embd: int = 64
    n_head: int = 4
    n_head_kv: int = 2
    n_ff: int = 128
    head_dim: int | None = None  # default n_embd // n_head
    sliding_window: int | None = None  # default 8 for hybrid templates
    context_length: int = 512
    seed: int = 0
    types: dict[str, Q] = field(default_factory=dict)  # per-tensor type overrides
    drop: tuple[str, ...] = ()  # tensors to leave out
    metadata_arch: str | None = None  # write this as general.architecture instead of `arch`
    tokenizer_from: Path | None = None  # copy a real GGUF's tokenizer (so llama.cpp loads the model)
    tokenizer_pre: str | None = None  # override its pre-tokenizer name
    chat_template: str | None = None  # tokenizer.chat_template (jinja), e.g. a reasoning model's
    extra_meta: dict = field(default_factory=dict)  # more '{arch}.<key>' metadata: str, bool, int, float or list values
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)  # per-tensor shape overrides (numpy order)
    extra_tensors: dict[str, tuple] = field(default_factory=dict)  # F32 tensors (rope factors, a class head)
    rope_base: float | None = None  # default 10000 for llama, 1e6 otherwise
    norm_mean: float = 0.0  # added to every norm's weights (Gemma's converter stores 1 + w: its branches need it)
    # an output.weight of its own where the template allows one (default: on the archs with qkv bias). A tied
    # head makes the next token nearly always the current one on random weights, whatever the layers do.
    untied: bool | None = None
    # tensors whose values are set rather than drawn (a feature switched off for a negative control): the
    # value, broadcast along the last axis, of every tensor whose name ends with the key
    fill: dict[str, tuple[float, ...]] = field(default_factory=dict)
    n_expert: int = 8  # a mixture of experts' (the templates with `moe`): experts a layer, n_ff wide each
    n_expert_used: int = 2
    # qwen35's (the other archs ignore them): a DeltaNet head's width (k and v alike), its k heads (llama.cpp's
    # ssm group count), its v heads (the time-step rank: d_inner = ssm_dt_rank * ssm_d_state; more v heads than k
    # heads, so that their pairing matters), the causal conv's taps; layer il is full attention when
    # (il + 1) % full_attention_interval == 0 (gemma4's too; llama.cpp aborts on qwen35 with none)
    ssm_d_state: int = 32
    ssm_n_group: int = 2
    ssm_dt_rank: int = 4
    ssm_d_conv: int = 4
    full_attention_interval: int = 4
    n_rot: int | None = None  # qwen35's rotated dims of a head; default head_dim // 4 (Qwen3.5's partial rotary)
    rope_sections: tuple[int, int, int, int] | None = None  # IMROPE's; default Qwen3.5's 11:11:10:0 over n_rot / 2
