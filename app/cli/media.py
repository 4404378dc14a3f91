"""What `generate image`, `generate video` and `generate speech` share: the progress bar over a stream of step
events and the printout of a saved result."""

from __future__ import annotations

import itertools
import json
import sys
from typing import Iterable, Iterator


def with_progress(events: Iterable, *, total: int, method: str, quiet: bool) -> Iterator:
    """The events, counting their tokens on a progress bar (stderr). The first event is drawn before the bar
    starts, so a request the method rejects (a bad knob value, a missing draft head) stays one error line."""
    from tqdm import tqdm

    events = iter(events)
    first = next(events, None)
    if first is None:
        return
    with tqdm(total=total, desc=method, unit="tok", file=sys.stderr, disable=quiet) as progress:
        for event in itertools.chain([first], events):
            progress.update(len(event.tokens))
            yield event


def print_saved(args, record: dict, line: str) -> None:
    """`--json`: the record, after the output path, on stdout; else the path on stdout and `line` on stderr."""
    if args.json:
        print(json.dumps({"out": str(args.out), **record}))
    else:
        print(str(args.out))
        print(line, file=sys.stderr)
