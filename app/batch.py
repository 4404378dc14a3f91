"""`specgen batch`: run a JSON Lines file of requests, one result line per request, resumable.

In:  {"id", "modality", "prompt"|"class"|"text", "method"?, "params"?, "seed"?}
Out: {"id", "status": "ok"|"error", "result"|"error", "stats"}; an image item's result names its PNG, written to
     OUT-images/<id>.png beside OUT.jsonl (several samples: one grid), a video item's its GIF in OUT-videos/, a
     speech item's its WAV in OUT-audio/.

"params" holds the request options of the modality (`specgen.app.request_options`: the same names, types and
ranges as the `specgen generate` flags) and the method's knobs (`specgen.samplers.registry`).
The whole input is validated before any work (exit 2 naming the line). Each result line is flushed and
fsync'ed as it is written, so a killed run loses nothing; a rerun skips the ids already in the output.
Per-item failures are recorded with status "error" and the run goes on. Items run one after another on one
loaded model per modality (`--engine local`), or on Ray actors (`--engine ray`, when Ray is installed); with
`--rows N`, greedy text items that share a method and knobs decode N at a time by continuous batching.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from specgen.app import request_options
from specgen.app.jsonl import read_objects
from specgen.errors import InvalidRequest, MissingExtra, ModelNotFound, SpecgenError
from specgen.samplers import registry

log = logging.getLogger(__name__)

KNOWN_FIELDS = {"id", "modality", "prompt", "class", "text", "method", "params", "seed", "category"}


@dataclass(frozen=True)
class Request:
    line: int
    id: str | int
    modality: str
    source_field: str
    source: object
    method: str | None
    params: dict = field(default_factory=dict)
    seed: int = 0

    @property
    def key(self) -> str:
        return str(self.id)


# ---- validation --------------------------------------------------------------------------------------------------

def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _method_params(modality: str, method: str, params: dict) -> dict:
    """Validated params: generation options plus the method's knobs (unknown names are errors)."""
    spec = registry.get_method(modality, method)
    table = {name: option for name, option in request_options.fields(modality).items() if name != "seed"}
    options = {name: table[name].check(value) for name, value in params.items() if name in table}
    knob_values = {name: value for name, value in params.items() if name not in table}
    if "seed" in knob_values:
        raise InvalidRequest('"seed" belongs at the top level of the line, not in "params"')
    known = {k.name for k in spec.knobs}
    unknown = sorted(set(knob_values) - known)
    if unknown:
        raise InvalidRequest(f"method {method!r} has no parameter(s) {', '.join(unknown)}; known: "
                             f"{', '.join([*table, *known])}")
    spec.resolve_knobs(knob_values)  # type and range checks
    return {**options, **knob_values}


def parse_request(item: object, line: int, default_text_method: str | None = None) -> Request:
    if not isinstance(item, dict):
        raise InvalidRequest("expected a JSON object")
    unknown = sorted(set(item) - KNOWN_FIELDS)
    if unknown:
        raise InvalidRequest(f"unknown field(s) {', '.join(map(repr, unknown))}; "
                             f"known: {', '.join(sorted(KNOWN_FIELDS))}")
    if "id" not in item:
        raise InvalidRequest('missing "id"')
    item_id = item["id"]
    if not (_is_int(item_id) or (isinstance(item_id, str) and item_id.strip())):
        raise InvalidRequest(f'"id" must be a non-empty string or an integer, got {json.dumps(item_id)}')
    modality = item.get("modality")
    if modality not in registry.MODALITIES:
        raise InvalidRequest(f'unknown modality {json.dumps(modality)}; choose from: {", ".join(registry.MODALITIES)}'
                             if "modality" in item else 'missing "modality"')
    allowed = request_options.SOURCE_FIELDS[modality]
    present = [name for name in ("prompt", "class", "text") if name in item]
    wrong = [name for name in present if name not in allowed]
    if wrong:
        raise InvalidRequest(f'{modality} requests take {" or ".join(map(repr, allowed))}, not {wrong[0]!r}')
    if not present:
        raise InvalidRequest(f'missing {" or ".join(map(repr, allowed))} for modality {modality!r}')
    if len(present) > 1:
        raise InvalidRequest(f'give either {" or ".join(map(repr, present))}, not both')
    source_field = present[0]
    source = item[source_field]
    if source_field == "class":
        if not (_is_int(source) or (isinstance(source, str) and source.strip())):
            raise InvalidRequest(f'"class" must be a non-empty string or an integer, got {json.dumps(source)}')
    elif not isinstance(source, str) or not source.strip():
        raise InvalidRequest(f'"{source_field}" must be a non-empty string, got {json.dumps(source)}')
    method = item.get("method")
    if method is not None and (not isinstance(method, str) or not method):
        raise InvalidRequest(f'"method" must be a method name, got {json.dumps(method)}')
    params = item.get("params", {})
    if not isinstance(params, dict):
        raise InvalidRequest(f'"params" must be a JSON object, got {json.dumps(params)}')
    seed = request_options.SEED.check(item.get("seed", request_options.SEED.default))
    text_default = default_text_method if modality == "text" else None  # the text model's own, when known
    method = method or text_default or registry.default_method(modality)
    params = _method_params(modality, method, params)  # unknown method names fail here too
    return Request(line, item_id, modality, source_field, source, method, params, seed)


