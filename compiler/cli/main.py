"""The `kiln` command: the parser, one module a command, and the handling of errors."""
from __future__ import annotations

import argparse
import sys

from ..core.errors import KilnError
from ..core.version import __version__
from . import bench, chat, compile, convert, embed, layout, models, quality, run, serve, text

COMMANDS = (models, convert, layout, compile, text, run, chat, embed, serve, bench, quality)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="kiln", description="Ahead-of-time compiler for CPU LLM inference.",
                                 epilog="docs: README.md, then docs/ (one page a topic); "
                                        "each command's --help names its page")
    ap.add_argument("--version", action="version", version=f"kiln {__version__}")
    sub = ap.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.register(sub)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        args.run(args)
    except KilnError as e:
        print(f"kiln: error: {e}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        return 0
    except KeyboardInterrupt:  # Ctrl-C outside a chat reply: leave quietly, as a shell command does
        print(file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
