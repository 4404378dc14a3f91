"""Video output: frames to an animated GIF (Pillow), or to MP4 when an `ffmpeg` binary is installed, and a
filmstrip (frames side by side) for showing a video as one picture."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

from specgen.errors import InvalidRequest

FPS = 4  # 8 frames play in two seconds
FORMATS = (".gif", ".mp4")


def save_video(frames: list, path: str | Path, *, fps: int = FPS, scale: int = 4) -> Path:
    """Write PIL frames to `path` (.gif, or .mp4 through ffmpeg), each enlarged `scale` times (nearest neighbour:
    64-pixel frames stay crisp). The GIF loops forever."""
    from PIL import Image

    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in FORMATS:
        raise InvalidRequest(f"a video is written as {' or '.join(FORMATS)}, not {path.name!r}")
    if not frames:
        raise InvalidRequest("a video needs at least one frame")
    big = [f.convert("RGB").resize((f.width * scale, f.height * scale), Image.NEAREST) for f in frames]
    if suffix == ".gif":
        big[0].save(path, save_all=True, append_images=big[1:], duration=round(1000 / fps), loop=0, optimize=False)
        return path
    ffmpeg = shutil.which("ffmpeg")
    if ffmpeg is None:
        raise InvalidRequest(f"writing {path.name!r} needs ffmpeg, which is not installed; write a .gif instead")
    with tempfile.TemporaryDirectory() as tmp:
        for k, frame in enumerate(big):
            frame.save(Path(tmp) / f"{k:05d}.png")
        done = subprocess.run([ffmpeg, "-y", "-loglevel", "error", "-framerate", str(fps), "-i",
                               str(Path(tmp) / "%05d.png"), "-pix_fmt", "yuv420p", "-vcodec", "libx264", str(path)],
                              capture_output=True, text=True)
    if done.returncode != 0:
        raise InvalidRequest(f"ffmpeg could not write {path.name!r}: {done.stderr.strip().splitlines()[-1:]}")
    return path


def filmstrip(frames: list, *, gap: int = 2, columns: int | None = None):
    """PIL frames of one size side by side (in `columns` per row, default all in one row), white gutters."""
    from PIL import Image

    columns = min(columns or len(frames), len(frames))
    rows = -(-len(frames) // columns)
    width, height = frames[0].size
    sheet = Image.new("RGB", (columns * (width + gap) - gap, rows * (height + gap) - gap), "white")
    for k, frame in enumerate(frames):
        sheet.paste(frame, ((k % columns) * (width + gap), (k // columns) * (height + gap)))
    return sheet
