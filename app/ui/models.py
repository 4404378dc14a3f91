"""Model holders for the web demo: a generator loads on first use (thread-safe) or in a background thread when
the demo starts, and remembers why it failed so the header can say so."""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import threading
import time
from functools import cache
from typing import Callable

from specgen.errors import SpecgenError

log = logging.getLogger("specgen.app.ui")


class LazyGenerator:
    def __init__(self, load: Callable[[], object], what: str, generator=None):
        self._load, self.what, self._generator = load, what, generator
        self._lock = threading.Lock()
        self.error: str | None = None
        self.loading = False  # True while a load runs (the demo's header then refreshes itself)

    @property
    def loaded(self) -> bool:
        return self._generator is not None

    def state(self) -> str:
        return ("loaded" if self.loaded else f"not loaded: {self.error}" if self.error
                else "loads on the first request")

    def get(self):
        with self._lock:
            if self._generator is None:
                started = time.perf_counter()
                self.loading = True
                try:
                    self._generator = self._load()
                except SpecgenError as exc:
                    self.error = str(exc)
                    raise
                finally:
                    self.loading = False
                self.error = None
                log.info("%s loaded in %.1f s", self.what, time.perf_counter() - started)
            return self._generator

    def preload(self) -> threading.Thread:
        """Load in a background thread (launch returns at once; the first request waits for the lock)."""
        def load():
            try:
                self.get()
            except SpecgenError as exc:
                log.warning("%s not loaded: %s", self.what, exc)
        thread = threading.Thread(target=load, name=f"specgen-preload-{self.what}", daemon=True)
        thread.start()
        return thread


def warm_default_paths(generator, prompt: str, methods=("auto", "ar"), **request) -> None:
    """Run the request a newcomer's first click makes, once per method, while the models load: compiled kernels,
    first-touch allocations and `auto`'s calibration (measured once per machine and model) are paid here, not
    charged to one side of the first comparison with plain decoding."""
    started = time.perf_counter()
    for method in methods:
        for _ in generator.stream(prompt, method=method, **request):
            pass
    log.info("warmed %s for %r in %.1f s", ", ".join(methods), prompt, time.perf_counter() - started)


# glibc's mallopt parameter for the number of malloc arenas (malloc.h)
M_ARENA_MAX = -8


@cache
def _glibc():
    """glibc when the process runs on it (for malloc_trim and mallopt), else None."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
        return libc if libc is not None and hasattr(libc, "malloc_trim") and hasattr(libc, "mallopt") else None
    except OSError:
        return None


def limit_malloc_arenas(arenas: int = 2) -> bool:
    """Cap glibc's malloc arenas before the server starts its worker threads. Every thread that allocates
    otherwise gets an arena of its own, and the tensors freed after a request stay cached in it: the demo's
    resident memory then creeps up request after request (about 10 % over 200 mixed requests) with no object
    left alive. Returns whether the cap was set."""
    libc = _glibc()
    return bool(libc is not None and libc.mallopt(M_ARENA_MAX, arenas))


def release_freed_memory() -> None:
    """Hand the memory freed by a finished request back to the system (glibc keeps it cached otherwise)."""
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)


def resident_mb(pid: int | str = "self") -> float:
    """A process's resident memory (VmRSS in /proc), in MB; OSError where it cannot be read."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise OSError(f"/proc/{pid}/status has no VmRSS line")
