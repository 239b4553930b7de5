"""A multi-turn conversation on one sequence (`kiln chat`'s; cli/chat.py is its terminal loop).

The conversation is rendered with the model's chat template on every turn, and the sequence
keeps what it already holds of it: the rendering of the earlier turns is a prefix of the new
one, so a turn prefills only the new message and the template's glue around it (the reply the
model wrote is already in the cache). Ctrl-C stops a reply between two tokens, so the cache
and the history always agree.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from ..text.chat import chat_template, render_chat
from ..text.reasoning import format_of, opens_in_thinking
from ..core.errors import KilnError
from ..core.sequences import common_prefix
from .model import Model
from .sampling import SamplingParams

@dataclass
class TurnStats:
    prompt_tokens: int = 0  # the whole rendered conversation
    reused: int = 0  # of them, already in the cache
    prefilled: int = 0
    prefill_s: float = 0.0
    generated: int = 0
    decode_s: float = 0.0
    stopped: str = ""  # "stop", "length" or "interrupted"

    def render(self) -> str:
        if not self.prompt_tokens:
            return "last turn: none yet"
        pp = f"{self.prefilled / self.prefill_s:.1f} tok/s" if self.prefill_s > 0 else "-"
        tg = f"{(self.generated - 1) / self.decode_s:.1f} tok/s" if self.generated > 1 and self.decode_s > 0 else "-"
        return (f"last turn: prompt {self.prompt_tokens} tokens, {self.reused} reused from the cache, "
                f"{self.prefilled} prefilled ({pp}); {self.generated} generated ({tg}), {self.stopped}")


class ChatSession:
    """A conversation held in one sequence of `model`."""

    def __init__(self, model: Model, params: SamplingParams, max_tokens: int, speculation: dict | None = None,
                 think: bool = True):
        self.model, self.params, self.max_tokens = model, params, max_tokens
        self.speculation = speculation or {}  # generate()'s speculative, draft_model, max_draft
        self.template = chat_template(model.spec)  # refused at once when the model has none
        self.format = format_of(self.template.source)  # how its replies mark their thinking (text/reasoning.py)
        self.variables = {"enable_thinking": think}  # as llama-server passes it; a template may ignore it
        self.opened = False  # this turn's reply starts inside a thinking section its prompt opened
        self.seq = model.sequence()
        self.system = ""
        self.history: list[dict[str, str]] = []
        self.last = TurnStats()
        self.interrupted = False  # set by the SIGINT handler from before a reply's prefill to its end

    def messages(self) -> list[dict[str, str]]:
        return ([{"role": "system", "content": self.system}] if self.system else []) + self.history

    def reply(self, message: str):
        """Yield the model's reply to `message` piece by piece; the history gets both. A message
        the context cannot take raises a KilnError and leaves the history as it was."""
        self.history.append({"role": "user", "content": message})
        try:
            prompt = render_chat(self.model.spec, self.messages(), variables=self.variables)
            self.opened = opens_in_thinking(self.format, prompt)
            ids = self.model.prompt_ids(prompt)
        except KilnError:
            self.history.pop()
            raise
        st = self.last = TurnStats(prompt_tokens=len(ids), reused=min(common_prefix(self.seq.tokens, ids), len(ids) - 1))
        st.prefilled = len(ids) - st.reused
        p = self.params
        pieces = self.seq.generate(ids, max_tokens=self.max_tokens, temperature=p.temperature, top_k=p.top_k,
                                   top_p=p.top_p, min_p=p.min_p, repeat_penalty=p.repeat_penalty, seed=p.seed,
                                   stream=True, **self.speculation)
        text, t0, t_first = [], time.perf_counter(), None
        try:
            for piece in pieces:
                t_first = t_first or time.perf_counter()
                text.append(piece)
                yield piece
                if self.interrupted:
                    break
        finally:
            pieces.close()  # between two tokens: the cache holds what seq.tokens says
            now = time.perf_counter()
            fed = max(0, len(self.seq.tokens) - len(ids))  # generated tokens already in the cache
            full = fed + 1 >= self.max_tokens or self.seq.n_past + 1 >= self.model.n_ctx
            st.stopped = "interrupted" if self.interrupted else "length" if full else "stop"
            st.generated = fed + (st.stopped != "stop")  # the last sampled token is not fed back then
            st.prefill_s, st.decode_s = (t_first or now) - t0, now - (t_first or now)
            self.history.append({"role": "assistant", "content": "".join(text)})

    def reset(self) -> None:
        self.history.clear()
        self.seq.reset()
        self.last = TurnStats()

    def stats(self) -> str:
        m = self.model
        kv = m.kv_stats()
        pages = ", ".join(f"{g['pages_used']} of {g['pages_total']}" for g in kv["groups"])
        return (f"KV cache: {self.seq.n_past} of {m.n_ctx} positions held, pages used {pages} "
                f"({m.page_size} positions a page), {len(self.history)} messages\n{self.last.render()}"
                + (f"\nspeculative decoding, last turn: {m.spec_stats}" if self.speculation and m.spec_stats else ""))
