"""`kiln bench-serve --constrained`: what a JSON schema costs per token, served.

For each batch size B (1 and 8): B clients send the same requests twice, streamed, to one server,
and again (three times, alternating; each request's median is taken). In the first run every
request is free; in the second the constrained ones (all of them at B=1,
every other one at B=8, so that constrained rows share steps with free ones) carry a JSON schema.
A request's cost per token is the time between its first and last streamed token over the tokens
between them. The table sets each request's cost in the second run against its cost in the
first: the schema's cost on its own rows, and what it costs the free rows beside them.

The schema asks for a long array of strings (64 at least), so that a constrained answer runs to
max_tokens as a free one does (ignore_eos): both runs time the same number of tokens. llama-server
(`make llama-server`) gets the same requests with its `json_schema` field, when it is there.
"""
from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

import httpx
import numpy as np

from ..core.errors import KilnError
from .bench_serve import WORDS, _free_port, _Process, find_llama_server, load_client

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["title", "facts"],
          "properties": {"title": {"type": "string", "maxLength": 40},
                         "facts": {"type": "array", "minItems": 64, "items": {"type": "string", "maxLength": 60}}}}
SYSTEM = "You are a patient guide. You answer with facts, in JSON when asked."


def requests(n: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    return ["List facts about " + " ".join(rng.choice(WORDS, int(rng.integers(5, 30)))) for _ in range(n)]


async def _one(client: httpx.AsyncClient, url: str, model: str, question: str, max_tokens: int,
               schema_field: str | None) -> float:
    """The request's seconds per token, between its first and last streamed tokens."""
    body = {"model": model, "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
            "max_tokens": max_tokens, "temperature": 0, "stream": True}
    if schema_field == "response_format":
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "facts", "schema": SCHEMA}}
    elif schema_field == "json_schema":
        body["json_schema"] = SCHEMA
    else:
        body["ignore_eos"] = True
    stamps = []
    async with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            raise KilnError(f"{url}: HTTP {r.status_code}: {(await r.aread())[:300]!r}")
        async for line in r.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunk = json.loads(line[6:])
                if any(c.get("delta", {}).get("content") for c in chunk.get("choices", [])):
                    stamps.append(time.perf_counter())
    if len(stamps) < 8:
        raise KilnError(f"{url}: only {len(stamps)} tokens streamed")
    return (stamps[-1] - stamps[0]) / (len(stamps) - 1)


async def _drive(url: str, model: str, questions: list[str], constrained: set[int], concurrency: int,
                 max_tokens: int, schema_field: str) -> list[float]:
    out = [0.0] * len(questions)
    todo = list(range(len(questions)))
    async with load_client(concurrency) as c:
        async def worker():
            while todo:
                i = todo.pop(0)
                out[i] = await _one(c, url, model, questions[i], max_tokens, schema_field if i in constrained else None)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return out


def run(model_path: Path, model_name: str, threads: int, ctx: int, kv_dtype: str, llama_server: str | None,
        n_requests: int = 16, max_tokens: int = 128, reps: int = 3, log=print,
        logdir: Path = Path("/tmp")) -> list[dict]:
    servers = [("kiln serve", lambda port: [sys.executable, "-m", "compiler", "serve", str(model_path), "--alias",
                                            model_name, "--port", str(port), "--n-seq", "8", "--ctx", str(ctx),
                                            "--kv-dtype", kv_dtype, "--threads", str(threads)], "response_format")]
    if llama_server != "none":
        binary = find_llama_server(llama_server)
        servers.append(("llama-server", lambda port: [binary, "-m", str(model_path), "--alias", model_name, "--port",
                                                      str(port), "--parallel", "8", "--cont-batching", "-c",
                                                      str(ctx * 8), "-t", str(threads), "-tb", str(threads), "-ctk",
                                                      kv_dtype, "-ctv", kv_dtype, "--no-webui"], "json_schema"))
    rows = []
    for name, argv, field in servers:
        port = _free_port()
        log(f"starting {name}")
        proc = _Process(argv(port), f"http://127.0.0.1:{port}", name, logdir / f"kiln-bench-constrained-{name.split()[0]}.log")
        try:
            asyncio.run(_drive(proc.url, model_name, requests(2, seed=1), {1}, 1, 16, field))  # warm-up, untimed
            for b in (1, 8):
                questions = requests(n_requests if b > 1 else 4)
                constrained = set(range(len(questions))) if b == 1 else set(range(0, len(questions), 2))
                log(f"{name}: B={b}, {len(questions)} requests, free then {len(constrained)} constrained, {reps} times")
                runs = [[asyncio.run(_drive(proc.url, model_name, questions, which, b, max_tokens, field))
                         for which in (set(), constrained)] for _ in range(reps)]  # alternated: noise falls on both
                free, mixed = (np.median([r[k] for r in runs], axis=0) for k in (0, 1))  # each request's median
                ratio = mixed / free
                c = sorted(constrained)
                others = [i for i in range(len(questions)) if i not in constrained]
                rows.append({"server": name, "B": b, "requests": len(questions), "constrained": len(c),
                             "free_ms": 1e3 * float(np.median([free[i] for i in c])),
                             "constrained_ms": 1e3 * float(np.median([mixed[i] for i in c])),
                             "overhead": float(np.median(ratio[c])) - 1,
                             "neighbours_overhead": float(np.median(ratio[others])) - 1 if others else None})
        finally:
            proc.close()
    return rows


def render(rows: list[dict], max_tokens: int = 128) -> str:
    lines = [f"JSON schema (an object with an array of at least 64 strings) against the same requests free "
             f"(ignore_eos), {max_tokens} tokens each, streamed, temperature 0; medians over requests",
             "",
             "| server | B | constrained / requests | ms/token free | ms/token constrained | overhead | "
             "free rows beside them |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        beside = "-" if r["neighbours_overhead"] is None else f"{r['neighbours_overhead']:+.1%}"
        lines.append(f"| {r['server']} | {r['B']} | {r['constrained']} / {r['requests']} | {r['free_ms']:.2f} | "
                     f"{r['constrained_ms']:.2f} | {r['overhead']:+.1%} | {beside} |")
    return "\n".join(lines)
