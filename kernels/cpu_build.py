"""One build helper for the C++ CPU kernels, whose sources are real files in kernels/csrc/.

`build` compiles the named files (concatenated in order, csrc/'s headers written in where they are first included)
into a torch extension once per machine, against the few torch headers the kernels use (csrc/torch_lean.h; the
whole of <torch/extension.h>, which load_inline would put first, took 38 s of a 44 s build): the module name hashes
that text and the compile flags, so torch's extension cache rebuilds exactly when one of them changes. Nothing
names the folder the sources came from, so an installed wheel and a checkout share one build (with csrc/ on the
include path, torch saw the other's build as changed and rebuilt it each time either ran, a minute each). Where
the CPU lacks AVX2/FMA, no compiler or ninja is found, or the kernel's switch setting is "off", it returns None
and the caller keeps its torch path.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import platform
import re
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

from specgen import settings

log = logging.getLogger(__name__)
CSRC = Path(__file__).resolve().with_name("csrc")
STALE_LOCK_S = 300.0  # a kernel builds in about 20 s; a lock this old was left by a build that was killed


def cpu_flags() -> set[str]:
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def compile_flags() -> list[str]:
    """AVX2/FMA everywhere; AVX-512F as well where the CPU has it (the 16-lane paths are compiled only then, so an
    extension never holds instructions this CPU lacks)."""
    wide = ["-mavx512f"] if "avx512f" in cpu_flags() and settings.get("SPECGEN_INT8_KERNEL") != "avx2" else []
    return ["-O3", "-mavx2", "-mfma", *wide]


def buildable() -> bool:
    """An x86-64 CPU with AVX2 and FMA, a C++ compiler and ninja: where the kernels must build."""
    return {"avx2", "fma"} <= cpu_flags() and shutil.which("c++") is not None and shutil.which("ninja") is not None


LOCAL_INCLUDE = re.compile(r'^#include "([^"]+)".*$', re.MULTILINE)


def source(*files: str) -> str:
    """The named csrc/ files, concatenated in order (one translation unit), each csrc/ header written in at its
    first `#include "..."` (its `#pragma once` dropped) and left out at later ones."""
    seen: set[str] = set()

    def header(match: re.Match) -> str:
        name = match.group(1)
        if name in seen:
            return f"// {name}: written in above"
        seen.add(name)
        text = (CSRC / name).read_text(encoding="utf-8")
        return re.sub(r"^#pragma once\n", "", text, flags=re.MULTILINE)

    return "".join(LOCAL_INCLUDE.sub(header, (CSRC / name).read_text(encoding="utf-8")) for name in files)


def extension_name(prefix: str, text: str, flags: list[str]) -> str:
    """`prefix` and a hash of the source `text` (headers written in) and the compile `flags`: a new name, so a new
    build, when one changes."""
    return prefix + hashlib.sha256((text + " ".join(flags)).encode()).hexdigest()[:12]


def build_dir(name: str) -> Path | None:
    """torch's build folder for extension `name` (made if missing), or None where this torch does not say."""
    from torch.utils import cpp_extension

    where = getattr(cpp_extension, "_get_build_directory", None)
    return Path(where(name, False)) if where is not None else None


def clear_stale_lock(folder: Path, older_than_s: float = STALE_LOCK_S) -> bool:
    """Remove the `lock` file a killed build left in `folder`; True where one was removed.

    torch takes that lock for every load, even of a built extension, and waits on it without end: one build killed
    mid-way (Ctrl-C twice, a closed terminal, a timeout's SIGKILL) would make every later import hang. A build
    still running elsewhere holds a fresh lock, which stays."""
    lock = folder / "lock"
    try:
        age_s = time.time() - lock.stat().st_mtime
    except FileNotFoundError:
        return False
    if age_s < older_than_s:
        return False
    log.warning("removing a stale build lock (%.0f s old): %s", age_s, lock)
    lock.unlink(missing_ok=True)
    return True


def build(prefix: str, files: tuple[str, ...], functions: list[str], switch: str, what: str, fallback: str):
    """The extension built from csrc/`files` exposing `functions`, or None where it cannot be built here or the
    setting `switch` is "off" (the caller then takes its torch path, `fallback`)."""
    if settings.get(switch) == "off" or not buildable():
        return None
    try:
        from torch.utils.cpp_extension import load_inline

        flags = compile_flags()
        text = source(*files)
        name = extension_name(prefix, text, flags)
        folder = build_dir(name)
        if folder is not None:
            clear_stale_lock(folder)
        log.info("building the %s CPU kernel once (about 20 s)", what)
        return load_inline(name, cpp_sources=text, functions=functions, extra_cflags=flags, verbose=False,
                           no_implicit_headers=True)
    except Exception as exc:  # noqa: BLE001 - any build failure means: use the fallback
        log.warning("%s CPU kernel unavailable (%s); %s", what, str(exc).splitlines()[0], fallback)
        return None


def on_cpu(model) -> bool:
    """Whether a torch module's first tensor (a parameter, else a buffer: int8 layers keep buffers) is on the CPU."""
    first = next(itertools.chain(model.parameters(), model.buffers()), None)
    return first is not None and first.device.type == "cpu"


_CALLED: set[Callable[[], object]] = set()  # the loads `build_side_by_side` has run (each keeps its module)


def build_side_by_side(*loads: Callable[[], object]) -> None:
    """Call each kernel module's `load` on a thread of its own. Where the kernels are not built yet, their compilers
    run at once, one per kernel, rather than one after another as the first forward reaches each (Gemma's four: 83 s
    one after another, 51 s side by side on 2 cores). Each `load` keeps its module, so a load already run here is
    not run again: runners are made per request, and a pool of threads costs about 1 ms."""
    todo = [load for load in loads if load not in _CALLED]
    if not todo or not buildable():
        return
    with ThreadPoolExecutor(max_workers=len(todo)) as pool:
        list(pool.map(lambda load: load(), todo))
    _CALLED.update(todo)
