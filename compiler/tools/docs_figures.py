"""The figures of the docs, rendered from the runs that produced them.

Every speed figure in README.md and docs/*.md sits between marker comments,

    <!-- figures:ID -->
    ...the table, as this module renders it...
    <!-- /figures -->

and comes from the JSON files `kiln bench --json` and `kiln bench-serve --json` wrote, committed as
docs/figures/ID.DATE.MACHINE.json. A file keeps its run's provenance (the command line, kiln's
commit, the CPU, the threads, llama.cpp's version: compiler/tools/bench.py, write_json), so old
rounds stay in their files; a page shows the latest run of each machine kind and names it.

    python -m compiler.tools.docs_figures           # rewrite every block from its JSON
    python -m compiler.tools.docs_figures --check   # exit 1 naming each block that differs (tests/test_docs.py)

--check also fails on a speed figure outside the blocks (a number with x, tok/s, ms, GB/s, ...), so
no figure reaches a page without a run behind it; where a page must name a measured value in an
example's output, it writes ... in its place.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BLOCK = re.compile(r"(<!-- figures:(?P<id>[\w.-]+) -->\n)(?P<body>.*?)(<!-- /figures -->)", re.S)
# A measured speed: a ratio (4.29x), a rate or a latency. Sizes, counts, KL and percentages are not.
SPEED = re.compile(r"(?<![\w.^])\d[\d,]*(?:\.\d+)?(?:x\b|\s?(?:tok/s|tokens/s|inputs/s|req/s|ms\b|us\b|GB/s|MB/s|"
                   r"G?MAC/s))")
SPEED_HEADER = re.compile(r"tok/s|inputs/s|req/s|TTFT|ITL|speedup|ratio|GB/s|ms/token|latency|kiln / ", re.I)
# The generations the machines kiln has been measured on, by (vendor, family, models): a VM's CPU
# model string often omits the part number ("AMD EPYC"), and family and model then say which it is.
# (vendor, family, models, generation, a flag it has): Intel's model 85 is three generations, told
# apart by the instructions they added (a VM's cpuinfo often names no model, and never a stepping)
GENERATIONS = [("AuthenticAMD", 25, range(0x00, 0x10), "Zen 3", None),
               ("AuthenticAMD", 25, range(0x10, 0x20), "Zen 4", None),
               ("AuthenticAMD", 25, range(0x60, 0x80), "Zen 4", None),
               ("AuthenticAMD", 25, range(0xA0, 0xB0), "Zen 4c", None),
               ("AuthenticAMD", 26, range(0x00, 0x100), "Zen 5", None),
               ("GenuineIntel", 6, range(85, 86), "Cooper Lake", "avx512_bf16"),
               ("GenuineIntel", 6, range(85, 86), "Cascade Lake", "avx512_vnni"),
               ("GenuineIntel", 6, range(85, 86), "Skylake-SP", None),
               ("GenuineIntel", 6, range(143, 144), "Sapphire Rapids", None),
               ("GenuineIntel", 6, range(207, 208), "Emerald Rapids", None)]
# The headline table: each model against llama.cpp, from these runs.
HEADLINE = ["bench-smollm2-135m", "bench-gemma3-270m", "bench-llama-1b", "bench-minilm", "serve-smollm2-135m"]


@dataclass(frozen=True)
class Run:
    path: Path
    doc: dict

    @property
    def id(self) -> str:
        return self.path.name.split(".")[0]

    @property
    def prov(self) -> dict:
        return self.doc.get("provenance") or {}

    @property
    def machine(self) -> str:
        """The machine kind: the CPU as /proc/cpuinfo names it, its generation, the CPUs there were."""
        cpu = self.prov.get("cpu") or {}
        gen = next((name for vendor, fam, models, name, flag in GENERATIONS if cpu.get("vendor") == vendor
                    and str(cpu.get("family")) == str(fam) and int(cpu.get("model_id") or -1) in models
                    and (flag is None or flag in (cpu.get("flags") or []))), None)
        model = cpu.get("model", "unknown CPU")
        return f"{cpu.get('cpus', '?')}-vCPU {model}" + (f" ({gen})" if gen and gen not in model else "")


def load_runs(root: Path = ROOT) -> dict[str, list[Run]]:
    """Every run under docs/figures/, by figure id, oldest first."""
    runs: dict[str, list[Run]] = {}
    for path in sorted((root / "docs" / "figures").glob("*.json")):
        run = Run(path, json.loads(path.read_text()))
        runs.setdefault(run.id, []).append(run)
    for v in runs.values():
        v.sort(key=lambda r: r.prov.get("date", ""))
    return runs


def latest_by_machine(runs: list[Run]) -> list[Run]:
    """The latest run of each machine kind, in the order the kinds were first measured."""
    latest: dict[str, Run] = {}
    for r in runs:
        latest[r.machine] = r
    return list(latest.values())


def _link(run: Run, page: Path) -> str:
    return os.path.relpath(run.path, page.parent).replace(os.sep, "/")


def caption(run: Run, page: Path) -> str:
    p = run.prov
    llama = f", llama-server {p['llama_server']}" if p.get("llama_server") else ""
    ik = next((e for n, e in (p.get("engines") or {}).items() if n.startswith("ik_llama.cpp")), None)
    llama += f", ik_llama.cpp from {ik['sdist']}" if ik else ""
    commit = (p.get("commit") or "?")[:7] + (" with uncommitted changes" if p.get("dirty") else "")
    load = f", load {p['loadavg'][0]:.1f} at the end" if p.get("loadavg") else ""
    return (f"*{run.machine}, {p.get('threads')} threads, kiln {commit}, llama-cpp-python "
            f"{p.get('llama_cpp_python')}{llama}, {p.get('date', '?')[:10]}{load}:* `{p.get('command')}` "
            f"([JSON]({_link(run, page)}))")


def _ik_cells(ik: dict, settings: list[str], ratio) -> str:
    """ik_llama.cpp's columns of a row, where the run had it: its tok/s by setting, and kiln over the faster."""
    if not settings:
        return ""
    cells = "".join(f" {ik[s]:.1f} |" if s in ik else " - |" for s in settings)
    return cells + (f" {ratio:.2f}x |" if ratio else " - |")


