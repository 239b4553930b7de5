"""`kiln convert`: a sentence-transformers BERT folder to the GGUF llama.cpp's converter makes of it.

The file is meant to be the one `convert_hf_to_gguf.py --outtype f16|f32` writes for a `BertModel`:
the same tensor names, types and order, the same metadata keys in the same order, the same
vocabulary spelling (convert_vocab.py). It is made without torch or transformers: the weights
come through safetensors' numpy API, the config and vocabulary from the folder's JSON files.
Whatever llama.cpp could not load, or would compute other than Hugging Face does, is refused with
a ModelFileError that names the file and what is wrong.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import gguf
import numpy as np
from safetensors import safe_open

from ..core.errors import ModelFileError, OptionError
from .convert_vocab import BertVocab, read_vocab

SUPPORTED = ("BertModel",)
OUTTYPES = {"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16}
# transformers' BertConfig defaults: llama.cpp's converter sees config.json through AutoConfig
BERT_DEFAULTS = {"vocab_size": 30522, "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
                 "intermediate_size": 3072, "hidden_act": "gelu", "max_position_embeddings": 512,
                 "type_vocab_size": 2, "layer_norm_eps": 1e-12, "position_embedding_type": "absolute"}
GELUS = ("gelu", "gelu_new", "gelu_pytorch_tanh")  # llama.cpp's BERT has one GELU for them all
POOLING = {"mean": gguf.PoolingType.MEAN, "cls": gguf.PoolingType.CLS, "lasttoken": gguf.PoolingType.LAST}
# HF tensors BertModel's converter drops: the positions are implicit, the pooler and heads unused
DROPPED = ("embeddings.position_ids", "pooler.dense.weight", "pooler.dense.bias")
DROPPED_PREFIXES = ("cls.predictions", "cls.seq_relationship")
KEEP_F32 = (gguf.MODEL_TENSOR.POS_EMBD, gguf.MODEL_TENSOR.TOKEN_TYPES)  # of BERT's, the ones prepare_tensors keeps


def convert(folder: Path, out: Path, outtype: str = "f16") -> Path:
    """Write the GGUF of the BERT in folder to out; returns out."""
    folder, out = Path(folder), Path(out)
    if outtype not in OUTTYPES:
        raise OptionError(f"outtype {outtype!r}: kiln convert writes {' or '.join(OUTTYPES)}")
    cfg = read_config(folder)
    pooling = read_pooling(folder)
    vocab = read_vocab(folder, cfg["vocab_size"])
    tensors = read_tensors(folder, cfg)
    ftype = OUTTYPES[outtype]
    partial = out.with_name(out.name + ".partial")  # a failed write leaves no half file under out's name
    w = gguf.GGUFWriter(path=None, arch=gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.BERT])
    try:
        for name, data in tensors:
            qtype = tensor_type(name, data.ndim, ftype)
            w.add_tensor(name, gguf.quants.quantize(data, qtype), raw_dtype=qtype)
        write_metadata(w, folder, cfg, ftype, pooling)
        write_vocab(w, vocab, cfg)
        w.write_header_to_file(path=partial)
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        os.replace(partial, out)
    except OSError as e:
        raise ModelFileError(f"{out}: cannot write it ({e.strerror or e})") from None
    finally:
        partial.unlink(missing_ok=True)
    return out


def _json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ModelFileError(f"{path}: cannot be read as JSON ({e})") from None
    if not isinstance(data, dict):
        raise ModelFileError(f"{path}: expected a JSON object")
    return data


def read_config(folder: Path) -> dict:
    path = folder / "config.json"
    if not folder.is_dir():
        raise ModelFileError(f"{folder}: not a folder; kiln convert takes a Hugging Face model folder")
    if not path.is_file():
        raise ModelFileError(f"{path}: not found; a Hugging Face model folder has a config.json")
    cfg = BERT_DEFAULTS | _json(path)
    archs = cfg.get("architectures") or []
    if len(archs) != 1 or archs[0] not in SUPPORTED:
        raise ModelFileError(f"{path}: architectures {archs} are not supported; kiln convert takes "
                             f"{', '.join(SUPPORTED)}")
    if cfg["hidden_act"] not in GELUS:
        raise ModelFileError(f"{path}: hidden_act {cfg['hidden_act']!r}: llama.cpp's BERT computes GELU only")
    if cfg["position_embedding_type"] != "absolute":
        raise ModelFileError(f"{path}: position_embedding_type {cfg['position_embedding_type']!r}: "
                             "llama.cpp's BERT has absolute position embeddings only")
    if cfg["hidden_size"] % cfg["num_attention_heads"]:
        raise ModelFileError(f"{path}: hidden_size {cfg['hidden_size']} is not a multiple of "
                             f"num_attention_heads {cfg['num_attention_heads']}")
    return cfg


def read_pooling(folder: Path) -> gguf.PoolingType | None:
    """The pooling of modules.json's Pooling module (TextModel._try_set_pooling_type); None without one.

    A Normalize module after it leaves no trace: llama.cpp's converter records none, and whoever
    reads the embeddings normalizes them (llama.cpp's tools with L2 by default, as kiln does)."""
    modules_path = folder / "modules.json"
    if not modules_path.is_file():
        return None
    try:
        modules = json.loads(modules_path.read_text(encoding="utf-8"))
        sub = next((m["path"] for m in modules if str(m["type"]).endswith("Pooling")), None)
    except (OSError, ValueError, TypeError, KeyError) as e:
        raise ModelFileError(f"{modules_path}: not a sentence-transformers module list ({e})") from None
    if sub is None:
        return None
    path = folder / sub / "config.json"
    if not path.is_file():
        raise ModelFileError(f"{path}: not found; modules.json names a Pooling module in {sub!r}")
    cfg = _json(path)
    for key, kind in (("pooling_mode_mean_tokens", "mean"), ("pooling_mode_cls_token", "cls"),
                      ("pooling_mode_lasttoken", "lasttoken")):
        if cfg.get(key):
            return POOLING[kind]
    if cfg.get("pooling_mode") in POOLING:
        return POOLING[cfg["pooling_mode"]]
    modes = sorted(k for k, v in cfg.items() if k.startswith("pooling_mode") and v) or ["none"]
    raise ModelFileError(f"{path}: pooling {', '.join(map(str, modes))} is not one llama.cpp has; "
                         "kiln convert takes mean, cls or lasttoken pooling")


def _hf_name(name: str) -> str | None:
    """BertModel.filter_tensors: the name the tensor map knows, or None for a tensor left out."""
    name = name.removeprefix("bert.")
    name = name[:-6] + ".weight" if name.endswith(".gamma") else name
    name = name[:-5] + ".bias" if name.endswith(".beta") else name
    return None if name in DROPPED or name.startswith(DROPPED_PREFIXES) else name


def expected_shapes(cfg: dict) -> dict[str, tuple[int, ...]]:
    """Every tensor llama.cpp's BERT loads, in the safetensors layout ([out, in])."""
    h, f = cfg["hidden_size"], cfg["intermediate_size"]
    shapes = {"token_embd.weight": (cfg["vocab_size"], h), "token_types.weight": (cfg["type_vocab_size"], h),
              "position_embd.weight": (cfg["max_position_embeddings"], h),
              "token_embd_norm.weight": (h,), "token_embd_norm.bias": (h,)}
    for i in range(cfg["num_hidden_layers"]):
        for t in ("attn_q", "attn_k", "attn_v", "attn_output"):
            shapes |= {f"blk.{i}.{t}.weight": (h, h), f"blk.{i}.{t}.bias": (h,)}
        for t in ("attn_output_norm", "layer_output_norm"):
            shapes |= {f"blk.{i}.{t}.weight": (h,), f"blk.{i}.{t}.bias": (h,)}
        shapes |= {f"blk.{i}.ffn_up.weight": (f, h), f"blk.{i}.ffn_up.bias": (f,),
                   f"blk.{i}.ffn_down.weight": (h, f), f"blk.{i}.ffn_down.bias": (h,)}
    return shapes


def read_tensors(folder: Path, cfg: dict) -> list[tuple[str, np.ndarray]]:
    """The GGUF name and data of each tensor, in llama.cpp's order: the parts by file name, each
    part's tensors by name (safetensors' order)."""
    parts = sorted(p for p in folder.glob("model*.safetensors") if p.is_file())
    if not parts:
        raise ModelFileError(f"{folder / 'model.safetensors'}: not found; kiln convert reads safetensors "
                             "weights (pytorch_model.bin would need torch)")
    tmap = gguf.get_tensor_name_map(gguf.MODEL_ARCH.BERT, cfg["num_hidden_layers"])
    shapes, out = expected_shapes(cfg), []
    for part in parts:
        try:
            with safe_open(part, framework="np") as f:
                for key in sorted(f.keys()):
                    if (hf := _hf_name(key)) is None:
                        continue
                    name = tmap.get_name(hf, try_suffixes=(".weight", ".bias"))
                    if name is None or name not in shapes:
                        raise ModelFileError(f"{part}: tensor {key!r} is not one of BERT's; llama.cpp's "
                                             "converter refuses a model it cannot map")
                    dtype = f.get_slice(key).get_dtype()
                    if dtype not in ("F32", "F16"):
                        raise ModelFileError(f"{part}: tensor {key!r} is {dtype}; kiln convert reads F32 and F16")
                    data = f.get_tensor(key)
                    if data.shape != shapes[name]:
                        raise ModelFileError(f"{part}: tensor {key!r} has shape {list(data.shape)}, config.json "
                                             f"makes it {list(shapes[name])}")
                    out.append((name, data))
        except ModelFileError:
            raise
        except Exception as e:  # safetensors raises its own error types for a damaged file
            raise ModelFileError(f"{part}: not a readable safetensors file ({e})") from None
    names = [n for n, _ in out]
    if dup := sorted({n for n in names if names.count(n) > 1}):
        raise ModelFileError(f"{folder}: tensors {dup} come twice (a 'bert.' prefix and none?)")
    if missing := [n for n in shapes if n not in names]:
        base, _, suffix = missing[0].rpartition(".")
        hf = next(k for k, (_, n) in tmap.mapping.items() if n == base and k.startswith(("embeddings.", "encoder.")))
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        raise ModelFileError(f"{parts[0]}: tensor {hf}.{suffix} (GGUF {missing[0]}) is missing{more}; "
                             "llama.cpp's BERT needs it")
    return out


def tensor_type(name: str, ndim: int, ftype: gguf.LlamaFileType) -> gguf.GGMLQuantizationType:
    """ModelBase.prepare_tensors' choice: norms, biases, 1-D tensors and the position and token-type
    embeddings stay F32; the other matrices take the outtype."""
    keep = ndim <= 1 or name.endswith("_norm.weight") or not name.endswith(".weight") or any(
        name == gguf.TENSOR_NAMES[t] + ".weight" for t in KEEP_F32)
    if keep or ftype == gguf.LlamaFileType.ALL_F32:
        return gguf.GGMLQuantizationType.F32
    return gguf.GGMLQuantizationType.F16


def write_metadata(w: gguf.GGUFWriter, folder: Path, cfg: dict, ftype: gguf.LlamaFileType,
                   pooling: gguf.PoolingType | None) -> None:
    """prepare_metadata and BertModel.set_gguf_parameters, in their order."""
    total, shared, expert, n_expert = w.get_total_parameter_count()
    meta = gguf.Metadata.load(None, folder, None, total)
    meta.name = meta.name or folder.name
    if meta.size_label is None and total > 0:
        meta.size_label = gguf.size_label(total, shared, expert, n_expert)
    w.add_type(gguf.GGUFType.MODEL)
    meta.set_gguf_meta_model(w)
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_layer_norm_eps(cfg["layer_norm_eps"])
    w.add_file_type(ftype)
    w.add_causal_attention(False)
    if pooling is not None:
        w.add_pooling_type(pooling)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)


def write_vocab(w: gguf.GGUFWriter, vocab: BertVocab, cfg: dict) -> None:
    """BertModel.set_vocab: the token-type count, the WordPiece vocabulary, then gguf.SpecialVocab's keys."""
    w.add_token_type_count(cfg["type_vocab_size"])
    w.add_tokenizer_model("bert")
    w.add_tokenizer_pre(vocab.pre)
    w.add_token_list(vocab.tokens)
    w.add_token_types(vocab.types)
    for kind, tid in vocab.special_ids.items():
        getattr(w, f"add_{kind}_token_id")(tid)
    for kind, value in vocab.add_special.items():
        if (add := getattr(w, f"add_add_{kind}_token", None)) is not None:  # SpecialVocab skips the others
            add(value)
    # llama.cpp reads BertNormalizer's options from these; the gguf package kiln pins has no writer for them
    if vocab.lowercase is not None:
        w.add_bool("tokenizer.ggml.normalizer.lowercase", vocab.lowercase)
    if vocab.strip_accents is not None:
        w.add_bool("tokenizer.ggml.normalizer.strip_accents", vocab.strip_accents)
