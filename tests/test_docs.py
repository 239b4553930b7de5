"""The docs hold what they say: README.md and docs/*.md.

- Every speed figure comes from a run: each figures block is what compiler/tools/docs_figures.py
  renders from its JSON under docs/figures/, and no speed figure stands outside one.
- Every example runs. Sybil finds the blocks: a ```console block is an example (each `$ ` line a
  command, the lines under it its output), a ```python block that starts with `>>>` a doctest; any
  other block (```sh, ```python without >>>, ```yaml) is reference and is not run. A ```console slow
  block is a long one (bench, serve under load) and is marked slow. Commands run with bash in one
  working directory a page (so a block can use what an earlier one wrote), with the venv's `kiln`
  first on PATH; a command ending in `&` runs in the background until its block ends; port 8000 is
  swapped for a free one. Output is checked for its shape: numbers are wildcards on both sides (a
  page writes … for a measured value), `...` stands for any text (doctest's ELLIPSIS), and runs of
  whitespace are one. Only standard output is compared, unless the block shows kiln's own `kiln: `
  lines (its stages, on standard error).
- Links between pages resolve (files and #anchors), README links every page, no page is long, and
  every command's --help names its page.
"""
from __future__ import annotations

import doctest
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from markdown_it import MarkdownIt
from sybil import Document, Example
from sybil.evaluators.doctest import DocTestEvaluator
from sybil.parsers.markdown import CodeBlockParser, PythonCodeBlockParser

from compiler.cli.main import build_parser
from compiler.tools import docs_figures

ROOT = Path(__file__).resolve().parents[1]
PAGES = docs_figures.pages(ROOT)
DOCS = sorted((ROOT / "docs").glob("*.md"))
NUMBER = re.compile(r"\d+(?:[.,]\d+)*")
FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
VENV_BIN = str(Path(sys.executable).parent)


def _shape(text: str) -> str:
    return NUMBER.sub("…", text)


class ConsoleParser(CodeBlockParser):
    """```console and ```console slow blocks: Sybil lexes them, evaluate() runs them."""

    language = "console"

    def __call__(self, document: Document):
        for region in self.lexers(document):
            words = region.lexemes["arguments"].split()
            if words and words[0] == "console":
                region.parsed = (region.lexemes["source"], "slow" in words[1:])
                region.evaluator = self.evaluate
                yield region

    @staticmethod
    def commands(source: str) -> list[tuple[str, str]]:
        """(command, expected output) for each `$ ` line; a line ending in a backslash goes on."""
        out: list[tuple[str, list[str]]] = []
        lines = source.splitlines()
        i = 0
        while i < len(lines):
            if lines[i].startswith("$ "):
                cmd = lines[i][2:]
                while cmd.endswith("\\") and i + 1 < len(lines):
                    i += 1
                    cmd = cmd[:-1] + " " + lines[i].strip()
                out.append((cmd, []))
            elif out:
                out[-1][1].append(lines[i])
            i += 1
        return [(c, "\n".join(o).strip("\n")) for c, o in out]

    def evaluate(self, example: Example) -> str | None:
        source, _slow = example.parsed
        workdir = example.namespace.setdefault("_workdir", None)
        assert workdir, "the page's working directory is set by the test"
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = str(s.getsockname()[1])
        env = {**os.environ, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}", "COLUMNS": "200"}
        background: list[subprocess.Popen] = []
        try:
            for cmd, expected in self.commands(source):
                cmd = re.sub(r"\b8000\b", port, cmd)
                if cmd.rstrip().endswith("&"):
                    background.append(subprocess.Popen(["bash", "-c", cmd.rstrip()[:-1]], cwd=workdir, env=env,
                                                       start_new_session=True))
                    continue
                with_log = "kiln: " in expected
                done = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], cwd=workdir, env=env, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT if with_log else subprocess.PIPE,
                                      timeout=900)
                got = done.stdout.strip("\n")
                if done.returncode:
                    return f"`{cmd}` exited {done.returncode}:\n{got}\n{done.stderr or ''}"
                want = _shape(expected) + "\n"
                if not doctest.OutputChecker().check_output(want, _shape(got) + "\n", FLAGS):
                    return f"`{cmd}`: output not of the shape shown.\nshown:\n{expected}\ngot:\n{got}\n{done.stderr or ''}"
        finally:
            for p in background:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                    p.wait(timeout=30)
                except (ProcessLookupError, subprocess.TimeoutExpired):
                    os.killpg(p.pid, signal.SIGKILL)
        return None


def _doctests(document: Document):
    """The ```python blocks that are doctests (they start with >>>); the rest is reference."""
    for region in PythonCodeBlockParser(doctest_optionflags=FLAGS)(document):
        if isinstance(region.evaluator, DocTestEvaluator):
            yield region


def _examples():
    params = []
    for page in PAGES:
        document = Document.parse(str(page), ConsoleParser(), _doctests)
        for example in document.examples():
            slow = isinstance(example.parsed, tuple) and example.parsed[1]
            params.append(pytest.param(example, id=f"{page.relative_to(ROOT)}:{example.line}",
                                       marks=[pytest.mark.slow] if slow else []))
    return params


EXAMPLES = _examples()


