"""kiln chat: an interactive conversation in the model's chat template, one sequence held across
turns (runtime/conversation.py), in a terminal loop where Ctrl-C stops a reply, not the conversation."""
from __future__ import annotations

import argparse
import signal
import sys

from ..core.errors import KilnError
from ..frontend.gguf_reader import read_model
from ..frontend.registry import resolve
from ..runtime.conversation import ChatSession
from ..runtime.sampling import SamplingParams
from ..text.chat import chat_template
from .common import (add_build_options, add_model_options, add_sampling_options, add_spec_options, add_threads, load,
                     log, options, speculation)
from .thinking import ThinkingView, add_think_option

HELP = """commands:
  /system TEXT   set the system message (empty: none)
  /reset         forget the conversation (the system message stays)
  /stats         KV cache use and the last turn's speed
  /help          this text
  /exit          leave (Ctrl-D too); Ctrl-C stops a reply, not the conversation"""


def repl(session: ChatSession, banner: str, out=sys.stdout) -> None:
    """Read lines until /exit or end of input; a line is a command or a message."""
    try:
        import readline  # noqa: F401  line editing and history for input(), where the platform has it
    except ImportError:
        pass

    def on_sigint(signum, frame):
        session.interrupted = True

    out.write(banner + "\n")
    while True:
        try:
            line = input("> ")
        except EOFError:
            out.write("\n")
            return
        except KeyboardInterrupt:  # at the prompt: drop the line, as a shell does
            out.write("^C\n")
            continue
        line = line.strip()
        if not line:
            continue
        if line.startswith("/"):
            cmd, _, arg = line.partition(" ")
            if cmd in ("/exit", "/quit"):
                return
            if cmd == "/reset":
                session.reset()
                out.write("(conversation cleared)\n")
            elif cmd == "/stats":
                out.write(session.stats() + "\n")
            elif cmd == "/system":
                session.system = arg.strip()
                out.write(f"(system message {'set' if session.system else 'cleared'})\n")
            elif cmd == "/help":
                out.write(HELP + "\n")
            else:
                out.write(f"unknown command {cmd}; /help lists them\n")
            continue
        session.interrupted = False
        previous = signal.signal(signal.SIGINT, on_sigint)
        view = None
        try:
            for piece in session.reply(line):
                view = view or ThinkingView(session.format, session.opened, out)  # once the prompt is rendered
                view.write(piece)
            if view is not None:
                view.write("", final=True)
        except KilnError as e:  # a message that does not fit the context: say so, keep the conversation
            out.write(f"kiln: {e}; /reset to start over, or run kiln chat with a larger --ctx")
        finally:
            signal.signal(signal.SIGINT, previous)
        out.write(" [stopped]\n" if session.interrupted else "\n")


def run(a: argparse.Namespace) -> None:
    if a.n < 1:
        raise KilnError(f"-n must be at least 1, got {a.n}")
    template = chat_template(read_model(resolve(a.model, log)))  # before compiling: no template fails at once
    m = load(a, options(a))
    session = ChatSession(m, SamplingParams(a.temp, a.top_k, a.top_p, a.min_p, a.repeat_penalty, seed=a.seed), a.n,
                          speculation(a, m), think=not a.no_think)
    session.system = a.system or ""
    repl(session, f"kiln chat: {m.path.name}, ctx {m.n_ctx}, chat template from {template.origin}. "
                  "/help for commands, Ctrl-C stops a reply, Ctrl-D leaves.")


def register(sub) -> None:
    p = sub.add_parser("chat", help="an interactive conversation in the model's chat template; each turn "
                                    "prefills only the new message", epilog="docs: docs/c-library.md")
    add_model_options(p)
    add_build_options(p)
    add_sampling_options(p)
    p.add_argument("-n", type=int, default=512, help="tokens a reply may take at most")
    p.add_argument("--system", default=None, help="the system message to start with (/system changes it)")
    add_think_option(p)
    add_threads(p)
    add_spec_options(p)
    p.set_defaults(run=run)
