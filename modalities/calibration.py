"""Per-machine, per-model step costs for `auto`: T_verify(n) by window size, each candidate's drafting cost by
length, and each candidate's acceptance on a short run, measured once and cached.

The cache lives in `$SPECGEN_HOME/calibration/<key>.json`, keyed by the CPU model, the compiled kernels' instruction
set (AVX2 or AVX-512), the torch thread count, the torch version, the modality and a hash of the model files (name,
size, modification time of every file of the target and of its draft or head), so a new machine, thread count,
torch or checkpoint is measured afresh and anything else is reused. A candidate missing from a cached record (a
drafter added since) is measured and added; a record measured while other work shared the CPU (`Contention`) is
measured again by the first request that finds the machine quiet. `specgen calibrate` measures ahead of time;
otherwise the first `auto` request does, with a progress bar on stderr.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Sequence

import torch

from specgen import settings
from specgen.modalities.runtime.transformers_adapter import measure_window_s
from specgen.samplers.auto import Costs, nondecreasing
from specgen.samplers.types import DecodeContext

VERSION = 13  # 2: fastest of 5 timings, monotone in window size; 4: Jacobi priors over a whole image or clip; 5: image/
# video windows timed at half a request's context; 7: windows timed round-robin and fitted monotone (PAV), the int8
# kernel reads the weights once for 7-12 rows; 8: the decode step's AVX2 tiles keep to registers (wide windows cost
# a fifth of before there), and the key names the kernels' instruction set; 9: drafting's fixed cost and each verified
# slot's cost as measured inside the loop; 10: the int8 kernel's rows in groups of one pass each (verification windows
# of 5-24 slots on Gemma 3 270M a fifth to two fifths cheaper); 11: each candidate's speedup per calibration prompt;
# 12: a Jacobi window's tokens committed after each step of its run; 13: speech priors from the model's example and
# calibration sentences (before, from the first request's alone)
# a Jacobi window's run, one whole image or clip (at most this many tokens): its tokens per step grow as it settles
STATEFUL_PRIOR_TOKENS = 2048
PRIOR_TOKENS = 64  # tokens of each short run (one per calibration prompt) that measures a candidate's acceptance
WINDOWS = (1, 2, 3, 4, 5, 6, 8, 10, 13, 17)
# a batch of R rows verifying w slots each scores R * w slots, and a forward costs what its slots cost however they
# split into rows (Gemma 3 270M 0.98-1.01, the code target 0.95-1.14 of one row's: benchmarks/batch-window-*-latest.md):
# a batch's windows are timed as one row's of R times the width, at these multiples of R, up to BATCH_SLOTS (wider
# steps follow the last segment's slope)
BATCH_MULTIPLES = (1, 2, 3, 5, 9, 17)
BATCH_SLOTS = 136  # 8 rows of 17 slots: the serve and batch runners' default rows at auto's longest chain


def batch_windows(rows: int, widest: int) -> set[int]:
    """The window sizes (slots) a batch of `rows` rows needs timed beyond one row's, up to `widest` slots a row."""
    if rows <= 1:
        return set()
    return {rows * m for m in BATCH_MULTIPLES if m <= widest and rows * m <= BATCH_SLOTS}


def files_hash(paths: Sequence[str | Path | None]) -> str:
    """A hash of every file under `paths` by name, size and modification time (cheap for large weights)."""
    digest = hashlib.sha256()
    for path in paths:
        if path is None:
            continue
        path = Path(path)
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        for file in files:
            if file.exists() and "__pycache__" not in file.parts:
                stat = file.stat()
                digest.update(f"{file.name}:{stat.st_size}:{stat.st_mtime_ns};".encode())
    return digest.hexdigest()[:16]


def machine_key(modality: str, paths: Sequence) -> dict:
    from specgen.kernels import cpu_build

    # one CPU model name covers parts with and without AVX-512, and the compiled kernels' costs differ between them
    return {"cpu": settings.cpu_model(), "kernels": " ".join(cpu_build.compile_flags()),
            "threads": torch.get_num_threads(), "torch": torch.__version__, "modality": modality,
            "models": [str(p) for p in paths if p is not None], "model_hash": files_hash(paths), "version": VERSION}


