"""Where the shipped checkpoints live: `SPECGEN_ASSETS` overrides; the default is the source checkout's assets/
(assets/code for text, assets/image, assets/speech). Shared by every modality, as is the user cache."""

from __future__ import annotations

import os
from pathlib import Path


def assets_dir() -> Path:
    return Path(os.environ.get("SPECGEN_ASSETS", Path(__file__).resolve().parents[1] / "assets"))


def cache_dir() -> Path:
    """The user cache for things built from models at first use (e.g. token groups): `SPECGEN_HOME`, else
    ~/.cache/specgen."""
    home = os.environ.get("SPECGEN_HOME", "").strip()
    return Path(home).expanduser() if home else Path.home() / ".cache" / "specgen"
