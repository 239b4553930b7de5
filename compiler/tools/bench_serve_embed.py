"""`kiln bench-serve --embed`: kiln serve and llama-server --embedding on the same GGUF and threads,
one after the other, with the same load over HTTP:

- throughput: bench_embed's 512 documents as 64 requests of 8, `concurrency` in flight, inputs a
  second over the whole run;
- latency: a 32-token query alone, 20 requests one after another, the median.

Inputs go as token ids, so that both servers embed exactly the same rows. llama-server gets as
many slots as requests in flight, and a batch of 512 (its fastest in kiln bench --embed).
"""
from __future__ import annotations

import asyncio
import statistics
import sys
import time
from pathlib import Path

import httpx

from .bench_embed import workload
from .bench_serve import _free_port, _Process, find_llama_server

PER_REQUEST = 8


async def _throughput(url: str, model: str, docs: list[list[int]], concurrency: int) -> float:
    sem = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=concurrency)) as client:
        async def one(batch: list[list[int]]) -> None:
            async with sem:
                r = await client.post(url + "/v1/embeddings", json={"model": model, "input": batch})
                r.raise_for_status()
                assert len(r.json()["data"]) == len(batch)
        t = time.perf_counter()
        await asyncio.gather(*(one(docs[i:i + PER_REQUEST]) for i in range(0, len(docs), PER_REQUEST)))
        return len(docs) / (time.perf_counter() - t)


def _latency(url: str, model: str, query: list[int], n: int = 20) -> float:
    with httpx.Client(timeout=600) as client:
        times = []
        for _ in range(n + 1):
            t = time.perf_counter()
            client.post(url + "/v1/embeddings", json={"model": model, "input": [query]}).raise_for_status()
            times.append(time.perf_counter() - t)
    return statistics.median(times[1:])


def run(model_path: Path, model_name: str, threads: int, concurrency: int, llama_server: str | None, tokenize,
        n_ctx: int, pooling: str, log=print, logdir: Path = Path("/tmp")) -> list[dict]:
    docs, query = workload(tokenize, n_ctx)
    servers = [("kiln serve", [sys.executable, "-m", "compiler", "serve", str(model_path), "--alias", model_name,
                               "--n-seq", str(concurrency * PER_REQUEST), "--threads", str(threads)])]
    if llama_server != "none":
        servers.append(("llama-server", [find_llama_server(llama_server), "-m", str(model_path), "--alias",
                                         model_name, "--embedding", "--pooling", pooling, "--parallel",
                                         str(concurrency * PER_REQUEST), "-c", str(n_ctx * concurrency * PER_REQUEST),
                                         "-b", "512", "-ub", "512", "-t", str(threads), "-tb", str(threads),
                                         "--no-webui"]))
    rows = []
    for name, argv in servers:
        port = _free_port()
        log(f"starting {name}")
        proc = _Process([*argv, "--port", str(port)], f"http://127.0.0.1:{port}", name,
                        logdir / f"kiln-bench-serve-embed-{name.split()[0]}.log")
        try:
            asyncio.run(_throughput(proc.url, model_name, docs[:16], 2))  # warm-up
            rate = asyncio.run(_throughput(proc.url, model_name, docs, concurrency))
            latency = _latency(proc.url, model_name, query)
        finally:
            proc.close()
        rows.append({"server": name, "inputs_per_s": rate, "query_latency_s": latency})
        log(f"{name}: {rate:,.1f} inputs/s, a {len(query)}-token query in {latency * 1e3:.1f} ms")
    return rows


def render(rows: list[dict], concurrency: int) -> str:
    lines = [f"512 documents of 16-256 tokens in requests of {PER_REQUEST}, {concurrency} in flight; a 32-token "
             "query alone", "", "| server | inputs/s | query latency p50 |", "|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['server']} | {r['inputs_per_s']:,.1f} | {r['query_latency_s'] * 1e3:.1f} ms |")
    by = {r["server"]: r for r in rows}
    if len(by) == 2:
        k, l = by["kiln serve"], by["llama-server"]
        lines.append(f"\nkiln / llama-server: inputs/s {k['inputs_per_s'] / l['inputs_per_s']:.2f}x, query "
                     f"latency {l['query_latency_s'] / k['query_latency_s']:.2f}x faster")
    return "\n".join(lines)
