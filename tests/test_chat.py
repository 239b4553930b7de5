"""Chat prompts: the built-in templates render what llama.cpp's built-ins render, a GGUF without
a template (the bundled Gemma 3, a base model) chats through its architecture's, and generation
stops at every end-of-generation token."""
from __future__ import annotations

import ctypes
import dataclasses
import subprocess
import sys

import llama_cpp
import numpy as np
import pytest

import compiler
from compiler.text.chat import chat_template, render_chat
from compiler.frontend.gguf_reader import read_model
from compiler.runtime.sampling import SamplingParams

CONVERSATIONS = [
    [{"role": "user", "content": " Hi there "}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
     {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Name a colour."}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
]


def _llamacpp_builtin(name: str, messages: list[dict], add_generation_prompt: bool) -> str:
    chat = (llama_cpp.llama_chat_message * len(messages))(
        *[llama_cpp.llama_chat_message(role=m["role"].encode(), content=m["content"].encode()) for m in messages])
    buf = ctypes.create_string_buffer(1 << 14)
    n = llama_cpp.llama_chat_apply_template(name.encode(), chat, len(messages), add_generation_prompt, buf, len(buf))
    assert 0 < n < len(buf)
    return buf.raw[:n].decode()


@pytest.mark.parametrize("add", [True, False])
@pytest.mark.parametrize("messages", CONVERSATIONS)
def test_builtin_templates_render_as_llamacpp(gemma3, smollm2, messages, add):
    gemma = read_model(gemma3)
    assert gemma.tokenizer.chat_template is None and chat_template(gemma).origin.endswith("gemma.jinja")
    assert render_chat(gemma, messages, add) == _llamacpp_builtin("gemma", messages, add)
    smol = read_model(smollm2)  # a llama-arch file stripped of its template falls back to ChatML
    bare = dataclasses.replace(smol, tokenizer=dataclasses.replace(smol.tokenizer, chat_template=None))
    assert render_chat(bare, messages, add) == _llamacpp_builtin("chatml", messages, add)


def test_end_of_generation_set_is_llamacpps(gemma3, smollm2):
    gemma, smol = read_model(gemma3).tokenizer, read_model(smollm2).tokenizer
    assert {gemma.tokens[i] for i in gemma.eog_ids} == {"<eos>", "<end_of_turn>"}
    assert {smol.tokens[i] for i in smol.eog_ids} == {"<|endoftext|>", "<|im_end|>"}


def test_generation_stops_at_every_end_of_generation_token(smollm2):
    # logits made to pick each EOG token: <|endoftext|> (0) is not SmolLM2's eos_id (2), and ended
    # nothing before the EOG set
    m = compiler.load(smollm2, ctx=256)
    for tok in sorted(m.spec.tokenizer.eog_ids) + [198]:
        logits = np.zeros(m.n_vocab, np.float32)
        logits[tok] = 10
        run = m.decoding([1], SamplingParams(temperature=0), [], max_tokens=10)
        got = run.next(logits, n_past=1)
        assert (got.text, got.token, got.finish_reason) == (("", None, "stop") if tok != 198 else ("\n", 198, None))


def test_kiln_run_chat_with_the_builtin_template(gemma3):
    r = subprocess.run([sys.executable, "-m", "compiler", "run", "gemma3-270m", "--chat", "--ctx", "2048", "-n", "24",
                        "--temp", "0", "-p", "Say hello."], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() and "<start_of_turn>" not in r.stdout