def _bench(doc: dict) -> list[str]:
    settings = list(doc["results"][0]["llamacpp_runs"])
    iks = list(dict.fromkeys(s for r in doc["results"] for s in r.get("ik_runs") or {}))
    rows = ["| test | kiln tok/s | " + " | ".join(f"llama.cpp {s}" for s in settings) + " | kiln / the faster |"
            + "".join(f" ik {s} |" for s in iks) + (" kiln / the faster ik |" if iks else ""),
            "|---|---|" + "---|" * len(settings) + "---|" + "---|" * (len(iks) + bool(iks))]
    for r in doc["results"]:
        by = {s: statistics.median(v) for s, v in r["llamacpp_runs"].items()}
        ik = {s: statistics.median(v) for s, v in (r.get("ik_runs") or {}).items()}
        rows.append(f"| {r['test']} | {r['kiln_tok_s']:.1f} | " + " | ".join(f"{by[s]:.1f}" for s in settings)
                    + f" | {r['ratio']:.2f}x |" + _ik_cells(ik, iks, r.get("ik_ratio")))
    return rows


def _batch(doc: dict) -> list[str]:
    one = next((r["kiln_tok_s"] for r in doc["batched"] if r["batch"] == 1), None)
    settings = list(doc["batched"][0]["llamacpp_tok_s"])  # llama.cpp's tok/s by flash-attention setting
    iks = list(dict.fromkeys(s for r in doc["batched"] for s in r.get("ik_tok_s") or {}))
    rows = ["| sequences | kiln tok/s | x one sequence | " + " | ".join(f"llama.cpp {s}" for s in settings)
            + " | kiln / the faster |" + "".join(f" ik {s} |" for s in iks)
            + (" kiln / the faster ik |" if iks else ""),
            "|---|---|---|" + "---|" * len(settings) + "---|" + "---|" * (len(iks) + bool(iks))]
    for r in doc["batched"]:
        rel = f"{r['kiln_tok_s'] / one:.2f}x" if one else "-"
        rows.append(f"| {r['batch']} | {r['kiln_tok_s']:.1f} | {rel} | "
                    + " | ".join(f"{r['llamacpp_tok_s'][s]:.1f}" for s in settings) + f" | {r['ratio']:.2f}x |"
                    + _ik_cells(r.get("ik_tok_s") or {}, iks, r.get("ik_ratio")))
    return rows


def _serve(doc: dict) -> list[str]:
    rows = ["| server | req/s | output tok/s | TTFT p50 | TTFT p99 | ITL p50 | ITL p99 | prefix hit rate |",
            "|---|---|---|---|---|---|---|---|"]
    for r in doc["results"]:
        rows.append(f"| {r['server']} | {r['requests_per_s']:.2f} | {r['output_tok_per_s']:.1f} | {r['ttft_p50']:.3f} s | "
                    f"{r['ttft_p99']:.3f} s | {r['itl_p50'] * 1e3:.1f} ms | {r['itl_p99'] * 1e3:.1f} ms | "
                    f"{r['prefix_hit_rate']:.1%} |")
    return rows


