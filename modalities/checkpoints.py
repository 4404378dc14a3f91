"""What every trainer does with its run folder: write files atomically, and resume from a checkpoint.

A trainer's checkpoint holds at least `model`, `optimizer` and `state` (with `step` and `resumed_from`); its
`metrics.jsonl` has one JSON object per line with a `step`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path


def atomic_write(path: Path, write) -> None:
    """`write(tmp)` then rename over `path`: a kill mid-write leaves the previous file intact."""
    tmp = path.with_name(path.name + ".tmp")
    write(tmp)
    os.replace(tmp, path)


def restore(checkpoint: dict, model, optimizer, metrics_path: Path) -> dict:
    """Load a checkpoint's weights and optimizer state, note the resume in its training state and drop the
    metrics logged after it (those steps are redone). Returns the training state."""
    model.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    state = checkpoint["state"]
    state["resumed_from"].append(state["step"])
    if metrics_path.exists():
        kept = [line for line in metrics_path.read_text().splitlines() if json.loads(line)["step"] <= state["step"]]
        atomic_write(metrics_path, lambda tmp: tmp.write_text("".join(f"{line}\n" for line in kept)))
    return state
