"""The FastAPI front: the OpenAI routes, server-sent events, the API key, errors in the OpenAI shape, `/metrics`
and `/health`. It talks to a backend: `LocalBackend` (one scheduler in this process) or `replicas.RayBackend`
(several, on Ray actors). Both hand out a choice's updates as an async iterator and take cancellations."""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time
import uuid
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.exceptions import HTTPException

from specgen.app.serve import metrics as metrics_module
from specgen.app.serve.protocol import ApiError, GenerationRequest, parse

log = logging.getLogger("specgen.serve")
METHOD_HEADER = "x-specgen-method"


class LocalBackend:
    """One scheduler in this process; its decode thread hands updates to the event loop."""

    def __init__(self, scheduler, grace_s: float = 10.0):
        self.scheduler, self.grace_s = scheduler, grace_s
        self.model_name = scheduler.model_name

    async def open(self, request: GenerationRequest):
        loop, queue = asyncio.get_running_loop(), asyncio.Queue()

        def sink(update) -> None:
            try:
                loop.call_soon_threadsafe(queue.put_nowait, update)
            except RuntimeError:  # the event loop is gone (shutting down): nobody is listening
                pass

        admitted = await asyncio.to_thread(self.scheduler.open, request, sink)  # a new lane builds its pipeline

        async def updates():
            while True:
                yield await queue.get()
        return admitted, updates()

    def cancel(self, tickets) -> None:
        self.scheduler.cancel(tickets)

    async def snapshots(self) -> list[dict]:
        return [self.scheduler.metrics.snapshot()]

    async def health(self) -> list[dict]:
        return [self.scheduler.health()]

    def drain(self) -> None:
        """Refuse new requests, give running ones the grace period, then end the rest with an error."""
        self.scheduler.close(self.grace_s)

    async def close(self) -> None:
        await asyncio.to_thread(self.scheduler.close, self.grace_s)


