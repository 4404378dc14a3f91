"""The `specgen` command line.

`--help` and argument errors must answer fast and load no torch, so the parser modules import only the standard
library, `specgen.errors`, the request options and the torch-free method registry; each command imports what it
needs when it runs. Every error, from argparse or from a command, is exit code 2 and one line `error: ...` on stderr.
One module per command adds its subparser (generate.py, bench.py, serve.py, ...).
"""

from __future__ import annotations

import argparse
import sys

from specgen import __version__, settings
from specgen.app.cli.batch import add_batch_parser
from specgen.app.cli.bench import add_bench_parser
from specgen.app.cli.calibrate import add_calibrate_parser
from specgen.app.cli.datastore import add_datastore_parser
from specgen.app.cli.demo import add_demo_parser
from specgen.app.cli.generate import add_generate_parser
from specgen.app.cli.info import add_info_parser
from specgen.app.cli.options import EXIT_USAGE, TEXT_REQUEST_OPTIONS, Parser, int_at_least, one_line, threads_option
from specgen.app.cli.selfcheck import add_selfcheck_parser
from specgen.app.cli.serve import add_serve_parser
from specgen.app.cli.train import add_train_parser
from specgen.errors import InvalidRequest, SpecgenError

__all__ = ["main", "build_parser", "TEXT_REQUEST_OPTIONS"]


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="specgen", allow_abbrev=False,
                    description="One draft-verify engine for faster generation of text, image/video and speech tokens.")
    parser.add_argument("--version", action="version", version=f"specgen {__version__}")
    threads_option(parser, default=None)
    # `--threads` is also accepted after the command; SUPPRESS keeps the global value when it is not repeated there.
    common = Parser(add_help=False, allow_abbrev=False)
    threads_option(common, default=argparse.SUPPRESS)

    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)

    def command(sub, name: str, help_text: str, full_name: str, handler) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text, parents=[common], allow_abbrev=False)
        p.set_defaults(handler=handler, full_name=full_name)
        return p

    for add in (add_demo_parser, add_generate_parser, add_bench_parser, add_batch_parser, add_train_parser,
                add_selfcheck_parser, add_info_parser, add_datastore_parser, add_serve_parser,
                add_calibrate_parser):
        add(commands, command)
    parser.set_defaults(command_names=list(commands.choices))
    return parser


def _apply_thread_setting(args: argparse.Namespace) -> None:
    """`--threads`, else $SPECGEN_THREADS (checked like the flag), else the setting's default."""
    if args.threads is None:
        env = settings.get("SPECGEN_THREADS")
        try:
            args.threads = int_at_least(1)(env)
        except argparse.ArgumentTypeError as exc:
            raise InvalidRequest(f"SPECGEN_THREADS: {exc}") from None


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version and argument errors (already printed)
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    try:
        if args.command is None:
            raise InvalidRequest(f"choose a command: {', '.join(args.command_names)} (see specgen --help)")
        _apply_thread_setting(args)
        args.argv = list(sys.argv[1:] if argv is None else argv)  # bench records the exact command
        return args.handler(args)
    except SpecgenError as exc:
        print(f"error: {one_line(exc)}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