def cache_dir() -> Path:
    """Where calibrations are cached: `$SPECGEN_HOME/calibration`."""
    return settings.path("SPECGEN_HOME", Path("~/.cache/specgen").expanduser()) / "calibration"


def cache_path(key: dict) -> Path:
    name = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
    return cache_dir() / f"{key['modality']}-{name}.json"


def load(key: dict) -> dict | None:
    path = cache_path(key)
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return record if record.get("key") == key else None


def save(record: dict) -> Path:
    path = cache_path(record["key"])
    path.parent.mkdir(parents=True, exist_ok=True)
    # a name of its own per writer: two processes calibrating the same model (two servers, two test workers on one
    # cache) each replace the record whole, never write into the other's half-written file
    handle, tmp = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=".tmp", dir=path.parent)
    with os.fdopen(handle, "w") as out:
        out.write(json.dumps(record, indent=1))
    os.replace(tmp, path)
    return path


def costs_of(record: dict) -> Costs:
    return Costs({int(n): s for n, s in record["verify_s"].items()},
                 {name: tuple(v) for name, v in record["draft_s"].items()}, record.get("overhead_s", 0.0),
                 record.get("verify_per_slot_s", 0.0))


def _in_loop_fixed(costs: Costs, name: str, run: dict, per_token: float) -> float:
    """The fixed drafting seconds per step of the candidate's calibration runs. The timings alone propose again
    and again on one warm context; in the loop the drafter first catches up on the last step's tokens (a forward
    of its own whatever the length asked next, so it goes into the fixed part; the timings keep the slope) and
    finds its caches cold after the target's forward. On the code pair the timings alone priced the EAGLE head's
    step at 5.2 ms against 8.4 in the loop, and `auto` chose it (predicted 2.5x plain decoding, ran 1.7x) over
    draft-lookup (predicted 1.9x, ran 1.9x). Never below the timings' own (a lookup hit drafts for nothing)."""
    steps = len(run["lengths"])
    fixed = costs.draft(name, 0)
    return max(fixed, (sum(run["draft_s"]) - per_token * sum(run["lengths"])) / steps) if steps else fixed


def _per_slot_s(costs: Costs, windows: list[tuple[int, float, int]]) -> float:
    """Seconds each verified slot beyond the first adds inside the loop over the target's forward: the acceptance
    rule's laws over the vocabulary (on Gemma 3 262,144 logits per slot) and the cache bookkeeping. The slope of
    (in-loop verification per step - T_verify(n)) against n, weighted by steps, from every calibration run's
    windows (n, seconds, steps); the part every step pays, one slot included, is the loop overhead."""
    points = [(n, seconds / count - costs.verify(n), count) for n, seconds, count in windows if count]
    total = sum(w for _, _, w in points)
    if len({n for n, _, _ in points}) < 2 or total == 0:
        return 0.0
    mean_n = sum(n * w for n, _, w in points) / total
    mean_e = sum(e * w for _, e, w in points) / total
    spread = sum(w * (n - mean_n) ** 2 for n, _, w in points)
    return max(sum(w * (n - mean_n) * (e - mean_e) for n, e, w in points) / spread, 0.0)


class Progress:
    """A progress bar on stderr (quiet when `quiet` or when stderr is not a terminal and nothing asked for it)."""

    def __init__(self, total: int, label: str, quiet: bool = False):
        self.bar = None
        if not quiet:
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc=label, file=sys.stderr, leave=False, mininterval=0.2)

    def update(self, what: str) -> None:
        if self.bar is not None:
            self.bar.set_postfix_str(what, refresh=False)
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


BUSY_MARGIN = 0.5  # threads running beside this process's own, on average, that mark the machine busy
PROC_STAT = "/proc/stat"


def others_running() -> int | None:
    """Threads running on the machine now beyond this process's torch threads (`procs_running` in /proc/stat counts
    the reading thread itself); None where the kernel does not say."""
    try:
        with open(PROC_STAT) as stat:
            for line in stat:
                if line.startswith("procs_running"):
                    return max(int(line.split()[1]) - torch.get_num_threads(), 0)
    except (OSError, ValueError, IndexError):
        pass
    return None


