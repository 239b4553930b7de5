"""Token types as llama.cpp uses them, which is not always as the GGUF stores them.

On loading a vocabulary llama.cpp overrides some types by the token's text: end-of-generation
and fill-in-the-middle spellings become control tokens (it warns "control-looking token"), a
few are demoted again for the tokenizers that use them as text, and Phi-3's special tokens eat
the spaces after them. A control token is cut out of the text only with parse_special; a
user-defined one always.
"""
from __future__ import annotations

from ..frontend.spec import TokenizerData

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

# End-of-generation spellings: control tokens whatever type the GGUF gives them (Gemma's
# user-defined "</s>" is one, so with parse_special off llama.cpp tokenizes it as plain text).
CONTROL_LOOKING = frozenset({
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>", "<end_of_turn>",
    "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>",
    "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>", "<｜end▁of▁sentence｜>", "[e~[",
})
# Fill-in-the-middle spellings, made control tokens too. (llama.cpp promotes one per role, the
# first it meets, and none where the GGUF names that role's id; a vocabulary with two spellings
# of one role is not seen in practice.)
FIM_LOOKING = frozenset({
    "<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>", "<|code_prefix|>",
    "<|prefix|>", "<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>",
    "<|code_suffix|>", "<|suffix|>", "<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>",
    "▁<MID>", "<|code_middle|>", "<|middle|>", "<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]",
    "<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>", "<|file_sep|>",
})
ALWAYS_TEXT = ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>")  # gpt-oss: user-defined


def token_types(data: TokenizerData) -> list[int]:
    """Each token's type after llama.cpp's overrides by text."""
    types = [CONTROL if t in CONTROL_LOOKING or t in FIM_LOOKING else ty
             for t, ty in zip(data.tokens, data.token_types)]
    texts = {t for t in data.tokens if t in CONTROL_LOOKING}
    eog = texts | {data.tokens[i] for i in data.eog_ids}
    demote: dict[str, int] = {}
    if "<|end|>" in eog and ({"<|return|>", "<|call|>"} <= eog or {"<|calls|>", "<|flush|>"} <= eog):
        demote["<|end|>"] = USER_DEFINED  # harmony / solar-open: "<|end|>" ends a message, not the turn
    if "</s>" in eog and ("<|tool_response>" in eog or "<|plamo:eos|>" in eog):
        demote["</s>"] = NORMAL  # Gemma 4, PLaMo: "</s>" is ordinary text
    for t in ALWAYS_TEXT:
        demote[t] = USER_DEFINED
    if demote:
        types = [demote.get(t, ty) for t, ty in zip(data.tokens, types)]
    return types


def stripping(data: TokenizerData, types: list[int]) -> tuple[frozenset[int], frozenset[int]]:
    """Special tokens that swallow the whitespace (lstrip) before / (rstrip) after them."""
    name = data.name.lower()
    if "phi-3" in name or "phi3" in name:
        keep = {"<unk>", "<s>", "<|endoftext|>"}
        rstrip = {i for i, (t, ty) in enumerate(zip(data.tokens, types))
                  if (ty in (CONTROL, USER_DEFINED, UNKNOWN) or t == "</s>") and t not in keep}
        return frozenset(), frozenset(rstrip)
    return frozenset(), frozenset()
