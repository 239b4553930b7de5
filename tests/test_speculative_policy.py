"""Prompt lookup's drafter and its draft length (runtime/prompt_lookup.py, draft_length.py), unit by
unit and without timing: the cursor that follows a copy, the acceptance rates by run length, the
step-cost curve, and that the held-out texts of kiln bench --spec are not in its tuning set.
That speculation leaves the output as plain decoding's is test_speculative.py's.

Each behaviour is checked against the choice it replaced (the latest occurrence, one rate for every
guess, a step cost linear in its rows): the same assertion fails with the feature switched off.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from compiler.runtime import draft_length
from compiler.runtime.draft_length import DraftLength, StepCost
from compiler.runtime.prompt_lookup import LookupDrafts, PromptLookup
from compiler.tools import bench_spec

# A step's time by rows as a CPU gives it: the second row costs more than each one after it.
MEASURED = StepCost({1: 3.8, 2: 5.3, 3: 6.1, 5: 7.9, 9: 11.0, 17: 19.5})


def _reference(history: list[int], n_max: int, n_min: int) -> tuple[int, list[int]]:
    """By rescan: the longest n (n_min..n_max) whose n-gram ends the history and occurred before, and
    every place it ended (whose next token is known)."""
    for n in range(min(n_max, len(history) - 1), n_min - 1, -1):
        tail = history[-n:]
        ends = [e for e in range(n, len(history)) if history[e - n:e] == tail]
        if ends:
            return n, ends
    return 0, []


def test_the_cursor_is_one_of_the_longest_matches_and_its_run_is_the_agreement():
    rng = np.random.default_rng(0)
    for _ in range(100):
        history: list[int] = []
        lookup = PromptLookup(history, n_max=4, n_min=2)
        for _ in range(80):
            history.append(int(rng.integers(0, 4)))
            got = lookup.propose(3)
            n, ends = _reference(history, 4, 2)
            if not ends:
                assert got == [] and lookup.cursor is None
                continue
            c = lookup.cursor
            run = next(r for r in range(min(c, 64) + 1) if r == min(c, 64) or history[c - 1 - r] != history[-1 - r])
            assert lookup.run == run >= n and c in ends  # one of the places of the longest match
            assert got == [history[c + i % (len(history) - c)] for i in range(3)]


def _copy(source: list[int], output: list[int]) -> PromptLookup:
    history = list(source)
    lookup = PromptLookup(history)
    for token in output:
        lookup.propose(1)
        history.append(token)
    lookup.propose(1)
    return lookup


# the passage: "... she learned that most clocks stopped ... she also learned that a few stopped ..."
SHE, LEARNED, THAT, MOST, CLOCKS, ALSO, A, FEW, HE, OVER, THE, DECADES, LEDGERS, END = range(10, 24)
PASSAGE = [OVER, THE, DECADES, THE, LEDGERS, 1, 2, 3, SHE, LEARNED, THAT, MOST, CLOCKS, 4, 5, SHE, ALSO, LEARNED,
           THAT, A, FEW, 6, 7, END]


def test_after_a_departure_the_copy_goes_on_down_the_passage_not_at_the_latest_match():
    # the output copies "over the decades", leaves the passage, and comes back with "learned that":
    # which of the two places comes next is where the copy was, not the later one
    lookup = _copy(PASSAGE, [OVER, THE, DECADES, HE, LEARNED, THAT])
    assert lookup.propose(2) == [MOST, CLOCKS]
    assert PASSAGE[lookup.cursor] == MOST and lookup.cursor < PASSAGE.index(A)


def test_with_where_the_copy_left_off_forgotten_the_latest_match_is_taken(monkeypatch):
    # negative control: the lookup's former rule (the latest place) drafts the later one
    monkeypatch.setattr(PromptLookup, "left_off", property(lambda self: 10**9, lambda self, value: None), raising=False)
    assert _copy(PASSAGE, [OVER, THE, DECADES, HE, LEARNED, THAT]).propose(2) == [A, FEW]


def test_the_cursor_follows_the_copy_and_its_run_grows():
    source = [40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51]
    history = source + [40, 41]
    lookup = PromptLookup(history)
    assert lookup.propose(3) == [42, 43, 44] and lookup.run == 2
    history += [42, 43, 44, 45]  # a step's accepted drafts and its own token
    assert lookup.propose(2) == [46, 47] and lookup.run == 6 and lookup.cursor == 6
    history += [99]  # the output leaves the passage
    assert lookup.propose(2) == [] and lookup.run == 0
    history += [47, 48]  # and comes back two words on: the copy resumes there
    assert lookup.propose(2) == [49, 50] and lookup.run == 2


def test_past_the_history_the_guess_goes_around_the_loop():
    assert PromptLookup([7, 1, 2, 3, 1, 2]).propose(5) == [3, 1, 2, 3, 1]


def test_a_long_run_drafts_long_and_a_short_one_not_at_all():
    """Guesses backed by two recurring tokens fail, those inside a long copy hold: the rates by run
    length draft long in the copy and nothing on a coincidence."""
    length = DraftLength(16, MEASURED)
    for _ in range(40):
        length.observe(0, 1, run=2)  # a 2-token match's guess: wrong
        length.observe(12, 12, run=20)  # a 20-token copy's drafts: all held
    assert length.choose(run=2) == 0
    assert length.choose(run=40) >= 8


def test_one_rate_for_every_run_cannot_do_both(monkeypatch):
    # negative control: with every run in one class, the same observations give one k for both
    monkeypatch.setattr(draft_length, "run_class", lambda run: 0)
    length = DraftLength(16, MEASURED)
    for _ in range(40):
        length.observe(0, 1, run=2)
        length.observe(12, 12, run=20)
    assert length.choose(run=2) == length.choose(run=40)


def test_a_longer_run_starts_from_what_the_shorter_ones_showed():
    length = DraftLength(16, MEASURED)
    for _ in range(30):
        length.observe(3, 3, run=4)  # runs of 4 to 6: every draft held
    rates = length.rates()
    assert rates[draft_length.run_class(4)] > 0.9
    assert rates[-1] == pytest.approx(rates[draft_length.run_class(4)])  # no counts of its own: the rate below
    assert length.choose(run=64) >= length.choose(run=4) > 0


def test_draft_length_drops_to_zero_when_drafts_fail_and_grows_when_they_hold():
    length = DraftLength(max_draft=16)
    for _ in range(30):
        length.observe(0, 4)
    assert length.choose() == 0
    for _ in range(30):
        length.observe(8, 8)
    assert length.choose() >= 8
    middling = DraftLength(max_draft=16, counts=[[8.0, 2.0]] + [[0.0, 0.0]] * (draft_length.RUN_CLASSES - 1))
    assert 0 < middling.choose(decodes=8) < middling.choose()  # beside other sequences' rows, fewer pay


def test_step_cost_is_its_timings_joined_by_lines():
    cost = StepCost({1: 4.0, 2: 6.0, 3: 7.0, 8: 6.5, 9: 12.0})  # a full tile of 8 rows costs less than 3
    assert [cost.time(r) for r in (1, 2, 3, 8)] == [4.0, 6.0, 7.0, 6.5]
    assert cost.time(4) == pytest.approx(6.9) and cost.time(17) == pytest.approx(20.0)  # on past the last
    assert StepCost().time(1) == 5.0 and StepCost().time(9) == 13.0  # untimed: 4 + rows
    with pytest.raises(ValueError):
        StepCost({2: 1.0, 3: 2.0})


def test_a_row_count_that_fills_the_tiles_is_drafted_for():
    """Where 8 rows cost less than 5, a sequence whose drafts hold about nine times in ten drafts 7,
    not the 4 a line through the curve's ends would give."""
    tiles = StepCost({1: 4.0, 2: 6.0, 3: 7.5, 4: 9.0, 5: 10.0, 6: 11.0, 7: 12.0, 8: 9.5, 9: 13.0})
    counts = [[9.0, 1.0]] + [[0.0, 0.0]] * (draft_length.RUN_CLASSES - 1)
    assert DraftLength(8, tiles, counts=counts).choose() == 7
    assert DraftLength(8, StepCost({1: 4.0, 9: 13.0}), counts=counts).choose() != 7


