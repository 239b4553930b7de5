"""The tokenizer metadata of a GGUF, with llama.cpp's defaults where a key is absent.

llama.cpp decides each tokenizer setting in two steps: a default from the tokenizer model
(`tokenizer.ggml.model`) and, for BPE, the pre-tokenizer (`tokenizer.ggml.pre`), then the
GGUF's own key where there is one. DEFAULTS below is that first step, one row per model or
pre-tokenizer family; read_tokenizer applies the second.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
from gguf import GGUFValueType

from ..core.errors import ModelFileError
from .spec import TokenizerData

# Token texts that end a generation wherever a vocabulary has them (llama.cpp's llama-vocab.cpp list).
EOG_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|endoftext|>", "<|eom_id|>",
             "<EOT>", "_<EOT>", "<|end_of_text|>", "<end_of_utterance>", "<end_of_turn>")


@dataclass(frozen=True)
class Defaults:
    """What llama.cpp assumes when the GGUF has no key for a setting."""

    pre_type: str = "default"  # the pre-tokenizer (its regexes: text/pretokenize.py)
    add_bos: bool = False
    add_eos: bool = False
    add_sep: bool = False
    add_space_prefix: bool = False
    clean_spaces: bool = True
    ignore_merges: bool = False
    escape_whitespaces: bool = False
    bos_always: bool = False  # not a default: BOS is added whatever the key says
    ids: tuple[int | None, int | None, int | None, int | None, int | None] = (None,) * 5  # bos, eos, unk, sep, pad


ANY = ("*",)  # a row for every pre-tokenizer name of its model
_BPE = Defaults(ids=(11, 11, None, None, None))  # llama.cpp's BPE special-id defaults (Falcon's)


def _bpe(pre_type: str, **settings) -> Defaults:
    return replace(_BPE, pre_type=pre_type, **settings)


_KEEP_SPACES = {"clean_spaces": False}

# (tokenizer.ggml.model, tokenizer.ggml.pre names, llama.cpp's defaults). The first row whose model
# and name match is used; a BPE name outside every row is a pre-tokenizer llama.cpp refuses.
DEFAULTS: tuple[tuple[str, tuple[str, ...], Defaults], ...] = (
    # SentencePiece: BOS, a space before the text, spaces as U+2581; decoding keeps every space
    ("llama", ANY, Defaults(add_bos=True, add_space_prefix=True, clean_spaces=False, escape_whitespaces=True,
                            ids=(1, 2, 0, None, None))),
    # SentencePiece unigram (T5, XLM-RoBERTa): EOS after the text, spaces as U+2581; decoding keeps spaces
    ("t5", ANY, Defaults(add_eos=True, clean_spaces=False, escape_whitespaces=True, ids=(None, 1, 2, None, 0))),
    # WordPiece (BERT): [CLS] text [SEP]; decoding drops spaces before punctuation
    ("bert", ANY, Defaults(add_bos=True, add_sep=True, ids=(101, None, 100, 102, 0))),
    # Gemma 4: BPE over SentencePiece-style text (U+2581 spaces, raw UTF-8), BOS always; no default ids
    ("gemma4", ANY, Defaults(pre_type="gemma4", add_bos=True, escape_whitespaces=True, bos_always=True)),
    # BPE without a pre-tokenizer name: llama.cpp's generic split (it warns that quality degrades)
    ("gpt2", ("", "default"), _bpe("default")),
    # Llama 3 family: a word that is a token is not re-merged; BOS
    ("gpt2", ("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2",
              "jina-v5-nano"), _bpe("llama3", ignore_merges=True, add_bos=True)),
    # DeepSeek LLM / Coder / V3: their own splits; decoding keeps spaces
    ("gpt2", ("deepseek-llm",), _bpe("deepseek-llm", **_KEEP_SPACES)),
    ("gpt2", ("deepseek-coder",), _bpe("deepseek-coder", **_KEEP_SPACES)),
    ("gpt2", ("deepseek-v3",), _bpe("deepseek3", **_KEEP_SPACES)),
    ("gpt2", ("hunyuan-dense", "hy_v4", "joyai-llm"), _bpe("deepseek3", **_KEEP_SPACES)),
    # Falcon: punctuation runs, then GPT-2, then digit triples
    ("gpt2", ("falcon",), _bpe("falcon")),
    # GPT-2's own split (MPT, OLMo, Jais and others share it)
    ("gpt2", ("gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de", "a.x-4.0", "mellum",
              "modern-bert", "mpt", "olmo", "jais", "exaone4"), _bpe("gpt2")),
    ("gpt2", ("trillion", "granite-docling"), _bpe("gpt2", **_KEEP_SPACES)),
    # RoBERTa-style encoders: GPT-2's split and a separator after the text
    ("gpt2", ("jina-v1-en", "jina-v2-code", "roberta-bpe"), _bpe("gpt2", add_sep=True)),
    # StarCoder family: every digit alone, then GPT-2's split
    ("gpt2", ("starcoder", "refact", "codeshell", "exaone", "minerva-7b", "mellum2"), _bpe("starcoder")),
    ("gpt2", ("command-r", "smollm"), _bpe("starcoder", **_KEEP_SPACES)),
    # Qwen 2 family: one digit per token, letters with one leading non-letter
    ("gpt2", ("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "hunyuan", "solar-open"),
     _bpe("qwen2", **_KEEP_SPACES)),
    ("gpt2", ("stablelm2", "megrez"), _bpe("qwen2")),
    # Qwen 3.5: as Qwen 2, combining marks counted as letters
    ("gpt2", ("qwen35",), _bpe("qwen35", **_KEEP_SPACES)),
    # Llama 3's split under other names
    ("gpt2", ("dbrx", "smaug-bpe", "chatglm-bpe"), _bpe("llama3")),
    ("gpt2", ("glm4", "glm5"), _bpe("llama3", ignore_merges=True)),
    # BLOOM family: split at spaces and a few punctuation marks
    ("gpt2", ("poro-chat",), _bpe("bloom", **_KEEP_SPACES)),
    ("gpt2", ("bloom", "gpt3-finnish"), _bpe("bloom")),
    ("gpt2", ("viking",), _bpe("viking", **_KEEP_SPACES)),
    # Mistral's Tekken: case-aware words; a word that is a token is not re-merged; BOS
    ("gpt2", ("tekken",), _bpe("tekken", ignore_merges=True, add_bos=True, **_KEEP_SPACES)),
    ("gpt2", ("chameleon",), _bpe("chameleon", add_bos=True, **_KEEP_SPACES)),
    ("gpt2", ("gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"), _bpe("gpt4o", **_KEEP_SPACES)),
    ("gpt2", ("seed-coder",), _bpe("seed-coder", **_KEEP_SPACES)),
    ("gpt2", ("bailingmoe", "bailingmoe2", "llada-moe"), _bpe("bailingmoe", **_KEEP_SPACES)),
    ("gpt2", ("ufakzeka",), _bpe("ufakzeka", **_KEEP_SPACES)),
    ("gpt2", ("grok-2",), _bpe("qwen2", **_KEEP_SPACES)),
    ("gpt2", ("exaone-moe",), _bpe("exaone-moe")),
    ("gpt2", ("minicpm5",), _bpe("minicpm5", ignore_merges=True)),
    ("gpt2", ("laguna",), _bpe("laguna", **_KEEP_SPACES)),
    ("gpt2", ("gemma4", "granite-embed-multi-311m"), _bpe("gemma4", escape_whitespaces=True)),
    # splits that need llama.cpp's hand-written code: known names, no kiln pre-tokenizer yet
    ("gpt2", ("kimi-k2",), _bpe("kimi-k2", **_KEEP_SPACES)),
    ("gpt2", ("afmoe",), _bpe("afmoe", **_KEEP_SPACES)),
    ("gpt2", ("tiny_aya", "cohere2moe"), _bpe("tiny-aya", **_KEEP_SPACES)),
    ("gpt2", ("superbpe",), _bpe("superbpe", **_KEEP_SPACES)),
    ("gpt2", ("granite-embed-multi-97m",), _bpe("granite-emb-multi", ignore_merges=True, **_KEEP_SPACES)),
    ("gpt2", ("jais-2",), _bpe("jais2")),
    ("gpt2", ("spark2_5",), _bpe("spark2.5", **_KEEP_SPACES)),
    ("gpt2", ("youtu",), _bpe("youtu", ignore_merges=True, **_KEEP_SPACES)),
    ("gpt2", ("sarvam-moe",), _bpe("sarvam-moe", escape_whitespaces=True, **_KEEP_SPACES)),
)


# where llama.cpp makes "<mask>" take the whitespace before it: parts of these pre-tokenizer and
# architecture names (XLM-RoBERTa's fill-mask convention, "a <mask>" as "a<mask>")
MASK_LSTRIP_PRE = ("jina-v2-de", "jina-v2-es", "jina-v2-code")
MASK_LSTRIP_ARCH = ("nomic-bert-moe", "jina-bert-v3")


def tokenizer_defaults(model: str, pre: str | None) -> Defaults | None:
    """llama.cpp's defaults for a tokenizer model and pre-tokenizer name; None where it knows neither."""
    for row_model, names, defaults in DEFAULTS:
        if row_model == model and (names is ANY or (pre or "") in names):
            return defaults
    return None


