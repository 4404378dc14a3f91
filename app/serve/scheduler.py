"""The model's side of the server: admission, lanes, and the one decode thread.

A lane is every request that shares a method, its knobs and the sampling settings (they are batch-wide in a
pipeline); each lane is its own continuous batch of `rows` rows, run by `speculative_generate` with a queue that
is empty between arrivals and a `cancelled` hook. One thread steps every busy lane in turn (torch decodes with one
thread), so requests of all clients share the batch of their lane. A choice's randomness is keyed by its sample id,
whose low 32 bits are a hash of (request seed, choice index) and whose high bits only tell requests apart: a
choice's tokens do not depend on its neighbours (docs/serving.md).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Callable

import torch

from specgen.app.serve.metrics import Metrics
from specgen.app.serve.protocol import ApiError, GenerationRequest, sample_key
from specgen.errors import SpecgenError
from specgen.samplers import loop, registry

log = logging.getLogger("specgen.serve")
PLACEHOLDER = -1  # the sample id of a free row at a run's start (cancelled from the start)


@dataclass
class Update:
    """What a choice's client gets next: new text, and at the end why it ended, its usage and its stats."""

    ticket: int
    index: int
    text: str = ""
    finish_reason: str | None = None  # "stop", "length"; "error" with `error` set
    completion_tokens: int = 0
    stats: dict | None = None
    error: tuple | None = None  # an ApiError as a tuple


@dataclass(frozen=True)
class Admitted:
    tickets: tuple[int, ...]
    prompt_tokens: int
    method: str


@dataclass
class Job:
    """One choice of one request, from admission to its last token."""

    ticket: int
    index: int
    sample_id: int
    prompt: torch.Tensor
    max_tokens: int
    stop: tuple[str, ...]
    sink: Callable[[Update], None]
    arrived: float = field(default_factory=time.perf_counter)  # latencies count from here, waiting included
    tokens: list = field(default_factory=list)
    sent: int = 0  # characters of text sent
    steps: int = 0
    drafted: int = 0
    accepted: int = 0
    first_token_at: float | None = None


class Lane:
    """One continuous batch: its method, knobs and sampling, its waiting jobs and its running loop."""

    def __init__(self, scheduler: "Scheduler", method: str, knobs: dict, sampling: dict):
        self.scheduler, self.method, self.knobs, self.sampling = scheduler, method, knobs, sampling
        self.pending: deque[Job] = deque()  # guarded by the scheduler's lock
        self.jobs: dict[int, Job] = {}  # sample id -> admitted job (decode thread only)
        self.run = None
        self.withdrawn: set[int] = set()  # sample ids the lane ended itself (a stop string)
        self.last_step = -1
        self.pipeline = self.build()  # built at admission (on the decode thread): a method this model cannot
        # serve fails there; rebuilt only after a failed step

    def build(self):
        generator = self.scheduler.generator
        return generator.pipeline(self.method, [torch.tensor([0])], max_new_tokens=generator.context_size - 1,
                                  sampling=self.sampling, params=self.knobs, stats=None)

    def start(self) -> None:
        # one pipeline for every run of the lane: a run ends whenever the lane falls idle, and rebuilding costs
        # milliseconds per request; the model drafters re-sync from each row's context, and no drafter state can
        # change an output's law (or a greedy token)
        if self.pipeline is None:
            self.pipeline = self.build()
        pipeline = self.pipeline
        rows = self.scheduler.rows
        self.last_step = -1
        self.run = loop.speculative_generate(
            pipeline.target, pipeline.drafter, pipeline.rule, [torch.tensor([0])] * rows,
            processing=pipeline.processing, max_new_tokens=pipeline.max_new_tokens, policy=pipeline.policy,
            sample_ids=[PLACEHOLDER] * rows, stop_tokens=pipeline.stop_tokens, stats=pipeline.stats,
            queue=self, cancelled=self.cancelled)
        self.stop_tokens = set(pipeline.stop_tokens)

    # the loop's queue: empty between arrivals, asked again whenever a row is free
    def __iter__(self):
        return self

    def __next__(self):
        with self.scheduler.lock:
            while self.pending:
                job = self.pending.popleft()
                if job.ticket not in self.scheduler.cancelled:
                    self.jobs[job.sample_id] = job
                    return job.sample_id, job.prompt, job.max_tokens
                self.scheduler.forget(job, cancelled=True)
        raise StopIteration

    def cancelled(self, sample_id: int) -> bool:
        if sample_id == PLACEHOLDER:
            return True
        if sample_id in self.withdrawn:
            self.withdrawn.discard(sample_id)
            return True
        with self.scheduler.lock:
            job = self.jobs.get(sample_id)
            if job is None or job.ticket not in self.scheduler.cancelled:
                return False
            del self.jobs[sample_id]
            self.scheduler.forget(job, cancelled=True)
        return True

    @property
    def busy(self) -> bool:
        return self.run is not None or bool(self.pending)