def create_app(backend, *, api_key: str | None = None) -> FastAPI:
    @asynccontextmanager
    async def lifespan(_app):
        yield
        await backend.close()  # uvicorn has let in-flight responses finish (or cancelled them) by now

    app = FastAPI(title="specgen", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.backend = backend

    @app.exception_handler(ApiError)
    async def _api_error(_request, exc: ApiError):
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(HTTPException)
    async def _http_error(_request, exc: HTTPException):
        return JSONResponse(ApiError(str(exc.detail), status=exc.status_code).body(), status_code=exc.status_code)

    @app.exception_handler(Exception)
    async def _internal(_request, exc: Exception):  # logged here, never sent: a response holds no traceback
        log.exception("request failed")
        return JSONResponse(ApiError("internal server error", status=500, type="server_error").body(), status_code=500)

    def check_key(http: Request) -> None:
        if api_key is None:
            return
        given = http.headers.get("authorization", "")
        if not secrets.compare_digest(given.encode(), f"Bearer {api_key}".encode()):
            raise ApiError("incorrect API key provided", status=401, code="invalid_api_key")

    async def read(http: Request, kind: str) -> GenerationRequest:
        check_key(http)
        try:
            body = json.loads(await http.body() or b"null")
        except (ValueError, UnicodeDecodeError):
            raise ApiError("the request body is not valid JSON") from None
        request = parse(body, kind, http.headers.get(METHOD_HEADER))
        if request.model is not None and request.model != backend.model_name:
            raise ApiError(f"the model {request.model!r} does not exist; this server serves {backend.model_name!r}",
                           param="model", code="model_not_found")
        return request

    @app.get("/health")
    async def health():
        replicas = await backend.health()
        ok = all(r["status"] == "ok" for r in replicas)
        return JSONResponse({"status": "ok" if ok else "unavailable", "replicas": replicas},
                            status_code=200 if ok else 503)

    @app.get("/metrics")
    async def metrics():
        snapshot = metrics_module.merge(await backend.snapshots())
        return PlainTextResponse(metrics_module.render(snapshot), media_type="text/plain; version=0.0.4")

    @app.get("/v1/models")
    async def models(http: Request):
        check_key(http)
        return {"object": "list", "data": [{"id": backend.model_name, "object": "model", "created": STARTED,
                                            "owned_by": "specgen"}]}

    @app.post("/v1/completions")
    async def completions(http: Request):
        return await respond(http, await read(http, "completion"))

    @app.post("/v1/chat/completions")
    async def chat(http: Request):
        return await respond(http, await read(http, "chat"))

    async def respond(http: Request, request: GenerationRequest):
        try:
            admitted, updates = await backend.open(request)
        except ApiError:
            raise
        except Exception:  # a bug, logged here once; the client gets the OpenAI shape without a traceback
            log.exception("admitting a request failed")
            raise ApiError("internal server error", status=500, type="server_error") from None
        reply = Reply(request, admitted, backend.model_name)
        if request.stream:
            return StreamingResponse(stream_events(http, reply, updates), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        try:
            async for update in watch(http, updates, admitted.tickets):
                if update.error:
                    raise ApiError.from_tuple(update.error)
                reply.add(update)
                if reply.done:
                    return reply.whole()
        finally:
            if not reply.done:
                backend.cancel(admitted.tickets)
        raise ApiError("the client went away", status=499)

    async def stream_events(http: Request, reply: "Reply", updates):
        try:
            async for update in watch(http, updates, reply.admitted.tickets):
                if update.error:
                    yield _event(ApiError.from_tuple(update.error).body())
                    return
                chunk = reply.add(update)
                if chunk is not None:
                    yield _event(chunk)
                if reply.done:
                    if reply.request.include_usage:
                        yield _event(reply.usage_chunk())
                    yield "data: [DONE]\n\n"
                    return
        finally:  # a client gone mid-stream (the response is cancelled) frees its rows
            if not reply.done:
                backend.cancel(reply.admitted.tickets)

    async def watch(http: Request, updates, tickets):
        """Updates until every choice ended; stops early when the client disconnects."""
        pending = asyncio.ensure_future(anext(updates))
        try:
            while True:
                done, _ = await asyncio.wait({pending}, timeout=1.0)
                if not done:
                    if await http.is_disconnected():
                        return
                    continue
                update = pending.result()
                if update.finish_reason == "cancelled":
                    continue
                yield update
                pending = asyncio.ensure_future(anext(updates))
        finally:
            pending.cancel()

    return app


STARTED = int(time.time())


def _event(payload: dict) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


class Reply:
    """A request's choices as they arrive, shaped as completions or chat completions (whole or as chunks)."""

    def __init__(self, request: GenerationRequest, admitted, model: str):
        self.request, self.admitted, self.model = request, admitted, model
        chat = request.kind == "chat"
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        self.object = "chat.completion" if chat else "text_completion"
        self.created = int(time.time())
        self.index = {ticket: i for i, ticket in enumerate(admitted.tickets)}
        self.texts = [""] * len(admitted.tickets)
        self.finish: list[str | None] = [None] * len(admitted.tickets)
        self.tokens = [0] * len(admitted.tickets)
        self.stats: list[dict | None] = [None] * len(admitted.tickets)
        self.started = [False] * len(admitted.tickets)

    @property
    def done(self) -> bool:
        return all(self.finish)

    def add(self, update) -> dict | None:
        """Record an update; returns its stream chunk (None when it carries nothing)."""
        i = self.index[update.ticket]
        self.texts[i] += update.text
        self.tokens[i] = update.completion_tokens
        if update.finish_reason:
            self.finish[i], self.stats[i] = update.finish_reason, update.stats
        if self.request.kind == "chat":
            delta = {} if self.started[i] else {"role": "assistant"}
            if update.text:
                delta["content"] = update.text
            choice = {"index": i, "delta": delta, "logprobs": None, "finish_reason": update.finish_reason}
        else:
            choice = {"index": i, "text": update.text, "logprobs": None, "finish_reason": update.finish_reason}
        self.started[i] = True
        return {"id": self.id, "object": self.object + ("" if self.request.kind != "chat" else ".chunk"),
                "created": self.created, "model": self.model, "choices": [choice]}

    def usage(self) -> dict:
        completion = sum(self.tokens)
        prompt = self.admitted.prompt_tokens
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    def usage_chunk(self) -> dict:
        return {"id": self.id, "object": self.object + (".chunk" if self.request.kind == "chat" else ""),
                "created": self.created, "model": self.model, "choices": [], "usage": self.usage()}

    def whole(self) -> dict:
        if self.request.kind == "chat":
            choices = [{"index": i, "message": {"role": "assistant", "content": text}, "logprobs": None,
                        "finish_reason": reason} for i, (text, reason) in enumerate(zip(self.texts, self.finish))]
        else:
            choices = [{"index": i, "text": text, "logprobs": None, "finish_reason": reason}
                       for i, (text, reason) in enumerate(zip(self.texts, self.finish))]
        return {"id": self.id, "object": self.object, "created": self.created, "model": self.model,
                "choices": choices, "usage": self.usage(),
                "specgen": {"method": self.admitted.method, "choices": self.stats}}
