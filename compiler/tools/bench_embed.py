"""`kiln bench --embed`: an embedding model's throughput and latency, kiln and llama.cpp side by
side in one run, on the same GGUF and threads.

- throughput: 512 documents of 16 to 256 tokens (a seeded draw; the words of the project's long
  text, tokenized and cut), embedded in one call, inputs a second;
- latency: one 32-token query embedded alone (a search box), inputs a second.

Both engines get the same token ids and pack whole inputs into their steps: kiln up to its
planned step (`batch_tokens` rows, `n_seq` inputs), llama.cpp (its embedding example's packing,
llama_decode with embeddings on) up to the same rows and sequences. Each figure is the median of
`reps` timed runs after one warm-up, the engines alternating so that a noisy neighbour hits both.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

N_DOCS, SHORTEST, LONGEST, QUERY = 512, 16, 256, 32


@dataclass(frozen=True)
class EmbedRow:
    test: str
    inputs: int
    tokens: int
    kiln_inputs_s: float
    llamacpp_inputs_s: float

    @property
    def ratio(self) -> float:
        return self.kiln_inputs_s / self.llamacpp_inputs_s


def workload(tokenize, limit: int) -> tuple[list[list[int]], list[int]]:
    """The documents and the query as token ids: runs of the long text's words, each tokenized
    with the model's special tokens and cut to its drawn length (its last token kept)."""
    words = (Path(__file__).parent / "data" / "long_text.txt").read_text(encoding="utf-8").split()
    rng = np.random.default_rng(0)
    docs = []
    for n in rng.integers(SHORTEST, min(LONGEST, limit) + 1, N_DOCS):
        start = int(rng.integers(0, len(words) - 300))
        ids = tokenize(" ".join(words[start:start + 300]))
        docs.append(ids[:n - 1] + ids[-1:])
    query = tokenize(" ".join(words[:40]))
    return docs, query[:QUERY - 1] + query[-1:]


def run(path: Path, threads: int, reps: int, n_seq: int = 32, rows: int = 2048, log=print) -> list[EmbedRow]:
    from ..runtime import load
    from ..runtime.embedding import POOLING, default_pooling
    from .llamacpp import LlamaCpp

    m = load(path, threads=threads, n_seq=n_seq, batch_tokens=rows)
    kind = default_pooling(m)
    theirs = LlamaCpp(path, n_ctx=rows, n_batch=rows, threads=threads, n_seq=n_seq, pooling=POOLING[kind])
    docs, query = workload(m.tokenize, m.n_ctx)
    log(f"embed bench: {len(docs)} documents, {sum(map(len, docs)):,} tokens; a query of {len(query)}")
    tests = {"512 docs": docs, f"query {len(query)}": [query]}
    out = []
    for name, inputs in tests.items():
        times: dict[str, list[float]] = {"kiln": [], "llama.cpp": []}
        calls = {"kiln": lambda: m.embed(inputs, pooling=kind), "llama.cpp": lambda: theirs.embed(inputs)}
        repeat = 1 if len(inputs) > 1 else 20  # a query is timed over 20 calls a rep
        for rep in range(reps + 1):
            for engine, call in calls.items():
                t = time.perf_counter()
                for _ in range(repeat):
                    call()
                if rep:
                    times[engine].append((time.perf_counter() - t) / repeat)
        med = {e: statistics.median(v) for e, v in times.items()}
        out.append(EmbedRow(name, len(inputs), sum(map(len, inputs)), len(inputs) / med["kiln"],
                            len(inputs) / med["llama.cpp"]))
        log(f"{name}: kiln {out[-1].kiln_inputs_s:,.1f} inputs/s, llama.cpp {out[-1].llamacpp_inputs_s:,.1f}")
    theirs.close()
    return out


def render(rows: list[EmbedRow], model: str, threads: int) -> str:
    lines = [f"kiln bench --embed: {model}, {threads} threads (inputs per second, median)", "",
             f"{'test':<12} {'inputs':>7} {'tokens':>8} {'kiln':>10} {'llama.cpp':>10} {'ratio':>7}"]
    for r in rows:
        lines.append(f"{r.test:<12} {r.inputs:>7} {r.tokens:>8,} {r.kiln_inputs_s:>10,.1f} "
                     f"{r.llamacpp_inputs_s:>10,.1f} {r.ratio:>6.2f}x")
    return "\n".join(lines) + "\n"


def as_json(rows: list[EmbedRow]) -> list[dict]:
    return [asdict(r) | {"ratio": r.ratio} for r in rows]
