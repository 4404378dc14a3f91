"""Where the shipped checkpoints live: `SPECGEN_ASSETS` overrides; the default is the source checkout's assets/
(assets/code for text, assets/image, assets/speech). Shared by every modality."""

from __future__ import annotations

import os
from pathlib import Path


def assets_dir() -> Path:
    return Path(os.environ.get("SPECGEN_ASSETS", Path(__file__).resolve().parents[1] / "assets"))