def test_a_dear_second_row_is_paid_for_only_by_likely_drafts():
    """A one-row step runs matrix-vector kernels, so the second row costs more than those after
    it: at a rate where one draft would pay on a line through the same ends, it does not."""
    line = StepCost({1: 3.8, 17: 19.5})
    counts = [[3.0, 6.0]] + [[0.0, 0.0]] * (draft_length.RUN_CLASSES - 1)  # a guess holds about one time in three
    assert DraftLength(1, line, counts=counts).choose() == 1
    assert DraftLength(1, MEASURED, counts=counts).choose() == 0


def test_lookup_drafts_scores_the_guess_it_did_not_send():
    history = [5, 6, 7, 8, 9, 5, 6]
    drafts = LookupDrafts(history, 8, MEASURED)
    for _ in range(30):  # the copy has been failing: nothing is sent, but the guess is kept
        drafts.length.observe(0, 1, run=2)
    assert drafts.draft(room=8) == [] and drafts.guess == 7 and drafts.run == 2
    before = drafts.length.rate(2)
    drafts.observe(0, first=7)  # it would have held
    assert drafts.length.rate(2) > before
    assert drafts.draft(room=0) == []  # no room: nothing drafted whatever the rates


# -- the held-out texts -----------------------------------------------------------------------------
def _sentences(text: str) -> set[str]:
    return {s.strip() for s in re.split(r"(?<=[.!?])\s+", " ".join(text.split())) if len(s.split()) >= 5}


