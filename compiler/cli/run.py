"""kiln run: stream a continuation of a prompt (the model is compiled on first use, then cached)."""
from __future__ import annotations

import argparse
import sys

from ..frontend.gguf_reader import read_model
from ..frontend.registry import resolve
from ..core.errors import KilnError
from ..text.chat import chat_template, render_chat
from ..text.reasoning import format_of, opens_in_thinking
from .common import (add_build_options, add_model_options, add_sampling_options, add_shift_options, add_spec_options,
                     add_threads, check_keep, load, log, options, speculation)
from .thinking import ThinkingView, add_think_option


def run(a: argparse.Namespace) -> None:
    o = options(a)
    check_keep(a)
    prompt, view = a.prompt, None
    if a.no_think and not a.chat:
        raise KilnError("--no-think: only with --chat (a prompt without the chat template has no thinking to skip)")
    if a.chat:  # before compiling, so that a model with no template fails at once
        gguf = read_model(resolve(a.model, log))
        prompt = render_chat(gguf, [{"role": "user", "content": a.prompt}], variables={"enable_thinking": not a.no_think})
        fmt = format_of(chat_template(gguf).source)
        view = ThinkingView(fmt, opens_in_thinking(fmt, prompt), sys.stdout)
    m = load(a, o)
    spec = speculation(a, m)
    ids = m.prompt_ids(prompt)  # tokenized and checked against the context before any output
    if not a.chat:
        sys.stdout.write(a.prompt)
    for piece in m.generate(ids, max_tokens=a.n, temperature=a.temp, top_k=a.top_k, top_p=a.top_p,
                            min_p=a.min_p, repeat_penalty=a.repeat_penalty, seed=a.seed, stream=True,
                            context_shift=a.context_shift, sinks=a.keep, **spec):
        if view is not None:
            view.write(piece)
        else:
            sys.stdout.write(piece)
            sys.stdout.flush()
    if view is not None:
        view.write("", final=True)
    sys.stdout.write("\n")
    if spec:
        log(f"speculative decoding ({a.spec}): {m.spec_stats}")


def register(sub) -> None:
    p = sub.add_parser("run", help="generate text, streaming it (the model is compiled on first use, then cached)",
                       epilog="docs: docs/usage.md")
    add_model_options(p)
    add_build_options(p)
    p.add_argument("-p", "--prompt", required=True, help="the prompt text")
    p.add_argument("-n", type=int, default=128, help="tokens to generate at most")
    add_sampling_options(p)
    p.add_argument("--chat", action="store_true",
                   help="wrap the prompt in the chat template: the GGUF's own, or the architecture's built-in one; a "
                        "reasoning model's thinking is shown dimmed, apart from the answer")
    add_think_option(p)
    add_threads(p)
    add_shift_options(p)
    add_spec_options(p)
    p.set_defaults(run=run)