def load_requests(path: Path, default_text_method: str | None = None) -> list[Request]:
    """Every non-blank line parsed and validated; the first problem raises InvalidRequest naming its line."""
    requests, first_line = [], {}
    for number, item in read_objects(path):
        try:
            request = parse_request(item, number, default_text_method)
        except InvalidRequest as exc:
            raise InvalidRequest(f"{path} line {number}: {exc}") from None
        if request.key in first_line:
            raise InvalidRequest(f"{path} line {number}: duplicate id {json.dumps(request.id)} "
                                 f"(first on line {first_line[request.key]})")
        first_line[request.key] = number
        requests.append(request)
    if not requests:
        raise InvalidRequest(f"{path} holds no requests")
    return requests


def done_ids(path: Path) -> set[str]:
    """Ids already written to OUT. A last line cut short by a kill is removed (it was never complete)."""
    path = Path(path)
    if not path.exists():
        return set()
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise InvalidRequest(f"cannot read {path}: {exc}") from None
    if data and not data.endswith(b"\n"):
        keep = data.rfind(b"\n") + 1
        log.warning("%s: dropping an incomplete last line (%d bytes) left by an interrupted run",
                    path, len(data) - keep)
        with open(path, "r+b") as f:
            f.truncate(keep)
            f.flush()
            os.fsync(f.fileno())
        data = data[:keep]
    ids = set()
    for number, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            raise InvalidRequest(f"{path} line {number}: not a result line (invalid JSON); "
                                 f"refusing to append to it") from None
        if not isinstance(record, dict) or "id" not in record:
            raise InvalidRequest(f"{path} line {number}: not a result line (no \"id\"); refusing to append to it")
        ids.add(str(record["id"]))
    return ids


# ---- running -----------------------------------------------------------------------------------------------------

class Generators:
    """One generator per modality, each loaded on first use (`text` may be given ready-made)."""

    def __init__(self, text=None, *, model: str | None = None, draft: str | None = None, threads: int = 1,
                 image=None, image_model: str | None = None, image_vq: str | None = None, speech=None,
                 speech_paths: tuple = (None, None, None), video=None, video_model: str | None = None):
        self.loaded = {"text": text, "image": image, "video": video, "speech": speech}
        self.model, self.draft, self.threads = model, draft, threads
        self.image_model, self.image_vq, self.video_model = image_model, image_vq, video_model
        self.speech_paths = speech_paths  # (model, draft, codec); None = the shipped ones

    def get(self, modality: str):
        if self.loaded.get(modality) is None:
            if modality == "text":
                from specgen.modalities.text.generator import TextGenerator

                self.loaded["text"] = TextGenerator(self.model, self.draft, threads=self.threads)
            elif modality == "image":
                from specgen.modalities.image.generator import ImageGenerator

                self.loaded["image"] = ImageGenerator(self.image_model, self.image_vq, threads=self.threads)
            elif modality == "video":
                from specgen.modalities.image.generator import ImageGenerator

                self.loaded["video"] = ImageGenerator(self.video_model, self.image_vq, threads=self.threads,
                                                      video=True)
            else:
                from specgen.modalities.speech.generator import SpeechGenerator

                self.loaded["speech"] = SpeechGenerator(*self.speech_paths, threads=self.threads)
        return self.loaded[modality]


