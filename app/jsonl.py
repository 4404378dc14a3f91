"""Reading JSON Lines input (batch requests, benchmark prompts): one reader, one set of error messages, each
naming the file and line. Standard library only, so the CLI can check a file before importing torch."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

from specgen.errors import InvalidRequest


def read_objects(path: Path, what: str = "") -> Iterator[tuple[int, dict]]:
    """(line number, object) for every non-blank line; an unreadable file, a line that is not JSON or not a
    JSON object raises InvalidRequest. `what` names the file in messages ("prompts file")."""
    label = f"{what} {path}" if what else str(path)
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise InvalidRequest(f"{label} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidRequest(f"cannot read {label}: {exc}") from None
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InvalidRequest(f"{path} line {number}: not valid JSON ({exc.msg})") from None
        if not isinstance(item, dict):
            raise InvalidRequest(f"{path} line {number}: expected a JSON object")
        yield number, item
