"""Progress of making a model ready: fetch, plan, generate, cc, pack.

On a terminal each stage shows a spinner, or a bar where it is long (the fetch of a bundled
model, packing), drawn by rich, and leaves one line with its time. Elsewhere (a pipe, a log
file) each stage prints one plain line with its time when it ends.

`kiln compile` reports every stage. `kiln run` and `kiln serve` report them only when a stage
did real work (a download, a C compile, a packing): a cached start stays quiet.

The stages' code takes the usual `log` callable; `as_progress(log)` gives it this interface
whether it was handed a Progress or a plain function (which then only gets the messages).
"""
from __future__ import annotations

import sys
import time
from contextlib import contextmanager
from typing import Callable, Iterator


class Progress:
    """Silent stages; messages go to `log`. The base of TerminalProgress and LineProgress."""

    def __init__(self, log: Callable[[str], None] = lambda s: None):
        self._log = log

    def __call__(self, msg: str) -> None:
        self._log(msg)

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        yield

    def note(self, text: str) -> None:
        """What the running stage did, for its line ("cached", "92.9 MB")."""

    def also(self, text: str) -> None:
        """More for the running stage's line, after its note."""

    def work(self, text: str) -> None:
        """The running stage did real work (downloaded, compiled, wrote): its line must be shown.
        Without stages, that is a message."""
        self._log(text)

    def bar(self, total: int, what: str) -> Callable[[int], None]:
        """A bar of `total` units for the running stage; returns advance(n)."""
        return lambda n: None

    def close(self) -> None:
        pass


def as_progress(log) -> Progress:
    return log if isinstance(log, Progress) else Progress(log)


class _Reporting(Progress):
    """Keeps each stage's time and note, and the rule for when lines are shown."""

    def __init__(self, every_stage: bool):
        super().__init__()
        self.every_stage, self.showing = every_stage, every_stage
        self.held: list[str] = []  # finished stages' lines, until one stage does work
        self._note, self._worked = "", False

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        self._note, self._worked = "", False
        t0 = time.perf_counter()
        self._begin(name)
        try:
            yield
        finally:
            self._end()
        line = f"{name:<9}{time.perf_counter() - t0:7.2f}s  {self._note}".rstrip()
        if self._worked and not self.showing:
            self.showing = True
            for held in self.held:
                self._print(held)
        if self.showing:
            self._print(line)
        else:
            self.held.append(line)

    def note(self, text: str) -> None:
        self._note = text

    def also(self, text: str) -> None:
        self._note = f"{self._note}; {text}" if self._note else text

    def work(self, text: str) -> None:
        self._note, self._worked = text, True

    def _begin(self, name: str) -> None:
        pass

    def _end(self) -> None:
        pass

    def _print(self, line: str) -> None:
        raise NotImplementedError


class LineProgress(_Reporting):
    """One plain line a stage, with its time, on `stream` (standard error)."""

    def __init__(self, every_stage: bool, stream=None):
        super().__init__(every_stage)
        self.stream = stream or sys.stderr

    def __call__(self, msg: str) -> None:
        print(f"kiln: {msg}", file=self.stream)

    def _print(self, line: str) -> None:
        print(f"kiln: {line}", file=self.stream, flush=True)


class TerminalProgress(_Reporting):
    """rich's live display on a terminal: a spinner a stage, a bar where one is asked for."""

    def __init__(self, every_stage: bool, stream=None):
        from rich.console import Console
        from rich.progress import (BarColumn, DownloadColumn, Progress as RichProgress, SpinnerColumn, TextColumn,
                                   TimeElapsedColumn)

        super().__init__(every_stage)
        self.console = Console(file=stream or sys.stderr)
        self.live = RichProgress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                                 DownloadColumn(), TimeElapsedColumn(), console=self.console, transient=True)
        self.task = None
        self.live.start()

    def __call__(self, msg: str) -> None:
        if self.task is not None:
            self.live.update(self.task, description=msg[:80])
        else:
            self.console.print(f"kiln: {msg}", highlight=False)

    def _begin(self, name: str) -> None:
        self.task = self.live.add_task(name, total=None)

    def _end(self) -> None:
        self.live.remove_task(self.task)
        self.task = None

    def bar(self, total: int, what: str) -> Callable[[int], None]:
        task = self.task
        self.live.update(task, description=what, total=total, completed=0)
        return lambda n: self.live.advance(task, n)

    def _print(self, line: str) -> None:
        self.console.print(f"kiln: {line}", highlight=False)

    def close(self) -> None:
        self.live.stop()


def reporter(every_stage: bool, stream=None) -> Progress:
    """The progress display for a command: a terminal's, or plain lines."""
    stream = stream or sys.stderr
    isatty = getattr(stream, "isatty", lambda: False)()
    return TerminalProgress(every_stage, stream) if isatty else LineProgress(every_stage, stream)
