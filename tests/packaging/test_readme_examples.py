"""The README's Python examples run as written, and write the files they say they write.

Each section between a pair of `<!-- NAME -->` markers runs as one script (its Python blocks in order, as a reader
would paste them into one session) in a fresh interpreter, in an empty folder, offline, with a fresh SPECGEN_HOME.
`TextGenerator()` serves Gemma 3 270M when the gemma extra is installed, and the first use converts it into
SPECGEN_HOME (about a minute). As the other real-Gemma tests do, the examples then run on Gemma only with
SPECGEN_GEMMA_TESTS=1; otherwise the script starts by hiding the extra, so `TextGenerator()` takes the shipped code
pair, as on an install without the extra. The example code itself is never changed.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"
# the files the media examples say they write
PNG, GIF, WAV = "result.png", "clip.gif", "speech.wav"
HIDE_GEMMA = "import specgen.modalities.text.gemma as _gemma; _gemma.extra_installed = lambda: False\n"


def python_blocks(marker: str) -> list[str]:
    """The ```python blocks between the two `<!-- marker -->` lines of the README."""
    parts = README.read_text(encoding="utf-8").split(f"<!-- {marker} -->")
    assert len(parts) == 3, f"README.md needs exactly two <!-- {marker} --> markers"
    return re.findall(r"^```python\n(.*?)^```", parts[1], flags=re.S | re.M)


def run_section(marker: str, tmp_path: Path) -> subprocess.CompletedProcess:
    blocks = python_blocks(marker)
    assert blocks, f"no python blocks between the {marker} markers"
    prelude = "" if os.environ.get("SPECGEN_GEMMA_TESTS") == "1" else HIDE_GEMMA
    workdir, home = tmp_path / "run", tmp_path / "specgen-home"
    workdir.mkdir()
    home.mkdir()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "GRADIO_ANALYTICS_ENABLED": "False", "SPECGEN_HOME": str(home)}
    done = subprocess.run([sys.executable, "-c", prelude + "\n".join(blocks)], cwd=workdir, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"the {marker} examples failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    return done


def test_core_api_examples_run(tmp_path):
    done = run_section("core-api", tmp_path)
    assert '"sources": ["' in done.stdout.replace("'", '"')  # the streamed StepEvents were printed


def test_media_api_examples_run_and_write_their_files(tmp_path):
    import numpy as np
    import soundfile as sf
    from PIL import Image

    section = "\n".join(python_blocks("media-api"))
    for name in (PNG, GIF, WAV):
        assert name in section, f"the README examples no longer write {name}"
    done = run_section("media-api", tmp_path)
    out = tmp_path / "run"
    assert "accepted" in done.stdout  # the streaming example printed each token's source

    with Image.open(out / PNG) as image:
        assert image.format == "PNG" and image.size == (64, 64) and image.mode == "RGB"
        assert len(image.getcolors(64 * 64)) > 1  # not a blank square

    with Image.open(out / GIF) as clip:
        assert clip.format == "GIF" and clip.size == (256, 256)
        assert clip.n_frames >= 2  # Pillow merges identical neighbouring frames, so up to 8

    audio, sample_rate = sf.read(out / WAV, dtype="float32")
    assert sample_rate == 16_000 and audio.ndim == 1
    assert 0.2 < len(audio) / sample_rate < 10.0
    assert np.isfinite(audio).all() and float(np.sqrt(np.mean(audio ** 2))) > 1e-3  # not silent
