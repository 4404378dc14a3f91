"""Model holders for the web demo: a generator loads on first use (thread-safe) or in a background thread when
the demo starts, and remembers why it failed so the header can say so."""

from __future__ import annotations

import logging
import threading
import time
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
