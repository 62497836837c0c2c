"""`bear`: one entry point, one module per subcommand (each adds its parser and handler)."""

from __future__ import annotations

import argparse
import errno
import importlib
import os
import sys
from collections.abc import Sequence
from typing import Any

# Imported by `build_parser`, under `main`'s KeyboardInterrupt handler (they import numpy and more: a Ctrl-C in the
# first second of any command printed a traceback).
SUBCOMMANDS = ("demo_command", "replay_command", "predictor_command", "snapshotter_command", "eval_command",
               "serve_command")


class _Parser(argparse.ArgumentParser):
    """Flags by their whole names only (argparse would take `--grpc` for `--grpc-port`): a flag's meaning does not
    change when another one is added, and the Helm chart can tell which flags its values already set. Every
    subcommand's parser is one (argparse gives sub-parsers their parent's class)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="bear", description="BEAR: latency-aware query routing over vLLM pools")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in SUBCOMMANDS:
        importlib.import_module(f"bear.cli.{name}").add_parser(commands)
    return parser


EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 128 + 2  # as a shell reports a process ended by SIGINT
EXIT_BROKEN_PIPE = 128 + 13  # as a shell reports a process ended by SIGPIPE


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except KeyboardInterrupt:  # Ctrl-C as the command starts (its modules are imported here)
        print("bear: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    from bear.common.otel_settings import drop_unusable

    for problem in drop_unusable():  # before any command imports the OpenTelemetry SDK, which would fail on them
        print(f"bear {args.command}: {problem}", file=sys.stderr)
    try:
        return int(args.handler(args) or 0)
    except KeyboardInterrupt:  # Ctrl-C in a one-shot command (training, a replay), or a service still starting
        print(f"bear {args.command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # the reader went away (`bear replay case.json | head`): stop quietly, as Unix tools do
        # Python would report the failed flush of stdout at exit: point stdout at /dev/null first.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except OSError as error:  # after BrokenPipeError, one of them
        if error.errno != errno.ENAMETOOLONG:
            raise
        # A path too long for the file system, given where no check of the command's catches it: said, not a
        # traceback (the input's fault, not the program's).
        print(f"bear {args.command}: {error.filename!r}: {error.strerror} (a path given is too long)", file=sys.stderr)
        return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