class Contention:
    """What ran beside a calibration, sampled between its timings. Costs measured beside other work are that work's:
    on this machine, with a training run on the other core, the speech target's step timed 0.55 ms against 0.41 ms on
    a quiet machine while its draft's barely moved, and `auto` kept plain decoding for every speech request though
    `sd` ran 1.2 times as fast. The 1-minute load average, which this once read, trails by a minute: a calibration run
    alone right after two busy cores (the demo's warm-up in the test suite, its other worker held back) read busy, and
    the demo's first click measured Gemma again (55 s) beside the browser."""

    def __init__(self):
        self.samples: list[int] = []

    def sample(self) -> None:
        others = others_running()
        if others is not None:
            self.samples.append(others)

    def busy(self) -> bool:
        if not self.samples:  # no /proc/stat here: the load average is all there is to go by
            return load_busy()
        return sum(self.samples) / len(self.samples) > BUSY_MARGIN


def machine_busy(samples: int = 20, interval_s: float = 0.005) -> bool:
    """Whether other work shares the CPU now (`samples` readings `interval_s` apart, about 0.1 s)."""
    contention = Contention()
    for index in range(samples):
        if index:
            time.sleep(interval_s)
        contention.sample()
        if not contention.samples:  # no /proc/stat: `busy` reads the load average
            break
    return contention.busy()


def load_busy() -> bool:
    """The 1-minute load average exceeds this process's torch threads by BUSY_MARGIN."""
    try:
        load = os.getloadavg()[0]
    except OSError:  # no load average on this platform: nothing to go by
        return False
    return load > torch.get_num_threads() + BUSY_MARGIN


