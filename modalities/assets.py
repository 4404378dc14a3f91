"""Where the shipped checkpoints live: `SPECGEN_ASSETS` overrides; the default is the source checkout's assets/
(assets/code for text, assets/image, assets/speech). Shared by every modality, as is the user cache."""

from __future__ import annotations

from pathlib import Path

from specgen import settings


def assets_dir() -> Path:
    return settings.path("SPECGEN_ASSETS", Path(__file__).resolve().parents[1] / "assets")


def cache_dir() -> Path:
    """The user cache for things built from models at first use (e.g. token groups): `SPECGEN_HOME`, else
    ~/.cache/specgen."""
    return settings.path("SPECGEN_HOME", Path.home() / ".cache" / "specgen")