def media_path(folder: Path, request: Request, suffix: str) -> Path:
    """A file name for an item's image or audio: its id where that is a safe name, else the safe part plus a hash."""
    import hashlib
    import re

    name = re.sub(r"[^A-Za-z0-9._-]", "_", str(request.id))
    if name != str(request.id) or name.startswith("."):
        name += "-" + hashlib.sha256(str(request.id).encode()).hexdigest()[:8]
    return folder / f"{name}{suffix}"


def run_item(generators, request: Request, media_stem: Path | str = "batch") -> dict:
    """One result record; every failure becomes an error record. `generators` is a `Generators` (or, for text
    only, one generator). Images go to MEDIA_STEM-images/, audio to MEDIA_STEM-audio/; the record names the file."""
    try:
        generator = generators.get(request.modality) if isinstance(generators, Generators) else generators
        result = generator.generate(str(request.source), method=request.method, seed=request.seed, **request.params)
    except SpecgenError as exc:
        return {"id": request.id, "status": "error", "error": " ".join(str(exc).split()), "stats": None}
    except Exception as exc:  # noqa: BLE001 - one bad item must not end the run
        log.exception("item %s failed", request.id)
        return {"id": request.id, "status": "error", "error": f"{type(exc).__name__}: {exc}", "stats": None}
    if request.modality == "image":
        from specgen.app.cli.image import grid_image

        path = media_path(Path(f"{media_stem}-images"), request, ".png")
        path.parent.mkdir(parents=True, exist_ok=True)
        grid_image(result.images).save(path)
        output = {"image": str(path), "tokens": result.tokens[0] if len(result.tokens) == 1 else result.tokens}
    elif request.modality == "video":
        from specgen.app.cli.image import save_video_grid

        path = media_path(Path(f"{media_stem}-videos"), request, ".gif")
        path.parent.mkdir(parents=True, exist_ok=True)
        save_video_grid(result.images, path)
        output = {"video": str(path), "tokens": result.tokens[0] if len(result.tokens) == 1 else result.tokens}
    elif request.modality == "speech":
        from specgen.modalities.speech.codec import write_wav

        path = media_path(Path(f"{media_stem}-audio"), request, ".wav")
        path.parent.mkdir(parents=True, exist_ok=True)
        write_wav(path, result.audio, result.sample_rate)
        output = {"audio": str(path), "tokens": result.tokens}
    else:
        return _text_record(request, result)
    return {"id": request.id, "status": "ok", "result": output, "stats": result.stats}


def _text_record(request: Request, result) -> dict:
    if request.params.get("num_samples", 1) == 1:
        output = {"text": result.text, "tokens": result.tokens}
    else:
        output = {"samples": result.samples}
    return {"id": request.id, "status": "ok", "result": output, "stats": result.stats}


class ResultWriter:
    """Appends one JSON line per record; each is flushed and fsync'ed before the next item starts."""

    def __init__(self, path: Path):
        self.file = open(path, "a", encoding="utf-8")

    def write(self, record: dict) -> None:
        self.file.write(json.dumps(record, ensure_ascii=False) + "\n")
        self.file.flush()
        os.fsync(self.file.fileno())

    def close(self) -> None:
        self.file.close()


