"""The multi-tenant workload of tests/test_ray.py, driven through the real openai client: chat
requests that open with one of a few tenants' long system prompts, streamed or not, at a fixed
concurrency, each request's end recorded as its client saw it (what it showed, which replica
answered it, which one died under it, how it ended)."""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import numpy as np
import openai

from compiler.tools.bench_serve import WORDS
from server_process import MODEL

Request = tuple[int, list[dict], bool]  # (tenant, messages, streamed)


def tenant_requests(n: int = 64, tenants: int = 4, seed: int = 7, stream_every: int = 1) -> list[Request]:
    """n chat requests, each opening with one of `tenants` system prompts of about 500 tokens;
    every `stream_every`-th one (from the first) streamed, the others answered whole."""
    rng = np.random.default_rng(seed)
    systems = [f"You are the assistant of tenant {t}. " + " ".join(rng.choice(WORDS, 430)) for t in range(tenants)]
    out = []
    for i in range(n):
        t = int(rng.integers(tenants))
        question = f"Request {i}: tell me about " + " ".join(rng.choice(WORDS, int(rng.integers(3, 12))))
        out.append((t, [{"role": "system", "content": systems[t]}, {"role": "user", "content": question}],
                    i % stream_every == 0))
    return out


@dataclass
class Outcome:
    """One request, as its client saw it."""
    index: int
    tenant: int
    streamed: bool
    text: str = ""  # the content shown so far: all of it, for a completed request
    replica: str | None = None  # x-kiln-replica: the replica that answered
    retried_from: str | None = None  # x-kiln-retried-from: the replica that died under it first
    done: bool = False  # completed, with a finish_reason and the usage
    error: str | None = None  # an OpenAI-shaped error: an HTTP error or a stream's error event
    lost: str | None = None  # anything else: a timeout, a dropped connection, a stream cut short

    @property
    def ended(self) -> bool:
        return self.done or self.error is not None or self.lost is not None

    def __str__(self) -> str:
        return (f"request {self.index} ({'a stream' if self.streamed else 'not streamed'}, tenant {self.tenant}, "
                f"answered by {self.replica}" + (f", retried from {self.retried_from}" if self.retried_from else "")
                + f", {len(self.text)} characters shown)")


@dataclass
class Run:
    wall: float = 0.0
    ttft: list[float] = field(default_factory=list)  # streams' time to their first content
    output: int = 0
    prompt: int = 0
    cached: int = 0
    by_replica: dict = field(default_factory=dict)  # tenant -> {replica: requests completed}
    outcomes: dict[int, Outcome] = field(default_factory=dict)  # by the request's index

    @property
    def completed(self) -> int:
        return sum(o.done for o in self.outcomes.values())

    @property
    def errors(self) -> list[str]:
        return [f"{o}: {o.error}" for o in self.outcomes.values() if o.error is not None]

    @property
    def lost(self) -> list[str]:
        return [f"{o}: {o.lost}" for o in self.outcomes.values() if o.lost is not None]

    def in_flight(self) -> list[Outcome]:
        return [o for o in self.outcomes.values() if not o.ended]

    def row(self, name: str) -> str:
        p50, p99 = (np.percentile(self.ttft, q) if self.ttft else float("nan") for q in (50, 99))
        return (f"| {name} | {self.cached / self.prompt:.1%} | {self.output / self.wall:.1f} | {p50:.3f} s | "
                f"{p99:.3f} s | {self.wall:.1f} s |")


async def _one(client: openai.AsyncOpenAI, index: int, request: Request, run: Run, max_tokens: int,
               progress) -> None:
    """One request, greedy, ignoring EOS: `progress(run)` when it starts, when a stream first shows
    content, and when it ends."""
    tenant, messages, streamed = request
    o = run.outcomes[index] = Outcome(index, tenant, streamed)
    progress(run)
    start, first, usage, finish = time.perf_counter(), None, None, None
    try:
        raw = await client.chat.completions.with_raw_response.create(
            model=MODEL, messages=messages, max_tokens=max_tokens, temperature=0, stream=streamed,
            extra_body={"ignore_eos": True}, **({"stream_options": {"include_usage": True}} if streamed else {}))
        o.replica, o.retried_from = raw.headers.get("x-kiln-replica"), raw.headers.get("x-kiln-retried-from")
        if streamed:
            async for chunk in raw.parse():
                usage = chunk.usage or usage
                for c in chunk.choices:
                    finish = c.finish_reason or finish
                    if c.delta.content:
                        o.text += c.delta.content
                        if first is None:
                            first = time.perf_counter() - start
                            progress(run)
        else:
            answer = raw.parse()
            o.text, finish, usage = answer.choices[0].message.content or "", answer.choices[0].finish_reason, \
                answer.usage
    except openai.APIConnectionError as e:  # a timeout or a dropped connection
        o.lost = f"{e!r} ({e.__cause__!r})"
    except openai.APIError as e:  # an HTTP error or an error event: OpenAI's shape, or it is lost
        body = e.body if isinstance(e.body, dict) else None
        shaped = body is not None and isinstance(body.get("message"), str) and isinstance(body.get("type"), str)
        if shaped:
            o.error = f"{getattr(e, 'status_code', None)} {e}"
        else:
            o.lost = f"an error not of OpenAI's shape: {getattr(e, 'status_code', None)} {e}"
    else:
        if finish is None or usage is None:
            o.lost = f"it ended without a finish_reason or usage (finish {finish})"
        else:
            o.done = True
            if streamed:
                run.ttft.append(first)
            run.output += usage.completion_tokens
            run.prompt += usage.prompt_tokens
            run.cached += usage.prompt_tokens_details.cached_tokens or 0
            counts = run.by_replica.setdefault(tenant, {})
            counts[o.replica] = counts.get(o.replica, 0) + 1
    progress(run)


def drive(url: str, requests: list[Request], concurrency: int, max_tokens: int = 16, progress=None) -> Run:
    """The requests, in order, at `concurrency` through the real openai client."""
    run = Run()

    async def main():
        todo = list(enumerate(requests))
        async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", timeout=300, max_retries=0) as client:
            async def worker():
                while todo:
                    index, request = todo.pop(0)
                    await _one(client, index, request, run, max_tokens, progress or (lambda run: None))

            start = time.perf_counter()
            await asyncio.gather(*(worker() for _ in range(concurrency)))
            run.wall = time.perf_counter() - start

    asyncio.run(main())
    return run
