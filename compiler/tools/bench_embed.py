"""`kiln bench --embed`: an embedding model's throughput and latency, kiln and llama.cpp side by
side in one run, on the same GGUF and threads.

- throughput: 512 documents of 16 to 256 tokens (a seeded draw; the words of the project's long
  text, tokenized and cut), embedded in one call, inputs a second;
- latency: one 32-token query embedded alone (a search box), inputs a second.

Both engines get the same token ids and pack whole inputs into their steps: kiln up to its
planned step (`batch_tokens` rows, `n_seq` inputs), llama.cpp (its embedding example's packing,
llama_decode with embeddings on) up to n_batch rows and the same sequences, at the n_batch of
LLAMA_BATCHES that is fastest for it (its attention over a batch is masked, so a larger batch
costs it more). Each figure is the median of `reps` timed runs after one warm-up, the engines
alternating so that a noisy neighbour hits both.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

N_DOCS, SHORTEST, LONGEST, QUERY = 512, 16, 256, 32
LLAMA_BATCHES = (256, 512)  # llama.cpp's n_batch (= n_ubatch) tried (256: the longest document); its best is reported


@dataclass(frozen=True)
class EmbedRow:
    test: str
    inputs: int
    tokens: int
    kiln_inputs_s: float
    llamacpp_inputs_s: float
    llamacpp_n_batch: int

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
    engines = {"kiln": lambda inputs: m.embed(inputs, pooling=kind)}
    rivals = {nb: LlamaCpp(path, n_ctx=nb, n_batch=nb, threads=threads, n_seq=n_seq, pooling=POOLING[kind])
              for nb in LLAMA_BATCHES}
    engines |= {f"llama.cpp {nb}": rival.embed for nb, rival in rivals.items()}
    docs, query = workload(m.tokenize, m.n_ctx)
    log(f"embed bench: {len(docs)} documents, {sum(map(len, docs)):,} tokens; a query of {len(query)}")
    out = []
    for name, inputs in {"512 docs": docs, f"query {len(query)}": [query]}.items():
        times: dict[str, list[float]] = {e: [] for e in engines}
        repeat = 1 if len(inputs) > 1 else 20  # a query is timed over 20 calls a rep
        for rep in range(reps + 1):
            for engine, call in engines.items():
                t = time.perf_counter()
                for _ in range(repeat):
                    call(inputs)
                if rep:
                    times[engine].append((time.perf_counter() - t) / repeat)
        rate = {e: len(inputs) / statistics.median(v) for e, v in times.items()}
        best = max(LLAMA_BATCHES, key=lambda nb: rate[f"llama.cpp {nb}"])
        out.append(EmbedRow(name, len(inputs), sum(map(len, inputs)), rate["kiln"], rate[f"llama.cpp {best}"], best))
        log(f"{name}: " + ", ".join(f"{e} {r:,.1f} inputs/s" for e, r in rate.items()))
    for rival in rivals.values():
        rival.close()
    return out


def render(rows: list[EmbedRow], model: str, threads: int) -> str:
    lines = [f"kiln bench --embed: {model}, {threads} threads (inputs per second, median)", "",
             f"{'test':<12} {'inputs':>7} {'tokens':>8} {'kiln':>10} {'llama.cpp':>10} {'(n_batch)':>9} {'ratio':>7}"]
    for r in rows:
        lines.append(f"{r.test:<12} {r.inputs:>7} {r.tokens:>8,} {r.kiln_inputs_s:>10,.1f} "
                     f"{r.llamacpp_inputs_s:>10,.1f} {r.llamacpp_n_batch:>9} {r.ratio:>6.2f}x")
    return "\n".join(lines) + "\n"


def as_json(rows: list[EmbedRow]) -> list[dict]:
    return [asdict(r) | {"ratio": r.ratio} for r in rows]