@dataclass
class Summary:
    items: int = 0
    skipped: int = 0
    ok: int = 0
    error: int = 0
    tokens: int = 0
    generation_s: float = 0.0
    load_s: float = 0.0
    taus: list = field(default_factory=list)
    by_method: dict = field(default_factory=dict)

    def add(self, request: Request, record: dict) -> None:
        key = f"{request.modality}/{request.method or '-'}"
        row = self.by_method.setdefault(key, {"ok": 0, "error": 0, "tokens": 0, "generation_s": 0.0, "taus": []})
        status = record["status"]
        setattr(self, status, getattr(self, status) + 1)
        row[status] += 1
        stats = record.get("stats") or {}
        if status == "ok":
            committed, wall = stats.get("committed", 0), stats.get("wall_s", 0.0)
            self.tokens += committed
            self.generation_s += wall
            row["tokens"] += committed
            row["generation_s"] += wall
            if stats.get("tau") is not None:
                self.taus.append(stats["tau"])
                row["taus"].append(stats["tau"])

    def to_json(self, elapsed_s: float, output: Path, engine: str) -> dict:
        def rate(tokens, seconds):
            return tokens / seconds if seconds > 0 else None

        def mean(values):
            return sum(values) / len(values) if values else None

        return {"input_items": self.items, "skipped": self.skipped, "ran": self.ok + self.error,
                "ok": self.ok, "error": self.error, "tokens": self.tokens,
                "generation_s": self.generation_s, "load_s": self.load_s, "elapsed_s": elapsed_s,
                "tokens_per_s": rate(self.tokens, self.generation_s),
                "tokens_per_s_elapsed": rate(self.tokens, elapsed_s), "mean_tau": mean(self.taus),
                "engine": engine, "output": str(output),
                "by_method": {key: {"ok": r["ok"], "error": r["error"], "tokens": r["tokens"],
                                    "tokens_per_s": rate(r["tokens"], r["generation_s"]), "mean_tau": mean(r["taus"])}
                              for key, r in self.by_method.items()}}


def summary_table(summary: dict) -> str:
    def fmt(value, digits=2):
        return "-" if value is None else f"{value:.{digits}f}" if isinstance(value, float) else str(value)

    lines = [f"batch: {summary['input_items']} items: {summary['ok']} ok, {summary['error']} error, "
             f"{summary['skipped']} skipped (already in {summary['output']}) in {summary['elapsed_s']:.1f} s"]
    header = ("modality/method", "ok", "error", "tokens", "tokens/s", "mean tau")
    rows = [(key, r["ok"], r["error"], r["tokens"], fmt(r["tokens_per_s"], 1), fmt(r["mean_tau"]))
            for key, r in summary["by_method"].items()]
    rows.append(("total", summary["ok"], summary["error"], summary["tokens"], fmt(summary["tokens_per_s"], 1),
                 fmt(summary["mean_tau"])))
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows)]
    for row in (header, *rows):
        lines.append("  ".join(str(cell).ljust(w) if i == 0 else str(cell).rjust(w)
                               for i, (cell, w) in enumerate(zip(row, widths))))
    return "\n".join(lines)


def _progress(total: int, disable: bool):
    from tqdm import tqdm

    return tqdm(total=total, file=sys.stderr, unit="item", desc="batch", disable=disable, mininterval=0.2,
                dynamic_ncols=True)


def _run_local(pending: list[Request], writer: ResultWriter, summary: Summary, generators, progress,
               media_stem: Path, rows: int = 1) -> None:
    def record(request: Request, result: dict) -> None:
        writer.write(result)
        summary.add(request, result)
        progress.set_postfix(ok=summary.ok, error=summary.error, refresh=False)
        progress.update(1)

    alone, groups = (pending, {}) if rows == 1 else _served_groups(pending)
    for group in groups.values():
        for request, result in _serve_group(generators, group, rows):
            record(request, result)
    for request in alone:
        record(request, run_item(generators, request, media_stem))


def _served_groups(pending: list[Request]) -> tuple[list[Request], dict]:
    """Greedy single-sample text requests grouped by method and knobs (each group decodes together); the rest
    run one by one. Greedy only: a served request equals its one-by-one result token for token."""
    alone, groups = [], {}
    for request in pending:
        params = request.params
        if (request.modality == "text" and params.get("num_samples", 1) == 1
                and float(params.get("temperature", 0.0)) == 0.0):
            key = (request.method, json.dumps({k: v for k, v in params.items() if k != "num_samples"}, sort_keys=True))
            groups.setdefault(key, []).append(request)
        else:
            alone.append(request)
    return alone, groups


