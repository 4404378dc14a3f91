"""What every trainer does with its run folder: write files atomically, resume from a checkpoint, and export
fp16 weights.

A trainer's checkpoint holds at least `model`, `optimizer` and `state` (with `step` and `resumed_from`); its
`metrics.jsonl` has one JSON object per line with a `step`.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
from pathlib import Path


def atomic_write(path: Path, write) -> None:
    """`write(tmp)` then rename over `path`: a kill mid-write leaves the previous file intact."""
    tmp = path.with_name(path.name + ".tmp")
    write(tmp)
    os.replace(tmp, path)


def export_fp16(model, folder: Path, add_files=None, **save_options) -> Path:
    """`model.save_pretrained` in fp16 into `folder`, replaced as a whole: written beside it (`add_files(tmp)` may
    add files), made readable by every user (safetensors writes 0600), then renamed over it."""
    folder = Path(folder)
    tmp = folder.with_name(f".{folder.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    copy.deepcopy(model).half().save_pretrained(tmp, **save_options)
    if add_files is not None:
        add_files(tmp)
    for path in tmp.iterdir():
        path.chmod(0o644)
    shutil.rmtree(folder, ignore_errors=True)
    folder.parent.mkdir(parents=True, exist_ok=True)
    os.replace(tmp, folder)
    return folder


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
