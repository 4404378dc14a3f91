"""SpecMemo (S23): what speculative decoding holds in memory beyond the loaded weights, and the largest
configuration of a request that fits a memory budget.

The memory model counts what a configuration allocates while it decodes (B batch rows, a verified window of K
slots, a context of S tokens):

    kv      = Σ_models B · slots(S + K) · 2 · layers · kv_heads · head_dim · bytes   # PositionCache, per model
    logits  = LOGIT_COPIES · B · K · V_target · 4  +  B · K · V_draft · 4           # verify laws; draft laws kept
    tree    = B · (K − 1) · TREE_LAWS · V_draft · 8  +  B · TREE_ROW_MB                 # a draft tree's float64 laws

`slots` is the cache's own rounding (the next power of two, at least 64). The budget bounds the process's peak
resident memory (what a container limit or `ulimit -v` sees); what the models already hold is measured (the
resident set now), so the plan has `budget − resident now` for the decoding. When that headroom is short, the
plan shrinks what speculation adds first, as SpecMemo does — the verified window down to four slots (the tail of
a long window or a big tree is mostly rejected) — then the batch rows, then the window to two slots (one drafted
token). A budget that even then cannot hold the request is refused with the amount it needs.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from dataclasses import dataclass, field
from functools import cache
from typing import Callable

from specgen.errors import InvalidRequest

MB = 1024 * 1024
# vocabulary-sized float32 tensors per verified slot and row that coexist at a step's peak (the logits, the processed
# law, its probabilities, the acceptance rule's copies): measured 7 on the code pair and 7-8 on Gemma 3 270M
LOGIT_COPIES = 8
# Python objects, small tensors and allocator rounding of a decoding run; a draft tree's float64 laws per drafted
# node and row (its own, the without-replacement rule's residuals) and per row. Fitted to the peaks measured on
# the code pair (chains and Sequoia trees, 1-8 rows, windows 5-17: benchmarks/memory/budget-latest.md), rounded up
# so the model over-predicts: it errs towards a configuration smaller than the budget allows, never a larger one
SLACK_MB = 14.0
TREE_LAWS = 10
TREE_ROW_MB = 1.0
SHRINK_WINDOW_TO = 4  # the window speculation keeps before batch rows are cut


class MemoryBudgetError(InvalidRequest):
    """The budget cannot hold the models plus the smallest configuration of the request."""


@dataclass(frozen=True)
class Footprint:
    """What one configuration allocates while decoding, in MB, by the memory model."""

    rows: int
    window: int  # verified slots per row per step (1: plain decoding)
    context: int  # tokens a row holds at most (prompt + new tokens)
    kv_mb: float
    logits_mb: float
    tree_mb: float = 0.0

    @property
    def total_mb(self) -> float:
        return self.kv_mb + self.logits_mb + self.tree_mb + SLACK_MB


@dataclass(frozen=True)
class ModelShape:
    """What the memory model reads of one model: its KV bytes per cached position and its vocabulary."""

    kv_bytes_per_slot: int
    vocab: int
    capacity: int

    @classmethod
    def of(cls, model, capacity: int | None = None) -> ModelShape:
        config = model.config
        config = getattr(config, "text_config", None) or config
        heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        kv_heads = getattr(config, "num_key_value_heads", None) or heads
        element = next(model.parameters()).element_size()
        return cls(2 * config.num_hidden_layers * kv_heads * head_dim * element, config.vocab_size,
                   capacity or getattr(config, "max_position_embeddings", 2048))


def footprint(target: ModelShape, draft: ModelShape | None, rows: int, window: int, context: int,
              tree: bool = False) -> Footprint:
    """The memory model (module docstring) for `rows` rows verifying `window` slots (a tree: its nodes + 1)."""
    from specgen.modalities.runtime.transformers_adapter import cache_slots  # torch: only when a plan is made

    models = [target] + ([draft] if draft is not None else [])
    kv = sum(rows * cache_slots(context + window, m.capacity + window) * m.kv_bytes_per_slot for m in models)
    logits = LOGIT_COPIES * rows * window * target.vocab * 4
    if draft is not None and window > 1:
        logits += rows * window * draft.vocab * 4
    trees = 0.0
    if tree:
        trees = rows * (window - 1) * TREE_LAWS * (draft or target).vocab * 8 + rows * TREE_ROW_MB * MB
    return Footprint(rows, window, context, kv / MB, logits / MB, trees / MB)


@dataclass(frozen=True)
class MemoryPlan:
    budget_mb: float
    resident_mb: float  # the process before decoding (the loaded models, the runtime)
    rows: int
    window: int
    footprint: Footprint
    reduced: tuple[str, ...] = field(default=())  # what was cut to fit, in words

    @property
    def predicted_peak_mb(self) -> float:
        return self.resident_mb + self.footprint.total_mb

    def summary(self) -> dict:
        return {"budget_mb": self.budget_mb, "resident_mb": round(self.resident_mb, 1), "rows": self.rows,
                "window": self.window, "predicted_peak_mb": round(self.predicted_peak_mb, 1),
                "kv_mb": round(self.footprint.kv_mb, 2), "logits_mb": round(self.footprint.logits_mb, 2),
                "tree_mb": round(self.footprint.tree_mb, 2),
                "reduced": list(self.reduced)}


def plan(budget_mb: float, resident: float, rows: int, window: int,
         measure: Callable[[int, int], Footprint], adjustable: bool = True) -> MemoryPlan:
    """The configuration closest to (rows, window) whose footprint fits `budget_mb − resident`: the window first
    (down to SHRINK_WINDOW_TO), then rows (halved), then the window down to 2 (1 when it was 1: plain decoding).
    A window that is not `adjustable` (a method without a length knob) stays; only rows are cut."""
    if budget_mb <= 0:
        raise InvalidRequest(f"the memory budget must be positive, got {budget_mb:g} MB")
    headroom = budget_mb - resident
    floor = min(window, 2) if adjustable else window
    kept = min(window, SHRINK_WINDOW_TO) if adjustable else window
    tries = [(rows, w) for w in _shrinking(window, kept)]
    r = rows
    while r > 1:
        r = max(1, r // 2)
        tries.append((r, kept))
    tries += [(1, w) for w in _shrinking(kept, floor)]
    for r, w in tries:
        fp = measure(r, w)
        if fp.total_mb <= headroom:
            reduced = tuple(x for x in (f"rows {rows} -> {r}" if r < rows else "",
                                        f"window {window} -> {w}" if w < window else "") if x)
            return MemoryPlan(budget_mb, resident, r, w, fp, reduced)
    smallest = measure(1, floor)
    raise MemoryBudgetError(
        f"a memory budget of {budget_mb:g} MB cannot hold this request: the loaded models and runtime take "
        f"{resident:.0f} MB and its smallest configuration (1 row, a window of {floor}) needs {smallest.total_mb:.0f} "
        f"MB more; give at least {resident + smallest.total_mb:.0f} MB")


def _shrinking(start: int, stop: int) -> list[int]:
    """start, then halvings, down to stop (both included)."""
    out, w = [start], start
    while w > stop:
        w = max(stop, w // 2)
        out.append(w)
    return out


# ---- measuring the process ---------------------------------------------------------------------------------------

def _status_mb(field_name: str, pid: int | str = "self") -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field_name + ":"):
                return int(line.split()[1]) / 1024
    raise OSError(f"/proc/{pid}/status has no {field_name} line")


def resident_mb(pid: int | str = "self") -> float:
    """A process's resident memory now (VmRSS), in MB; this process's after handing its freed heap memory back to
    the system. OSError where it cannot be read."""
    if pid == "self":
        release_freed()
    return _status_mb("VmRSS", pid)


def peak_mb() -> float:
    """The process's peak resident memory (VmHWM) since it started or since `reset_peak`."""
    return _status_mb("VmHWM")


def reset_peak() -> bool:
    """Restart the peak (VmHWM) at the current resident set; False where the kernel does not allow it."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


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


def release_freed() -> None:
    """glibc keeps freed memory cached in the process; hand it back so the resident set is what is in use."""
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)


def limit_malloc_arenas(arenas: int = 2) -> bool:
    """Cap glibc's malloc arenas before a server starts its worker threads. Every thread that allocates otherwise
    gets an arena of its own, and the tensors freed after a request stay cached in it: a server's resident memory
    then creeps up request after request (about 10 % over 200 mixed requests in the demo) with no object left
    alive. Returns whether the cap was set."""
    libc = _glibc()
    return bool(libc is not None and libc.mallopt(M_ARENA_MAX, arenas))


def window_of(spec, knobs: dict) -> tuple[str | None, int]:
    """(the knob that sets the verified window, the window it gives) for a method: a tree's node budget + 1, a
    chain's draft length + 1, plain decoding 1."""
    if spec.drafter is None:
        return None, 1
    for knob in ("tree_budget", "num_draft_tokens"):
        if knob in knobs:
            return knob, int(knobs[knob]) + 1
    return None, 1 + max((int(v) for k, v in knobs.items() if k in ("max_depth", "depth")), default=16)