def _serve_group(generators, group: list[Request], rows: int):
    """(request, record) for every request of a group, in completion order, from `TextGenerator.serve`. Requests
    that cannot run (an empty prompt, a prompt too long for the model) and, if the group fails, those without a
    record yet run one by one, so each gets its own result or error."""
    from specgen.modalities.text.generator import MAX_NEW_TOKENS

    written, served = set(), []
    try:
        generator = generators.get("text") if isinstance(generators, Generators) else generators
        params = {k: v for k, v in group[0].params.items() if k != "num_samples"}  # always 1 here
        for index, request in enumerate(group):
            try:
                generator.check_length(generator.encode(str(request.source)),
                                       params.get("max_new_tokens", MAX_NEW_TOKENS))
                served.append(index)
            except SpecgenError:
                pass  # its own error record, from the one-by-one path below
        prompts = [str(group[i].source) for i in served]
        for index, result in generator.serve(prompts, rows=rows, method=group[0].method, **params):
            request = group[served[index]]
            written.add(served[index])
            yield request, _text_record(request, result)
    except Exception:  # noqa: BLE001 - the one-by-one path below records each item's own outcome
        log.warning("a group of %d text items failed together; running its remaining items one by one",
                    len(group), exc_info=True)
    for index, request in enumerate(group):
        if index not in written:
            yield request, run_item(generators, request)


def _run_ray(pending: list[Request], writer: ResultWriter, summary: Summary, models: dict, workers, progress,
             media_stem: Path) -> None:
    """`models`: the keyword arguments every worker builds its `Generators` from (paths, never loaded models)."""
    import ray

    started_here = not ray.is_initialized()
    ray.init(ignore_reinit_error=True, include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING)
    try:
        _schedule_ray(ray, pending, writer, summary, models, workers, progress, media_stem)
    finally:
        if started_here:
            ray.shutdown()


def _schedule_ray(ray, pending, writer, summary, models: dict, workers, progress, media_stem) -> None:

    @ray.remote(num_cpus=models["threads"])
    class Worker:
        def __init__(self):
            self.generators = Generators(**models)

        def run(self, request):
            return run_item(self.generators, request, media_stem)

    count = max(1, min(workers, len(pending)))
    actors = [Worker.remote() for _ in range(count)]
    queue = list(pending)
    in_flight = {}
    for actor in actors:  # keep every actor busy; results are written in completion order
        if queue:
            request = queue.pop(0)
            in_flight[actor.run.remote(request)] = (actor, request)
    while in_flight:
        ready, _ = ray.wait(list(in_flight), num_returns=1)
        actor, request = in_flight.pop(ready[0])
        try:
            record = ray.get(ready[0])
        except Exception as exc:  # noqa: BLE001 - a lost actor fails its item, not the run
            record = {"id": request.id, "status": "error", "error": f"{type(exc).__name__}: {exc}", "stats": None}
        writer.write(record)
        summary.add(request, record)
        progress.update(1)
        if queue:
            nxt = queue.pop(0)
            in_flight[actor.run.remote(nxt)] = (actor, nxt)