def _spec(doc: dict) -> list[str]:
    rows = ["| workload | tokens | kiln tok/s | kiln spec | speedup | accepted | tokens/step | llama.cpp | "
            "llama.cpp lookup | speedup |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in doc["results"]:
        lc = "| - | - | - |"
        if r.get("llamacpp_tok_s"):
            lc = (f"| {r['llamacpp_tok_s']:.1f} | {r['llamacpp_spec_tok_s']:.1f} | "
                  f"{r['llamacpp_spec_tok_s'] / r['llamacpp_tok_s']:.2f}x |")
        rows.append(f"| {r['workload']} | {r['kiln_tokens']} | {r['kiln_tok_s']:.1f} | {r['kiln_spec_tok_s']:.1f} | "
                    f"{r['speedup']:.2f}x | {r['acceptance']:.0%} | {r['tokens_per_step']:.2f} {lc}")
    return rows


def _embed(doc: dict) -> list[str]:
    rows = ["| test | inputs | tokens | kiln inputs/s | llama.cpp inputs/s | kiln / llama.cpp |", "|---|---|---|---|---|---|"]
    for r in doc["results"]:
        rows.append(f"| {r['test']} | {r['inputs']} | {r['tokens']} | {r['kiln_inputs_s']:.1f} | "
                    f"{r['llamacpp_inputs_s']:.1f} | {r['ratio']:.2f}x |")
    return rows


def _constrained(doc: dict) -> list[str]:
    rows = ["| server | B | constrained / requests | ms/token free | ms/token constrained | overhead | "
            "free rows beside them |", "|---|---|---|---|---|---|---|"]
    for r in doc["results"]:
        beside = "-" if r["neighbours_overhead"] is None else f"{r['neighbours_overhead']:+.1%}"
        rows.append(f"| {r['server']} | {r['B']} | {r['constrained']} / {r['requests']} | {r['free_ms']:.2f} | "
                    f"{r['constrained_ms']:.2f} | {r['overhead']:+.1%} | {beside} |")
    return rows


def _serve_embed(doc: dict) -> list[str]:
    rows = ["| server | inputs/s | a query's latency |", "|---|---|---|"]
    for r in doc["results"]:
        rows.append(f"| {r['server']} | {r['inputs_per_s']:.1f} | {r['query_latency_s'] * 1e3:.1f} ms |")
    return rows


def kind(doc: dict) -> str:
    if "batched" in doc:
        return "batch"
    if "workload" in doc:
        return "serve"
    if "schema" in doc:
        return "constrained"
    if doc.get("embed"):
        return "serve_embed"
    if "n_gen" in doc:
        return "spec"
    first = (doc.get("results") or [{}])[0]
    if "kiln_inputs_s" in first:
        return "embed"
    if "kiln_tok_s" in first:
        return "bench"
    raise ValueError("a JSON of a kind docs_figures does not render")


TABLES = {"bench": _bench, "batch": _batch, "serve": _serve, "spec": _spec, "embed": _embed,
          "constrained": _constrained, "serve_embed": _serve_embed}


def _model_name(doc: dict, fid: str) -> str:
    """A bundled model by its name, a synthetic one by its shape and type, anything else by its file."""
    from ..frontend.registry import BUNDLED

    name = Path(doc.get("model", fid)).name
    bundled = {m.filename: n for n, m in BUNDLED.items()}
    return bundled.get(name) or re.sub(r"-[0-9a-f]{12}\.gguf$", " (synthetic, random weights)", name)


def _headline_rows(run: Run, page: Path) -> list[str]:
    doc, name, src = run.doc, _model_name(run.doc, run.id), f"[{run.id}]({_link(run, page)})"
    if kind(doc) == "bench":
        return [f"| {name} | {r['test']} | {r['kiln_tok_s']:.1f} tok/s | {r['llamacpp_tok_s']:.1f} tok/s | "
                f"{r['ratio']:.2f}x | {src} |" for r in doc["results"]]
    if kind(doc) == "embed":
        return [f"| {name} | {r['test']} | {r['kiln_inputs_s']:.1f} inputs/s | {r['llamacpp_inputs_s']:.1f} inputs/s | "
                f"{r['ratio']:.2f}x | {src} |" for r in doc["results"]]
    if kind(doc) == "serve":
        by = {r["server"]: r for r in doc["results"]}
        k, lc = by.get("kiln serve"), by.get("llama-server")
        if k and lc:
            w = doc["workload"]
            test = f"served: {w['n_requests']} chat requests, {w['concurrency']} at once"
            return [f"| {name} | {test}, output | {k['output_tok_per_s']:.1f} tok/s | {lc['output_tok_per_s']:.1f} tok/s | "
                    f"{k['output_tok_per_s'] / lc['output_tok_per_s']:.2f}x | {src} |"]
    return []


def headline(runs: dict[str, list[Run]], page: Path) -> list[str]:
    chosen = {fid: latest_by_machine(runs[fid]) for fid in HEADLINE if fid in runs}
    machines = list(dict.fromkeys(r.machine for v in chosen.values() for r in v))
    out: list[str] = []
    for machine in machines:
        these = [r for v in chosen.values() for r in v if r.machine == machine]
        threads = sorted({str(r.prov.get("threads")) for r in these})
        dates = sorted({r.prov.get("date", "?")[:10] for r in these})
        when = dates[0] if len(dates) == 1 else f"{dates[0]} to {dates[-1]}"
        out += [f"*{machine}, {' or '.join(threads)} threads, {when}; each row's JSON names its command, kiln's "
                "commit, llama.cpp's version and the machine's load.*", "",
                "| model | test | kiln | llama.cpp | kiln / llama.cpp | run |", "|---|---|---|---|---|---|"]
        for r in these:
            out += _headline_rows(r, page)
        out.append("")
    return out[:-1]


def render_block(fid: str, runs: dict[str, list[Run]], page: Path) -> str:
    if fid == "headline":
        lines = headline(runs, page)
        if not lines:
            raise KeyError(fid)
        return "\n".join(lines) + "\n"
    if fid not in runs:
        raise KeyError(fid)
    out: list[str] = []
    for run in latest_by_machine(runs[fid]):
        out += [caption(run, page), "", *TABLES[kind(run.doc)](run.doc), ""]
    return "\n".join(out[:-1]) + "\n"


def pages(root: Path = ROOT) -> list[Path]:
    """README.md and docs/*.md of a checkout (a wheel carries neither: --root names a checkout)."""
    return [p for p in (root / "README.md", *sorted((root / "docs").glob("*.md"))) if p.exists()]


def untraced(text: str) -> list[tuple[int, str]]:
    """(line, figure) for each speed figure outside the figures blocks, and each table whose header
    names a speed (its cells are figures even where they carry no unit)."""
    bare = BLOCK.sub(lambda m: m.group(1) + "\n" * m.group("body").count("\n") + m.group(4), text)
    found = [(bare.count("\n", 0, m.start()) + 1, m.group(0)) for m in SPEED.finditer(bare)]
    lines = bare.splitlines()
    found += [(i + 1, line) for i, line in enumerate(lines[:-1]) if line.startswith("|") and
              lines[i + 1].startswith("|---") and SPEED_HEADER.search(line)]
    return sorted(found)


def process(root: Path = ROOT, write: bool = False) -> list[str]:
    """Render every block; return the problems (with write, the differing blocks are rewritten instead)."""
    runs, problems = load_runs(root), []
    for page in pages(root):
        text, rel = page.read_text(), page.relative_to(root)

        def one(m: re.Match) -> str:
            try:
                body = render_block(m.group("id"), runs, page)
            except KeyError:
                problems.append(f"{rel}: figures:{m.group('id')} has no JSON under docs/figures/")
                return m.group(0)
            if body != m.group("body"):
                line = text.count("\n", 0, m.start()) + 1
                if not write:
                    problems.append(f"{rel}:{line}: figures:{m.group('id')} differs from what its JSON renders "
                                    "(python -m compiler.tools.docs_figures rewrites it)")
            return m.group(1) + body + m.group(4)

        new = BLOCK.sub(one, text)
        if write and new != text:
            page.write_text(new)
        problems += [f"{rel}:{line}: {fig!r} is a speed figure with no JSON behind it (put it in a figures block)"
                     for line, fig in untraced(new)]
    return problems


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m compiler.tools.docs_figures", description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 naming each block that differs")
    ap.add_argument("--root", type=Path, default=ROOT, help="the checkout (default: this one)")
    a = ap.parse_args(argv)
    problems = process(a.root, write=not a.check)
    for p in problems:
        print(p, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