def calibrate(key: dict, target, prompt: torch.Tensor, windows: Sequence[int], candidates: dict[str, Callable],
              run_prior: Callable, record: dict | None = None, quiet: bool = False, processing=None) -> dict:
    """Measure what `record` lacks: T_verify(n) for each n of `windows`, the loop's overhead per step, and per
    candidate (name -> a function building a fresh `Candidate`) its drafting cost and its acceptance on short runs
    (`run_prior(build)` -> a dict of acceptance and step timings), whose timings then set the drafting cost's fixed
    part and each verified slot's cost inside the loop."""
    started, contention = time.perf_counter(), Contention()
    record = record or {"key": key, "verify_s": {}, "draft_s": {}, "prior": {}}
    todo_windows = [n for n in windows if str(n) not in record["verify_s"]]
    todo = [name for name in candidates if name not in record["draft_s"]]
    if not todo_windows and not todo and "overhead_s" in record:
        return record
    rounds = REPEATS if todo_windows else 0
    progress = Progress(rounds + len(todo), f"calibrating {key['modality']} for this machine", quiet)
    try:
        measure_window_s(target, prompt, 1, 2)  # first touch: compiled kernels, caches
        # round-robin over the windows, so a burst of load from elsewhere slows one timing of several sizes rather
        # than every timing of one size
        samples: dict[int, list[float]] = {n: [] for n in todo_windows}
        for round_ in range(rounds):
            for n in todo_windows:
                contention.sample()
                samples[n].append(measure_window_s(target, prompt, n, 1))
            progress.update(f"windows, round {round_ + 1} of {rounds}")
        for n, times in samples.items():
            record["verify_s"][str(n)] = min(times)  # on a shared CPU the noise only ever adds time
        record["verify_s"] = _monotone(record["verify_s"])
        if "overhead_s" not in record:
            record["overhead_s"] = _loop_overhead(target, prompt, record["verify_s"]["1"], processing)
        run_windows: list[tuple[int, float, int]] = []  # (n, seconds, steps) of verification in the runs
        for name in todo:
            build = candidates[name] if processing is None else lambda name=name: candidates[name](processing)
            contention.sample()
            fixed, per_token = _draft_cost(build(), prompt)
            record["draft_s"][name] = [fixed, per_token]
            contention.sample()
            run = run_prior(build)
            contention.sample()
            record["prior"][name] = {k: run[k] for k in ("alpha", "alpha_at", "hit", "tau", "curve") if k in run}
            if run.get("tokens_per_s"):  # over plain decoding's step in the loop
                plain_s = record["verify_s"]["1"] + record["overhead_s"]
                record["prior"][name]["speedup"] = run["tokens_per_s"] * plain_s
                record["prior"][name]["speedups"] = [t * plain_s for t in run.get("tokens_per_s_by_prompt", ())]
            record["draft_s"][name][0] = _in_loop_fixed(costs_of(record), name, run, per_token)
            run_windows += [(int(n), seconds, count) for n, (seconds, count) in run["verify_by_window"].items()]
            progress.update(name)
        if run_windows:
            record["verify_per_slot_s"] = _per_slot_s(costs_of(record), run_windows)
    finally:
        progress.close()
    # measured (or partly measured) while other work shared the CPU: measured again once the machine is quiet
    record["busy"] = bool(record.get("busy")) or contention.busy()
    record["seconds"] = round(record.get("seconds", 0.0) + time.perf_counter() - started, 2)
    record["measured_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return record


REPEATS = 5


def _loop_overhead(target, prompt: torch.Tensor, verify_one_s: float, processing, short: int = 4,
                   long: int = 28) -> float:
    """Seconds one step of plain decoding through the loop takes beyond the target's forward: what every step pays
    whatever is drafted. The slope between runs of `short` and `long` tokens (the fastest of three each), so the
    prompt's prefill cancels out."""
    from specgen.samplers import loop
    from specgen.samplers.acceptance import make_rule
    from specgen.samplers.processing import Processing

    processing = processing or Processing()
    rule = make_rule("chain", processing)

    def run_s(tokens: int) -> float:
        started = time.perf_counter()
        loop.generate(target, None, rule, [prompt], processing=processing, max_new_tokens=tokens)
        return time.perf_counter() - started

    fastest = {n: min(run_s(n) for _ in range(3)) for n in (short, long)}
    per_step = (fastest[long] - fastest[short]) / (long - short)
    return max(per_step - verify_one_s, 0.0)


def _monotone(verify_s: dict) -> dict:
    """A larger window never costs less: the closest non-decreasing fit. Where a size reads cheaper than a smaller
    one, both take their mean, so one lucky timing of a wide window does not make every narrower one look as cheap
    (which would overstate what a longer draft costs against a shorter one)."""
    sizes = sorted(verify_s, key=int)
    return dict(zip(sizes, nondecreasing([verify_s[n] for n in sizes])))


def _draft_cost(candidate, prompt: torch.Tensor) -> tuple[float, float]:
    """(fixed, per token) seconds of a proposal, from the fastest proposals of two lengths (a tree: its own)."""
    ctx = DecodeContext([prompt], torch.zeros(1, dtype=torch.long), torch.zeros(1, dtype=torch.long), 0)
    lengths = (max(candidate.lengths),) if candidate.is_tree else (1, max(candidate.lengths))
    times = {}
    candidate.drafter.propose(ctx, lengths[-1])  # first touch (the draft's prompt prefill)
    for length in lengths:
        samples = []
        for _ in range(REPEATS):
            start = time.perf_counter()
            candidate.drafter.propose(ctx, length)
            samples.append(time.perf_counter() - start)
        times[length] = min(samples)
    if len(lengths) == 1:
        return times[lengths[0]], 0.0
    short, long = lengths
    per_token = max((times[long] - times[short]) / (long - short), 0.0)
    return max(times[short] - per_token, 0.0), per_token


def cached_records() -> list[dict]:
    """Every calibration in the user cache (for `specgen info`)."""
    out = []
    for path in sorted(cache_dir().glob("*.json")):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        out.append({"file": str(path), "modality": record["key"]["modality"], "models": record["key"]["models"],
                    "cpu": record["key"]["cpu"], "threads": record["key"]["threads"],
                    "torch": record["key"]["torch"], "measured_at": record.get("measured_at"),
                    "seconds": record.get("seconds"), "busy": bool(record.get("busy")),
                    "T_verify_ms": {n: round(s * 1e3, 2) for n, s in sorted(record["verify_s"].items(),
                                                                           key=lambda kv: int(kv[0]))},
                    "candidates": sorted(record["draft_s"])})
    return out
