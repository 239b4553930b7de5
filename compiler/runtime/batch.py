"""generate_batch's loop: prompts decoded together, one step a token for every sequence still
running, in waves of as many sequences as the model has free (Model.generate_batch checks the
arguments and builds each prompt's sampler, constraint and speculation first)."""
from __future__ import annotations

from .constraints import Guide
from .sampling import LogitBias, SamplingParams
from .spec_decode import decode_wave
from .speculation import Speculation
from .status import ModelError


def run_waves(m, ids: list[list[int]], params: list[SamplingParams], stops: list[str], max_tokens: int,
              sinks: int | None, guides: list[Guide | None], bias: LogitBias | None,
              spec: Speculation | None) -> list[str]:
    """Each prompt's text (m: the Model, which calls this). A wave takes sequences until the pool has
    none free (at least one)."""
    out: list[str] = [""] * len(ids)
    todo = list(range(len(ids)))
    while todo:
        wave: list[tuple[int, object]] = []  # (prompt index, its Sequence)
        try:
            while todo:
                wave.append((todo[0], m.sequence()))
                todo.pop(0)
        except ModelError:
            if not wave:
                raise
        try:
            if spec is not None:
                decode_wave(m, wave, ids, params, stops, max_tokens, out, sinks, spec, m.spec_stats, guides, bias)
            else:
                _decode_together(m, wave, ids, params, stops, max_tokens, out, sinks, guides, bias)
        finally:
            for _, s in wave:
                s.close()
    return out


def _decode_together(m, wave, ids, params, stops, max_tokens, out, sinks: int | None,
                     guides: list[Guide | None], bias: LogitBias | None) -> None:
    running = [(i, s, m.decoding(ids[i], params[i], stops, max_tokens, context_shift=sinks is not None,
                                 guide=guides[i], bias=bias), s.prefill(ids[i])) for i, s in wave]
    while running:
        step = []
        for i, s, run, logits in running:
            got = run.next(logits, s.n_past)
            out[i] += got.text
            if not got.finish_reason:
                step.append((i, s, run, got.token))
        if not step:
            return
        for _, s, _, _ in step:
            if sinks is not None:
                s.shift_if_full(sinks)
        rows = m.step([(s, tok) for _, s, _, tok in step])
        running = [(i, s, run, row) for (i, s, run, _), row in zip(step, rows)]
