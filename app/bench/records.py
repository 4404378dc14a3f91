"""What every benchmark record holds about the run, and where records go.

`start_run()` is taken before the first timed run and `run_env(start)` after the last: the timestamp that names the
files, the checkout's commit, the machine, the threads, the library versions, every SPECGEN_* setting and the
load average around the run. `record_dirs(out_dir)` says where the timestamped run and its `*-latest` copies go.
torch is imported only when a record is taken, so the CLI can import this module for `--help`.
"""

from __future__ import annotations

import hashlib
import os
import platform
import subprocess
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from specgen import settings
from specgen.errors import InvalidRequest

ROOT = Path(__file__).resolve().parents[2]  # the source checkout


def benchmarks_dir() -> Path:
    """Where prompts and results live: `SPECGEN_BENCHMARKS`, else the source checkout's `benchmarks/`."""
    return settings.path("SPECGEN_BENCHMARKS", ROOT / "benchmarks")


def record_dirs(out_dir: Path | str | None) -> tuple[Path, Path]:
    """(folder for the timestamped run, folder for the `*-latest` copies). With `--out-dir` both are that folder; by
    default a run goes to the user cache (SPECGEN_HOME/runs) and its latest copies to benchmarks/, where the docs
    cite them. Both are checked before any work."""
    if out_dir:
        folder = checked_out_dir(Path(out_dir))
        return folder, folder
    from specgen.modalities.assets import cache_dir

    return checked_out_dir(cache_dir() / "runs"), checked_out_dir(benchmarks_dir())


def checked_out_dir(path: Path) -> Path:
    """`--out-dir`, created if needed; a clear error before any work where it cannot be written."""
    if path.exists() and not path.is_dir():
        raise InvalidRequest(f"--out-dir {path} is not a folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InvalidRequest(f"cannot create --out-dir {path}: {exc.strerror}") from None
    if not os.access(path, os.W_OK):
        raise InvalidRequest(f"cannot write into --out-dir {path}")
    return path


# ---- the machine and the checkout --------------------------------------------------------------------------------

def timestamp() -> str:
    """UTC, to the second: names a run's files and sorts them."""
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")


def load_average() -> list[float] | None:
    """The 1, 5 and 15-minute load averages (None where the system has none): timings taken under load are
    contended, and the record says so."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def sha256(path: Path) -> str | None:
    if not path.is_file():
        return None
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def source_state() -> dict:
    """The checkout's commit and whether tracked files differ from it; taken when the run starts, since the
    tree may be committed or edited while a long run goes on."""
    status = _git("status", "--porcelain", "--untracked-files=no")
    return {"git_commit": _git("rev-parse", "HEAD"), "git_dirty": None if status is None else bool(status)}


# ---- one run's record --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class RunStart:
    """Taken before the first timed run."""

    timestamp: str
    source: dict
    load_before: list[float] | None
    clock: float  # perf_counter at the start


def start_run() -> RunStart:
    return RunStart(timestamp(), source_state(), load_average(), time.perf_counter())


def run_env(start: RunStart, **fields) -> dict:
    """The environment every benchmark records, then the bench's own `fields` (which may override: the text
    bench's command, say)."""
    import torch

    return {"timestamp_utc": start.timestamp, **start.source, "cpu_model": settings.cpu_model(),
            "cpu_count": os.cpu_count(),
            "threads": torch.get_num_threads(), "torch": torch.__version__, "python": platform.python_version(),
            "settings": settings.snapshot(), "load_before": start.load_before, "load_after": load_average(),
            "wall_s": time.perf_counter() - start.clock, "calibrations": _calibrations(), **fields}


def _calibrations() -> list[dict]:
    """The step-cost calibrations `auto` decided with (every one cached for this machine's user cache)."""
    from specgen.modalities.calibration import cached_records

    return cached_records()


def script_record(script: str, args) -> dict:
    """The fields a benchmark script's record starts with: its command line (from its parsed arguments, --out left
    out), the CPU, the thread count and torch's version."""
    import torch

    command = f"python benchmarks/{script} " + " ".join(
        f"--{name.replace('_', '-')} {value}" for name, value in vars(args).items() if name != "out")
    return {"command": command, "cpu": settings.cpu_model(), "threads": args.threads, "torch": torch.__version__}