def read_tokenizer(meta) -> TokenizerData:
    """The `tokenizer.ggml.*` keys of a GGUF (meta: gguf_reader's typed metadata access)."""
    k = "tokenizer.ggml."
    tokens = meta.array(k + "tokens")
    if not tokens:
        raise ModelFileError(f"{meta.path}: metadata key '{k}tokens' is missing; the file carries no vocabulary")
    n = len(tokens)
    types = meta.array(k + "token_type") or [1] * n
    scores = meta.array(k + "scores")
    merges = meta.array(k + "merges")
    if len(types) < n or (scores is not None and len(scores) < n):
        raise ModelFileError(f"{meta.path}: '{k}token_type' or '{k}scores' has fewer entries than the {n} tokens")
    model = meta.text(k + "model")
    pre = meta.text(k + "pre", default=None)
    found = tokenizer_defaults(model, pre)
    d = found or _BPE

    def special(key: str, default: int | None) -> int | None:
        default = default if default is not None and 0 <= default < n else None
        value = meta.integer(k + key, default=None)
        return value if value is not None and 0 <= value < n else default  # out of range: llama.cpp keeps its default

    bos, eos, unk, sep, pad = (special(key, default) for key, default in zip(
        ("bos_token_id", "eos_token_id", "unknown_token_id", "seperator_token_id", "padding_token_id"), d.ids))
    template = meta.get("tokenizer.chat_template")
    eog = {eos, meta.integer(k + "eot_token_id", default=None), meta.integer(k + "eom_token_id", default=None)}
    eog |= {i for i, text in enumerate(tokens) if text in EOG_TEXTS}
    lowercase = meta.flag(k + "normalizer.lowercase", default=True)
    unigram = {}
    if model == "t5":
        arch = meta.text("general.architecture", default="") or ""
        lstrip_mask = any(s in (pre or "") for s in MASK_LSTRIP_PRE) or any(s in arch for s in MASK_LSTRIP_ARCH)
        unigram = {"precompiled_charsmap": _charsmap(meta, k + "precompiled_charsmap"), "lstrip_mask": lstrip_mask}
    return TokenizerData(
        model=model,
        pre=pre,
        tokens=tuple(tokens),
        token_types=tuple(int(t) for t in types[:n]),
        scores=None if scores is None else tuple(float(s) for s in scores[:n]),
        merges=None if merges is None else tuple(merges),
        bos_id=bos,
        eos_id=eos,
        unk_id=unk,
        pad_id=pad,
        add_bos=meta.flag(k + "add_bos_token", default=d.add_bos) or d.bos_always,
        add_eos=meta.flag(k + "add_eos_token", default=d.add_eos),
        add_space_prefix=meta.flag(k + "add_space_prefix", default=d.add_space_prefix),
        chat_template=None if template is None else str(template),
        rerank_template=_text(meta.get("tokenizer.chat_template.rerank")),
        eog_ids=frozenset(i for i in eog if i is not None and 0 <= i < n),
        pre_type=d.pre_type if found else None,
        sep_id=sep,
        add_sep=meta.flag(k + "add_sep_token", default=d.add_sep),
        bos_always=d.bos_always,
        clean_spaces=d.clean_spaces,
        ignore_merges=d.ignore_merges,
        escape_whitespaces=d.escape_whitespaces,
        remove_extra_whitespaces=meta.flag(k + "remove_extra_whitespaces", default=False),
        lowercase=lowercase,
        strip_accents=meta.flag(k + "normalizer.strip_accents", default=lowercase),
        name=meta.text("general.name", default="") or "",
        **unigram,
    )


def _charsmap(meta, key: str) -> bytes:
    """The charsmap's bytes; llama.cpp takes an array of int8 or uint8 and nothing else."""
    values = meta.array(key)
    if values is None:
        return b""
    if meta.fields[key].elem not in (GGUFValueType.UINT8, GGUFValueType.INT8):
        raise ModelFileError(f"{meta.path}: metadata key '{key}' should be an array of bytes")
    return (np.asarray(values, dtype=np.int16) & 0xFF).astype(np.uint8).tobytes()


def _text(value) -> str | None:
    """A string key's value, or None where the file has none."""
    return None if value is None else str(value)