def run_batch(input_path, output_path, *, engine: str = "local", model: str | None = None,
              draft: str | None = None, threads: int = 1, generator=None, workers: int | None = None,
              progress: bool = True, image_generator=None, image_model: str | None = None,
              image_vq: str | None = None, speech_generator=None, speech_paths: tuple = (None, None, None),
              video_generator=None, video_model: str | None = None, online_draft: int | None = None,
              rows: int = 1, memory_budget_mb: float | None = None) -> dict:
    """Validate IN, skip ids already in OUT, run the rest, and return the summary dict. `online_draft`: update
    the text draft from its rejections every that many text items (online speculative decoding). `rows` > 1:
    greedy single-sample text requests with the same method and knobs decode that many at a time by continuous
    batching (`TextGenerator.serve`), with the same tokens as one by one. `memory_budget_mb`: every text item that
    names no budget of its own gets this one (rows and windows cut to fit it, `modalities/memory.py`)."""
    input_path, output_path = Path(input_path), Path(output_path)
    if engine not in ("local", "ray"):
        raise InvalidRequest(f"unknown engine {engine!r}; choose from: local, ray")
    if not _is_int(rows) or rows < 1:
        raise InvalidRequest(f"rows must be an integer >= 1, got {rows!r}")
    if rows > 1 and (engine != "local" or online_draft is not None):
        raise InvalidRequest("--rows serves requests together in this process: use --engine local without "
                             "--online-draft (which learns from one request at a time)")
    if online_draft is not None and engine != "local":
        raise InvalidRequest("--online-draft updates one draft in this process: use --engine local")
    if engine == "ray":
        import importlib.util

        if importlib.util.find_spec("ray") is None:
            raise MissingExtra("--engine ray needs Ray, which is not installed (pip install 'specgen[ray]'); "
                               "or use --engine local")
        if generator is not None:
            raise InvalidRequest("the ray engine loads its models in each worker: pass model paths, not a generator")
        for path in (model, draft):  # workers load the models; a wrong path should fail here, not per item
            if path and os.sep in path and not Path(path).exists():
                raise ModelNotFound(f"model path {path!r} does not exist")
    from specgen.modalities.text.generator import default_method

    default_text = generator.default_method if generator is not None else default_method(model, draft)
    if online_draft is not None:  # the draft learns from the requests it drafts for
        default_text = "draft"
    requests = load_requests(input_path, default_text_method=default_text)
    if memory_budget_mb is not None:
        budget = request_options.fields("text")["memory_budget_mb"].check(memory_budget_mb)
        for request in requests:
            if request.modality == "text":
                request.params.setdefault("memory_budget_mb", budget)
    done = done_ids(output_path)
    pending = [r for r in requests if r.key not in done]
    summary = Summary(items=len(requests), skipped=len(requests) - len(pending))

    generators = Generators(generator, model=model, draft=draft, threads=threads, image=image_generator,
                            image_model=image_model, image_vq=image_vq, speech=speech_generator,
                            speech_paths=speech_paths, video=video_generator, video_model=video_model)
    media_stem = output_path.with_name(output_path.stem)  # OUT-images/ and OUT-audio/ beside OUT.jsonl
    started = time.perf_counter()
    if engine == "local":
        for modality in sorted({r.modality for r in pending}):
            generators.get(modality)  # a model that cannot load fails the run before anything is written
        if online_draft is not None and any(r.modality == "text" for r in pending):
            generators.get("text").learn_online(interval=online_draft)
    summary.load_s = time.perf_counter() - started
    if summary.skipped:
        print(f"batch: {summary.skipped} of {len(requests)} items already in {output_path}, skipping them",
              file=sys.stderr)
    writer = ResultWriter(output_path)
    bar = _progress(len(pending), disable=not progress)
    try:
        if engine == "ray":
            models = dict(model=model, draft=draft, threads=threads, image_model=image_model, image_vq=image_vq,
                          speech_paths=speech_paths, video_model=video_model)
            _run_ray(pending, writer, summary, models, workers or max(1, (os.cpu_count() or 1) // max(threads, 1)),
                     bar, media_stem)
        else:
            _run_local(pending, writer, summary, generators, bar, media_stem, rows)
    finally:
        bar.close()
        writer.close()
    return summary.to_json(time.perf_counter() - started, output_path, engine)


def batch_command(args) -> int:
    """The `specgen batch` handler: the summary table on stderr, `--json` puts the summary on stdout."""
    speech_paths = tuple(getattr(args, f"speech_{part}", None) for part in ("model", "draft", "codec"))
    summary = run_batch(args.input, args.output, engine=args.engine, model=getattr(args, "model", None),
                        draft=getattr(args, "draft", None), threads=args.threads,
                        image_model=getattr(args, "image_model", None), image_vq=getattr(args, "image_vq", None),
                        video_model=getattr(args, "video_model", None),
                        online_draft=getattr(args, "online_draft", None), rows=getattr(args, "rows", 1),
                        speech_paths=speech_paths, memory_budget_mb=getattr(args, "memory_budget", None))
    print(summary_table(summary), file=sys.stderr)
    if getattr(args, "json", False):
        print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    from specgen.app.cli import main

    raise SystemExit(main(["batch", *sys.argv[1:]]))