@pytest.mark.parametrize("example", EXAMPLES)
def test_example_runs(example, tmp_path_factory, monkeypatch, smollm2):
    """Every example block of the page, in order; a page's blocks share a working directory."""
    monkeypatch.setenv("PATH", f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}")  # a doctest's kiln too
    ns = example.namespace
    if not ns.get("_workdir"):
        ns["_workdir"] = str(tmp_path_factory.mktemp("docs"))
        ns["__name__"] = "docs"
    cwd = os.getcwd()
    os.chdir(ns["_workdir"])  # the doctests' files land there too
    try:
        example.evaluate()
    finally:
        os.chdir(cwd)


def test_figures_are_their_runs():
    """Each figures block is what its JSON renders, and no speed figure stands outside one."""
    problems = docs_figures.process(ROOT)
    assert not problems, "\n".join(problems)


def test_every_run_says_where_it_came_from():
    runs = docs_figures.load_runs(ROOT)
    assert runs, "no JSON under docs/figures/"
    for run in (r for v in runs.values() for r in v):
        p = run.prov
        for key in ("command", "date", "commit", "cpu", "threads", "llama_cpp_python"):
            assert p.get(key), f"{run.path.name}: provenance lacks {key}"
        assert p["command"].startswith("kiln bench"), run.path.name
        assert p["cpu"].get("flags"), run.path.name
        docs_figures.kind(run.doc)  # one the renderer knows


@pytest.mark.parametrize("vendor,family,model,flags,generation", [
    ("AuthenticAMD", "25", "17", ["avx512_vnni"], "Zen 4"),
    ("GenuineIntel", "6", "85", ["avx512_vnni", "avx512_bf16"], "Cooper Lake"),
    ("GenuineIntel", "6", "85", ["avx512_vnni"], "Cascade Lake"),
    ("GenuineIntel", "6", "85", ["avx512f"], "Skylake-SP"),
    ("GenuineIntel", "6", "143", ["amx_tile"], "Sapphire Rapids")])
def test_a_run_names_its_machine_by_generation(vendor, family, model, flags, generation):
    """A VM's cpuinfo says 'Intel Xeon Processor': the caption names the generation from the family,
    the model and, for Intel's model 85, the instructions each of its generations added."""
    cpu = {"vendor": vendor, "family": family, "model_id": model, "model": "Xeon", "cpus": 2, "flags": flags}
    machine = docs_figures.Run(Path("x.json"), {"provenance": {"cpu": cpu}}).machine
    assert machine == f"2-vCPU Xeon ({generation})"


def test_every_figures_block_names_a_run():
    """A figures block, and the headline, each draw on runs that exist (a planted id fails)."""
    runs = docs_figures.load_runs(ROOT)
    for page in PAGES:
        for m in docs_figures.BLOCK.finditer(page.read_text()):
            assert m.group("id") == "headline" or m.group("id") in runs, f"{page.name}: figures:{m.group('id')}"
    assert all(fid in runs for fid in docs_figures.HEADLINE)


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but - and _ dropped, spaces to -."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _links_and_anchors(page: Path) -> tuple[list[str], set[str]]:
    tokens = MarkdownIt("commonmark", {"html": True}).enable("table").parse(page.read_text())
    links, anchors = [], set()
    for i, tok in enumerate(tokens):
        if tok.type == "heading_open":
            anchors.add(_slug(tokens[i + 1].content))
        for child in tok.children or []:
            if child.type == "link_open":
                links.append(child.attrs["href"])
            elif child.type == "image":
                links.append(child.attrs["src"])
    return links, anchors


def test_links_resolve():
    anchors = {page.resolve(): _links_and_anchors(page)[1] for page in PAGES}
    broken = []
    for page in PAGES:
        for href in _links_and_anchors(page)[0]:
            if re.match(r"[a-z]+:", href):
                continue  # an outside address: not checked here (no network in the tests)
            target, _, anchor = href.partition("#")
            path = (page.parent / target).resolve() if target else page.resolve()
            if not path.exists():
                broken.append(f"{page.relative_to(ROOT)}: {href} (no such file)")
            elif anchor and path.suffix == ".md" and anchor not in anchors.get(path, _links_and_anchors(path)[1]):
                broken.append(f"{page.relative_to(ROOT)}: {href} (no such heading)")
    assert not broken, "\n".join(broken)


def test_readme_is_a_front_door():
    """README under 250 lines, linking every page; no page over 300 lines."""
    readme = ROOT / "README.md"
    assert len(readme.read_text().splitlines()) < 250
    linked = {(ROOT / h.partition("#")[0]).resolve() for h in _links_and_anchors(readme)[0] if h.startswith("docs/")}
    assert [d.name for d in DOCS if d.resolve() not in linked] == []
    assert [(d.name, n) for d in DOCS if (n := len(d.read_text().splitlines())) > 300] == []


def _commands():
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    return sorted(sub.choices.items())


@pytest.mark.parametrize("name,parser", _commands(), ids=[n for n, _ in _commands()])
def test_help_names_its_page(name, parser):
    page = re.search(r"docs/[\w-]+\.md", parser.format_help())
    assert page, f"kiln {name} --help names no docs page"
    assert (ROOT / page.group(0)).exists(), f"kiln {name} --help names {page.group(0)}, which does not exist"


def test_kiln_help_names_the_docs():
    assert "docs/" in build_parser().format_help()