class Scheduler:
    def __init__(self, generator, *, rows: int = 8, method: str | None = None, model_name: str = "",
                 ar_step_s: float | None = None):
        self.generator, self.rows = generator, rows
        self.method = method or generator.default_method
        registry.get_method("text", self.method)  # a bad --method fails at start-up
        self.model_name = model_name
        self.metrics = Metrics(ar_step_s)
        self.lock = threading.Condition()
        self.lanes: dict[tuple, Lane] = {}
        self.jobs: dict[int, Job] = {}  # ticket -> every job not yet finished (guarded by lock)
        self.cancelled: set[int] = set()
        # new lanes are built on the decode thread, between steps: building a pipeline sets up runners over the
        # shared model, which must not happen while another lane decodes with it
        self.builds: deque[tuple[tuple, Future]] = deque()
        self.tokenizer_lock = threading.Lock()  # the HTTP thread encodes while the decode thread decodes
        self.closing = False
        self.next_ticket = 1
        self.thread = threading.Thread(target=self._decode_forever, name="specgen-decode", daemon=True)
        self.thread.start()

    # ---- admission (any thread) ----------------------------------------------------------------------------

    def open(self, request: GenerationRequest, sink: Callable[[Update], None]) -> Admitted:
        """Check the request against the model, queue its `n` choices, and return their tickets."""
        if self.closing:
            raise ApiError("the server is shutting down", status=503, type="server_error")
        method, knobs = self._method(request)
        prompt = self._encode(request)
        capacity = self.generator.context_size
        param = "messages" if request.kind == "chat" else "prompt"
        if len(prompt) >= capacity:
            raise ApiError(f"the prompt is {len(prompt)} tokens; the model's context is {capacity} tokens",
                           param=param, code="context_length_exceeded")
        if len(prompt) + request.max_tokens > capacity:
            raise ApiError(f"max_tokens must be at most {capacity - len(prompt)} for this prompt ({len(prompt)} "
                           f"tokens, context {capacity}), got {request.max_tokens}", param="max_tokens",
                           code="context_length_exceeded")
        sampling = {"temperature": request.temperature, "top_p": request.top_p}
        key = (method, tuple(sorted(knobs.items())), request.temperature, request.top_p)
        with self.lock:
            building = None if key in self.lanes else Future()
            if building is not None:
                self.builds.append(((key, method, knobs, sampling), building))
                self.lock.notify_all()
        if building is not None:
            try:
                building.result()
            except SpecgenError as exc:
                raise ApiError(str(exc), param="method") from None
        seed = request.seed if request.seed is not None else random.getrandbits(63)
        with self.lock:
            lane = self.lanes[key]
            tickets = []
            for index in range(request.n):
                ticket, self.next_ticket = self.next_ticket, self.next_ticket + 1
                job = Job(ticket, index, (ticket << 32) | sample_key(seed, index), prompt, request.max_tokens,
                          request.stop, sink)
                self.jobs[ticket] = job
                lane.pending.append(job)
                tickets.append(ticket)
            self.lock.notify_all()
        self.metrics.count("prompt_tokens", len(prompt))  # once per request, as the usage counts it
        return Admitted(tuple(tickets), len(prompt), method)

    def cancel(self, tickets) -> None:
        """Withdraw jobs (a client gone): a waiting one never starts, a running one frees its row next step."""
        with self.lock:
            self.cancelled.update(t for t in tickets if t in self.jobs)
            self.lock.notify_all()

    def forget(self, job: Job, *, cancelled: bool = False) -> None:  # with the lock held
        self.jobs.pop(job.ticket, None)
        self.cancelled.discard(job.ticket)
        if cancelled:  # a last word, so a reader still waiting on this job (a replica's stream) ends too
            self.metrics.count("request_cancelled")
            job.sink(Update(job.ticket, job.index, finish_reason="cancelled", completion_tokens=len(job.tokens)))

    def health(self) -> dict:
        with self.lock:
            running = sum(len(lane.jobs) for lane in self.lanes.values())
            return {"status": "closing" if self.closing else "ok", "model": self.model_name, "method": self.method,
                    "rows": self.rows, "lanes": len(self.lanes), "running": running,
                    "waiting": len(self.jobs) - running}

    def close(self, grace_s: float = 10.0) -> None:
        """Refuse new requests, let running ones finish for up to `grace_s`, cancel the rest, stop the thread."""
        with self.lock:
            self.closing = True
            deadline = time.monotonic() + grace_s
            while self.jobs and time.monotonic() < deadline:
                self.lock.wait(0.05)
            for job in list(self.jobs.values()):
                job.sink(Update(job.ticket, job.index, finish_reason="error", completion_tokens=len(job.tokens),
                                error=ApiError("the server shut down before this request finished", status=503,
                                               type="server_error").to_tuple()))
                self.cancelled.add(job.ticket)
            self.lock.notify_all()
        self.thread.join(timeout=30)

    # ---- the decode thread --------------------------------------------------------------------------------

    def _decode_forever(self) -> None:
        while True:
            with self.lock:
                while not self.builds and not any(lane.busy for lane in self.lanes.values()):
                    if self.closing and not self.jobs:
                        return
                    self.lock.wait(0.5)
                builds, self.builds = list(self.builds), deque()
            for (key, *parts), done in builds:
                self._build(key, parts, done)
            with self.lock:
                lanes = [lane for lane in self.lanes.values() if lane.busy]
            for lane in lanes:  # one event of each busy lane in turn: a step when its previous one is drained
                self._advance(lane)
            if self.closing and not self.jobs:
                return

    def _build(self, key: tuple, parts: list, done: Future) -> None:
        if key in self.lanes:  # asked for twice before the first build
            done.set_result(self.lanes[key])
            return
        try:
            lane = Lane(self, *parts)
        except Exception as exc:  # a SpecgenError is the client's; anything else is logged by the front
            done.set_exception(exc)
            return
        with self.lock:
            self.lanes[key] = lane
        done.set_result(lane)

    def _advance(self, lane: Lane) -> None:
        try:
            if lane.run is None:
                lane.start()
            event = next(lane.run)
        except StopIteration:
            lane.run = None
            return
        except Exception as exc:  # never let one lane's failure stop the server: fail its jobs and go on
            log.exception("a decoding step failed")
            self._fail_lane(lane, exc)
            return
        self._on_event(lane, event)

    def _on_event(self, lane: Lane, event) -> None:
        if event.step != lane.last_step:
            lane.last_step = event.step
            self.metrics.step(lane.method, event.draft_s, event.verify_s)
        job = lane.jobs.get(event.sample)
        if job is None:
            return
        self.metrics.row_step(lane.method, event.num_drafted, event.num_accepted, len(event.tokens))
        job.tokens.extend(event.tokens)
        job.steps += 1
        job.drafted += event.num_drafted
        job.accepted += event.num_accepted
        if job.first_token_at is None and event.tokens:
            job.first_token_at = time.perf_counter()
        with self.tokenizer_lock:
            text = self.generator.tokenizer.decode(job.tokens, skip_special_tokens=True)
        finish, cut = None, _first_stop(text, job.stop, job.sent)
        if cut is not None:
            text, finish = text[:cut], "stop"
        elif event.finished:
            finish = "stop" if job.tokens and job.tokens[-1] in lane.stop_tokens else "length"
        upto = len(text) if finish else _safe_end(text, job.sent, job.stop)
        update = Update(job.ticket, job.index, text[job.sent:upto], finish, len(job.tokens))
        job.sent = max(job.sent, upto)
        if finish:
            update.stats = {"method": lane.method, "steps": job.steps, "drafted": job.drafted,
                            "accepted": job.accepted, "tau": len(job.tokens) / max(job.steps, 1)}
            self._finish(lane, job, event, finish)
        if update.text or finish:
            job.sink(update)

    def _finish(self, lane: Lane, job: Job, event, reason: str) -> None:
        lane.jobs.pop(job.sample_id, None)
        if not event.finished:  # ended by a stop string: the loop still runs the row until told
            lane.withdrawn.add(job.sample_id)
        now = time.perf_counter()
        count = len(job.tokens)
        self.metrics.count("request_success", finished_reason=reason)
        self.metrics.count("generation_tokens", count)
        self.metrics.observe("e2e_request_latency_seconds", now - job.arrived)
        if job.first_token_at is not None:
            self.metrics.observe("time_to_first_token_seconds", job.first_token_at - job.arrived)
            if count > 1:
                self.metrics.observe("time_per_output_token_seconds", (now - job.first_token_at) / (count - 1))
        with self.lock:
            self.forget(job)
            self.lock.notify_all()

    def _fail_lane(self, lane: Lane, exc: Exception) -> None:
        error = ApiError(f"decoding failed: {' '.join(str(exc).split()) or type(exc).__name__}", status=500,
                         type="server_error").to_tuple()
        with self.lock:
            jobs = list(lane.jobs.values()) + list(lane.pending)
            lane.jobs.clear()
            lane.pending.clear()
            lane.run, lane.pipeline = None, None
            for job in jobs:
                self.forget(job)
            self.lock.notify_all()
        for job in jobs:
            job.sink(Update(job.ticket, job.index, finish_reason="error", completion_tokens=len(job.tokens),
                            error=error))

    # ---- request checks ----------------------------------------------------------------------------------

    def _method(self, request: GenerationRequest) -> tuple[str, dict]:
        name = request.method or self.method
        try:
            spec = registry.get_method("text", name)
        except SpecgenError as exc:
            raise ApiError(str(exc), param="method", code="method_not_found") from None
        try:
            return spec.name, self.generator.resolve_knobs(spec, request.method_params)
        except SpecgenError as exc:
            raise ApiError(str(exc), param="method_params") from None

    def _encode(self, request: GenerationRequest) -> torch.Tensor:
        tokenizer = self.generator.tokenizer
        with self.tokenizer_lock:
            if request.kind == "chat":
                messages = [{"role": role, "content": content} for role, content in request.messages]
                if getattr(tokenizer, "chat_template", None):
                    try:
                        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
                    except Exception as exc:  # the template's own checks (roles, alternation)
                        raise ApiError(f"the chat template refused the messages: {exc}", param="messages") from None
                    ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
                    return torch.tensor(list(ids), dtype=torch.long)
                prompt = plain_chat_prompt(request.messages)
            else:
                prompt = request.prompt
            return torch.tensor(tokenizer(prompt)["input_ids"], dtype=torch.long)


def plain_chat_prompt(messages) -> str:
    """The prompt of a chat for a model without a chat template: one `role: content` line per message, then the
    assistant's turn."""
    return "".join(f"{role}: {content}\n" for role, content in messages) + "assistant:"


def _first_stop(text: str, stops: tuple[str, ...], sent: int) -> int | None:
    """Where the earliest stop string starts in `text` (None: none yet); text already sent holds none."""
    if not stops:
        return None
    start = max(0, sent - max(len(s) for s in stops) + 1)
    found = [i for i in (text.find(s, start) for s in stops) if i >= 0]
    return min(found) if found else None


def _safe_end(text: str, sent: int, stops: tuple[str, ...]) -> int:
    """How much of an unfinished text may be sent: not an incomplete character (U+FFFD at the end), nor a tail that
    could still become a stop string."""
    end = len(text.rstrip("\ufffd"))
    if stops:
        end = min(end, len(text) - max(len(s) for s in stops) + 1)
    return max(sent, end)
