"""How many tokens a sequence drafts in a step: what a step of r rows costs (StepCost, timed on the
model), and how likely each drafted token is to hold (DraftLength).

A drafted token is worth its row only if it is likely to hold, and how likely that is depends on
what backs it: a guess that the history agrees with over many tokens (a passage being copied)
holds far more often than one backed by two tokens that happen to recur. DraftLength keeps the
acceptance rate per class of that agreement (its run length, in powers of two), so one sequence
drafts long while it copies and short or not at all where its guesses are coincidences, within
the same text, without a constant tuned to any text.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field

RUN_CLASSES = 7  # run lengths 0, 1, 2-3, 4-7, 8-15, 16-31, 32 and more


@dataclass
class StepCost:
    """A step's time as a function of its rows, from the row counts timed on the model (rows ->
    time, any unit): linear between two of them, and past the last at the mean cost of a row from
    one row to there. The default is the model before timing: a step of r rows costs 4 + r, the
    weights' read four times one row's compute. The curve is timed, not assumed, because it is no
    line: on a CPU a one-row step runs matrix-vector kernels, the next rows cost more than a row
    costs in a long step, and row counts that fill the kernels' tiles cost less than some below
    them. Timings are each the best of several runs, so a reading is high by noise, never low."""
    points: dict[int, float] = field(default_factory=lambda: {1: 5.0, 2: 6.0})

    def __post_init__(self):
        self.rows = sorted(self.points)
        if not self.rows or self.rows[0] != 1 or len(self.rows) < 2:
            raise ValueError(f"StepCost needs the time of one row and of at least one more row count, got {self.rows}")

    def time(self, rows: int) -> float:
        p, last = self.points, self.rows[-1]
        if rows in p:
            return p[rows]
        if rows > last:
            return p[last] + (rows - last) * (p[last] - p[1]) / (last - 1)
        i = bisect.bisect_right(self.rows, rows)
        r0, r1 = self.rows[i - 1], self.rows[i]
        return p[r0] + (p[r1] - p[r0]) * (rows - r0) / (r1 - r0)


def run_class(run: int) -> int:
    return min(run.bit_length(), RUN_CLASSES - 1)


@dataclass
class DraftLength:
    """Per sequence: the acceptance rate of a drafted token by the run length behind it (how many
    tokens before it the history agrees with: the match a prompt-lookup guess rests on, grown by
    each drafted token before it), as exponentially weighted counts per run class, and the k
    they make worth drafting. Each class's prior (weight `prior`, in observations) is the rate of
    the class below: a run longer than any seen yet is first trusted as far as the shorter ones
    earned, and the lowest class starts at one hit and one miss."""
    max_draft: int
    cost: StepCost = field(default_factory=StepCost)
    decay: float = 0.95
    prior: float = 2.0
    counts: list[list[float]] = field(default_factory=lambda: [[0.0, 0.0] for _ in range(RUN_CLASSES)])

    def rates(self) -> list[float]:
        out: list[float] = []
        for hits, misses in self.counts:
            out.append((hits + self.prior * (out[-1] if out else 0.5)) / (hits + misses + self.prior))
        return out

    def rate(self, run: int = 0) -> float:
        return self.rates()[run_class(run)]

    def observe(self, accepted: int, drafted: int, run: int = 0) -> None:
        """A verification of `drafted` tokens after a run of `run`: the first `accepted` held, then
        (if fewer than drafted) one missed; tokens after a miss tell nothing."""
        for i in range(accepted + (accepted < drafted)):
            c = self.counts[run_class(run + i)]
            c[0], c[1] = self.decay * c[0] + (i < accepted), self.decay * c[1] + (i >= accepted)

    def choose(self, decodes: int = 1, rows: int | None = None, run: int = 0) -> int:
        """The k that maximizes tokens per unit of step time, for a step that already yields
        `decodes` tokens (one per decoding sequence) from `rows` rows (default: decodes; a server's
        step may hold prompt chunks too), drafting after a run of `run`: the i-th draft holds
        (given those before it did) at the rate of run + i's class."""
        rates, base = self.rates(), decodes if rows is None else rows
        best, best_k, yield_k, reach = decodes / self.cost.time(base), 0, 1.0, 1.0
        for k in range(1, self.max_draft + 1):
            reach *= min(rates[run_class(run + k - 1)], 0.999)
            yield_k += reach
            value = (decodes - 1 + yield_k) / self.cost.time(base + k)
            if value > best * 1.0001:  # ties go to fewer rows
                best, best_k = value, k
        return best_k
