"""`kiln chat` in a real pseudo-terminal (pexpect): turns, prefix reuse across them, the
commands, Ctrl-C during a reply, and a message the context cannot take."""
from __future__ import annotations

import re
import sys

import pytest

pexpect = pytest.importorskip("pexpect", reason="pexpect (a dev dependency) drives the pseudo-terminal")

PROMPT = "\r\n> "


def stats(child) -> dict[str, int | str]:
    child.sendline("/stats")
    child.expect(PROMPT)
    text = child.before
    held = re.search(r"KV cache: (\d+) of (\d+) positions held", text)
    turn = re.search(r"prompt (\d+) tokens, (\d+) reused from the cache, (\d+) prefilled .*; (\d+) generated .*, (\w+)",
                     text)
    out = {"held": int(held[1]), "ctx": int(held[2])}
    if turn:
        out.update(prompt=int(turn[1]), reused=int(turn[2]), prefilled=int(turn[3]), generated=int(turn[4]),
                   stopped=turn[5])
    return out


@pytest.fixture(scope="module")
def chat(smollm2):
    child = pexpect.spawn(sys.executable, ["-m", "compiler", "chat", str(smollm2), "--ctx", "256", "--temp", "0",
                                           "-n", "160"], encoding="utf-8", timeout=300, dimensions=(50, 200))
    child.expect("/help for commands")
    child.expect("> ")
    yield child
    child.close(force=True)


def test_turns_reuse_the_prefix(chat):
    chat.sendline("What is the capital of France? Answer in one word.")
    chat.expect(PROMPT)
    assert "Paris" in chat.before
    first = stats(chat)
    assert first["reused"] == 0 and first["prefilled"] == first["prompt"] and first["stopped"] == "stop"
    assert first["held"] == first["prompt"] + first["generated"]

    chat.sendline("And of Germany?")
    chat.expect(PROMPT)
    assert "Berlin" in chat.before
    second = stats(chat)
    # the whole first turn, the reply included, stays in the cache: only the new message is prefilled
    assert second["reused"] == first["held"]
    assert second["prefilled"] == second["prompt"] - first["held"] < 20


def test_ctrl_c_stops_the_reply_not_the_conversation(chat):
    chat.sendline("Write a long story about a dragon who learns to fly.")
    chat.expect(r"fly\.\r\n")  # the line's echo
    chat.expect(r"\w+ \w+ \w+ \w+ \w+")  # the reply is streaming
    chat.sendintr()
    chat.expect(r"\[stopped\]" + PROMPT)
    s = stats(chat)
    assert s["stopped"] == "interrupted" and 0 < s["generated"] < 160
    chat.sendline("What was the capital of France again?")  # the conversation goes on, history intact:
    chat.expect(PROMPT)
    assert chat.before.strip().count("\n") >= 1  # a reply below the echoed line
    after = stats(chat)
    assert after["reused"] == s["held"]  # the cache still holds every earlier turn, the cut reply too
    assert after["prefilled"] == after["prompt"] - s["held"]


def test_commands(chat):
    chat.sendline("/help")
    chat.expect(PROMPT)
    assert "/system TEXT" in chat.before and "/reset" in chat.before
    chat.sendline("/frobnicate")
    chat.expect(PROMPT)
    assert "unknown command /frobnicate" in chat.before

    chat.sendline("/reset")
    chat.expect(PROMPT)
    assert stats(chat)["held"] == 0
    chat.sendline("/system You are a pirate. Always answer like a pirate.")
    chat.expect(PROMPT)
    chat.sendline("Hello!")
    chat.expect(PROMPT)
    with_system = stats(chat)
    assert with_system["reused"] == 0 and with_system["prompt"] > 10

    chat.sendline("word " * 400)  # more than the 256-position context
    chat.expect(PROMPT)
    assert "n_ctx is 256" in chat.before and "/reset" in chat.before
    after = stats(chat)
    assert after["held"] == with_system["held"]  # the refused message changed nothing


def test_ctrl_d_leaves(chat):
    chat.sendeof()
    chat.expect(pexpect.EOF)
    chat.close()
    assert chat.exitstatus == 0