def test_the_held_out_texts_exist_and_are_not_in_the_tuning_set():
    held = bench_spec.workloads("held-out")
    assert len(held) >= 2 and set(held) == set(bench_spec.HELD_OUT)
    seen = " ".join(" ".join(m.split()) for w in ("tuning", "default") for m, _ in bench_spec.workloads(w).values())
    seen += " " + " ".join(" ".join((bench_spec.DATA / f).read_text(encoding="utf-8").split())
                           for f in ("long_text.txt", "scandal_in_bohemia.txt"))
    for name, (file, request) in bench_spec.HELD_OUT.items():
        text = (bench_spec.HELD_OUT_DIR / file).read_text(encoding="utf-8")
        assert len(text.split()) >= 100, name
        sentences = _sentences(text)
        assert sentences and not any(s in seen for s in sentences), f"{name}: a held-out sentence is in the tuning set"
        message, temperature = held[name]
        assert message.endswith(request) and temperature == 0.0
    assert len({file for file, _ in bench_spec.HELD_OUT.values()}) == len(bench_spec.HELD_OUT)


def test_a_model_is_timed_at_every_row_count_that_fits(tiny, monkeypatch):
    import compiler
    from compiler.runtime import spec_decode

    path = tiny("llama", n_layer=1, n_embd=64, n_head=2, n_head_kv=1, n_ff=128)
    small = compiler.load(path, ctx=64, batch_tokens=4, threads=1)
    kept = Path(small.compiled.module.__file__).with_name("step_cost.1threads.json")
    kept.unlink(missing_ok=True)
    with small.sequence() as seq:
        seq.prefill([1, 2, 3])
        cost = spec_decode.step_cost(small, seq, 1)
        assert seq.n_past == 3  # the timed rows are rolled back
        assert cost.rows == [1, 2, 3, 4] and not kept.exists()  # a partial curve is not written...
        monkeypatch.setattr(spec_decode, "_timed", lambda *a: pytest.fail("timed again"))
        assert spec_decode.step_cost(small, seq, 1) is cost  # ...but serves the process's next call
    monkeypatch.undo()
    full = compiler.load(path, ctx=64, batch_tokens=32, threads=1)
    assert spec_decode.calibrate(full).rows == list(spec_decode.TIMED_ROWS) and full in spec_decode._COSTS


def test_a_timed_curve_is_kept_for_the_next_process_while_a_one_row_step_agrees(tiny, monkeypatch):
    import compiler
    from compiler.runtime import spec_decode

    path = tiny("llama", n_layer=1, n_embd=64, n_head=2, n_head_kv=1, n_ff=128)
    timed, machine = [], {"speed": 1.0}

    def fake(model, seq, token, counts, runs):  # a step of r rows takes 1 + r/8, times the machine's speed
        timed.append(list(counts))
        return {r: (1 + r / 8) * machine["speed"] for r in counts}

    monkeypatch.setattr(spec_decode, "_timed", fake)
    every = list(spec_decode.TIMED_ROWS)
    m = compiler.load(path, ctx=64, batch_tokens=32, threads=1)  # a fresh model: as in a new process
    kept = Path(m.compiled.module.__file__).with_name("step_cost.1threads.json")
    kept.unlink(missing_ok=True)
    assert spec_decode.calibrate(m).time(9) == pytest.approx(1 + 9 / 8) and timed == [every] and kept.is_file()
    timed.clear()
    machine["speed"] = 1.1  # within a quarter: the kept curve, after one row count's timing
    m = compiler.load(path, ctx=64, batch_tokens=32, threads=1)
    assert spec_decode.calibrate(m).time(9) == pytest.approx(1 + 9 / 8) and timed == [[1]]
    timed.clear()
    machine["speed"] = 2.0  # the machine is not what it was: timed again, and kept so
    m = compiler.load(path, ctx=64, batch_tokens=32, threads=1)
    assert spec_decode.calibrate(m).time(9) == pytest.approx(2 * (1 + 9 / 8)) and timed == [[1], every]
    assert json.loads(kept.read_text())["9"] == pytest.approx(2 * (1 + 9 / 8))
