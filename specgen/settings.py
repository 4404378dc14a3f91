"""Every `SPECGEN_*` environment setting, read here and nowhere else, the process's torch thread count, and the
CPU model (what a record or a calibration of step costs is keyed by).

A setting is read when it is used (not at import), so a test or a long-lived process that changes the environment
is heard. `snapshot()` is what bench records store and `specgen info` shows. Nothing heavy is imported.
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Setting:
    name: str
    default: str  # what an unset (or blank) variable means
    help: str


SETTINGS = {s.name: s for s in (
    Setting("SPECGEN_HOME", "~/.cache/specgen", "the user cache: converted models, token groups, timestamped runs"),
    Setting("SPECGEN_ASSETS", "", "the shipped checkpoints' folder (default: the installed package's assets/)"),
    Setting("SPECGEN_BENCHMARKS", "", "the benchmarks folder: prompts and results (default: the checkout's)"),
    Setting("SPECGEN_THREADS", "1", "torch threads for decoding (the CLI's --threads wins)"),
    Setting("SPECGEN_KERNELS", "auto", "sampling-op backend: auto (Triton on CUDA tensors), torch or triton"),
    Setting("SPECGEN_MATMUL", "", "float32 (or off) turns off the image target's bfloat16 serving path"),
    Setting("SPECGEN_INT8_KERNEL", "auto", "the int8 rows CPU kernel: auto, avx2 (no AVX-512 path) or off"),
    Setting("SPECGEN_DECODE_KERNEL", "auto", "the compiled float32 Llama step: auto or off"),
    Setting("SPECGEN_ATTENTION_KERNEL", "auto", "attention one query at a time, compiled: auto or off"),
    Setting("SPECGEN_GEMMA_GLUE", "auto", "Gemma's compiled per-layer glue: auto or off"),
    Setting("SPECGEN_ESPEAK", "auto", "phonemes from the bundled libespeak-ng (library), the program (binary) or "
                                      "the library with the program as fallback (auto)"),
)}


def _environment(name: str) -> str:
    """The variable as the environment has it, stripped ("" when unset); only declared settings are read."""
    return os.environ.get(SETTINGS[name].name, "").strip()  # a KeyError names a setting not declared above


def get(name: str) -> str:
    """The setting's value: the environment's, or its default when unset or blank."""
    return _environment(name) or SETTINGS[name].default


def is_set(name: str) -> bool:
    return bool(_environment(name))


def path(name: str, default: Path) -> Path:
    """A folder setting: the environment's (with ~ expanded), else `default`."""
    return Path(get(name)).expanduser() if is_set(name) else default


def snapshot() -> dict[str, str]:
    """Every setting's effective value, marked `(default)` where the environment leaves it unset."""
    return {name: get(name) if is_set(name) else f"{setting.default} (default)".lstrip()
            for name, setting in SETTINGS.items()}


def use_threads(threads: int) -> None:
    """torch's intra-op thread count for this process (decoding is fastest and steadiest on 1 thread here)."""
    import torch

    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


def cpu_model() -> str:
    """The CPU's model name (from /proc/cpuinfo where there is one)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
