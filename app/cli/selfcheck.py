"""`specgen selfcheck`: the exact core against its enumerated distributions; exit 1 when a check fails."""

from __future__ import annotations

import argparse
import json

from specgen import __version__
from specgen.app.cli.options import MAX_SEED, int_at_least
from specgen.errors import NotAvailable
from specgen.settings import use_threads


def add_selfcheck_parser(commands, command) -> None:
    selfcheck = command(commands, "selfcheck", "check the exact core against its enumerated distributions",
                        "selfcheck", handler=_selfcheck)
    selfcheck.add_argument("--seed", type=int_at_least(0, MAX_SEED), default=0, help="default: 0")
    selfcheck.add_argument("--json", action="store_true", help="print one JSON object on stdout")


def _selfcheck(args: argparse.Namespace) -> int:
    try:
        from specgen.samplers.selfcheck import run_selfcheck
    except ModuleNotFoundError as exc:  # an installation without the check module
        if exc.name != "specgen.samplers.selfcheck":
            raise
        raise NotAvailable(f"'specgen selfcheck' is not available in specgen {__version__}") from None
    use_threads(args.threads)  # only commands that run torch work get here
    result = run_selfcheck(seed=args.seed)
    if args.json:
        print(json.dumps(result))
    else:
        print(selfcheck_table(result, args.seed))
    return 0 if result["ok"] else 1


def selfcheck_table(result: dict, seed: int) -> str:
    checks = result.get("checks", [])
    width = max((len(str(c["name"])) for c in checks), default=4)
    lines = [f"specgen {__version__} selfcheck (seed {seed})"]
    for check in checks:
        numbers = "  ".join(f"{key}={_fmt(value)}" for key, value in check.items() if key not in ("name", "ok"))
        lines.append(f"  {'ok  ' if check['ok'] else 'FAIL'}  {str(check['name']):<{width}}  {numbers}".rstrip())
    failed = sum(not c["ok"] for c in checks)
    lines.append(f"{len(checks) - failed} of {len(checks)} checks passed" + ("" if result["ok"] else " -- FAILED"))
    return "\n".join(lines)


def _fmt(value: object) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)
