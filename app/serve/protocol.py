"""Request bodies of `/v1/completions` and `/v1/chat/completions`, checked field by field, and the error shape of
the OpenAI API. Standard library only: the front checks a body before any model is asked."""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field

MAX_N = 16  # choices per request: each takes a batch row
MAX_STOP = 4  # stop strings per request, as the OpenAI API allows
MAX_SEED = 2**63 - 1
DEFAULT_MAX_TOKENS = {"completion": 16, "chat": 128}  # the OpenAI API's completion default; chat: specgen's


class ApiError(Exception):
    """An error the client gets as `{"error": {"message", "type", "param", "code"}}` with HTTP `status`."""

    def __init__(self, message: str, *, param: str | None = None, status: int = 400,
                 type: str = "invalid_request_error", code: str | None = None):
        super().__init__(message)
        self.message, self.param, self.status, self.type, self.code = message, param, status, type, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def to_tuple(self) -> tuple:  # crosses a process boundary as plain data
        return (self.message, self.param, self.status, self.type, self.code)

    @classmethod
    def from_tuple(cls, values: tuple) -> "ApiError":
        message, param, status, type_, code = values
        return cls(message, param=param, status=status, type=type_, code=code)


@dataclass(frozen=True)
class GenerationRequest:
    """One checked request: a prompt (or chat messages) and how to continue it, `n` times."""

    kind: str  # "completion" or "chat"
    model: str | None
    prompt: str | None  # completion
    messages: tuple[tuple[str, str], ...] | None  # chat: (role, content)
    n: int = 1
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stream: bool = False
    include_usage: bool = False
    method: str | None = None  # None: the server's method
    method_params: dict = field(default_factory=dict)  # the method's knobs


def sample_key(seed: int, index: int) -> int:
    """The 32-bit key a choice's randomness is drawn under: a hash of (request seed, choice index), so equal seeds
    give equal choices and the batch around a request never enters."""
    digest = hashlib.blake2b(f"{seed}:{index}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little")


def parse(body: object, kind: str, header_method: str | None = None) -> GenerationRequest:
    if not isinstance(body, dict):
        raise ApiError("the request body must be a JSON object")
    get = _Fields(body)
    if kind == "chat":
        prompt, messages = None, _messages(body.get("messages"))
        max_tokens = get.integer("max_completion_tokens", None, 1) or get.integer("max_tokens", None, 1)
    else:
        prompt, messages = _prompt(body.get("prompt")), None
        max_tokens = get.integer("max_tokens", None, 1)
    for name in ("presence_penalty", "frequency_penalty"):
        if get.number(name, 0.0, -2.0, 2.0) != 0.0:
            raise ApiError(f"{name} is not supported (only 0)", param=name)
    if body.get("logprobs") not in (None, False, 0) or body.get("top_logprobs") not in (None, 0):
        raise ApiError("logprobs are not supported: committed tokens carry no probabilities", param="logprobs")
    if body.get("echo") not in (None, False):
        raise ApiError("echo is not supported", param="echo")
    if body.get("best_of") not in (None, 1, body.get("n", 1)):
        raise ApiError("best_of is not supported", param="best_of")
    method = body.get("method", None)
    if header_method is not None:
        if method is not None and method != header_method:
            raise ApiError(f"the X-Specgen-Method header says {header_method!r} and the body says {method!r}",
                           param="method")
        method = header_method
    if method is not None and (not isinstance(method, str) or not method):
        raise ApiError("method must be a method name", param="method")
    params = body.get("method_params", {}) or {}
    if not isinstance(params, dict):
        raise ApiError("method_params must be an object of the method's knobs", param="method_params")
    options = body.get("stream_options") or {}
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise ApiError("model must be a string", param="model")
    return GenerationRequest(
        kind=kind, model=model, prompt=prompt, messages=messages,
        n=get.integer("n", 1, 1, MAX_N), max_tokens=max_tokens or DEFAULT_MAX_TOKENS[kind],
        temperature=get.number("temperature", 1.0, 0.0, 2.0), top_p=get.number("top_p", 1.0, 0.0, 1.0, open_low=True),
        seed=get.integer("seed", None, 0, MAX_SEED), stop=_stop(body.get("stop")), stream=get.boolean("stream"),
        include_usage=bool(isinstance(options, dict) and options.get("include_usage")),
        method=method, method_params=dict(params))


class _Fields:
    """Typed reads of optional fields; a bad value is an ApiError naming its field."""

    def __init__(self, body: dict):
        self.body = body

    def integer(self, name: str, default, low: int, high: int | None = None):
        value = self.body.get(name)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            raise ApiError(f"{name} must be an integer, got {value!r}", param=name)
        if value < low or (high is not None and value > high):
            bound = f"between {low} and {high}" if high is not None else f">= {low}"
            raise ApiError(f"{name} must be {bound}, got {value}", param=name)
        return value

    def number(self, name: str, default: float, low: float, high: float, open_low: bool = False) -> float:
        value = self.body.get(name)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ApiError(f"{name} must be a number, got {value!r}", param=name)
        if value > high or value < low or (open_low and value == low):
            bound = f"in ({low}, {high}]" if open_low else f"between {low} and {high}"
            raise ApiError(f"{name} must be {bound}, got {value}", param=name)
        return float(value)

    def boolean(self, name: str) -> bool:
        value = self.body.get(name, False)
        if value is None:
            return False
        if not isinstance(value, bool):
            raise ApiError(f"{name} must be true or false, got {value!r}", param=name)
        return value


def _prompt(value: object) -> str:
    if isinstance(value, list) and len(value) == 1:  # a one-element batch, as clients often send
        value = value[0]
    if isinstance(value, list):
        raise ApiError("send one prompt per request (a list of prompts is not supported)", param="prompt")
    if not isinstance(value, str) or not value:
        raise ApiError("prompt must be a non-empty string", param="prompt")
    return value


def _messages(value: object) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, list) or not value:
        raise ApiError("messages must be a non-empty list", param="messages")
    out = []
    for i, message in enumerate(value):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise ApiError(f"messages[{i}] must be an object with a role and content", param="messages")
        content = message.get("content")
        if isinstance(content, list):  # content parts: only text parts carry anything a text model can read
            if any(not isinstance(p, dict) or p.get("type") != "text" for p in content):
                raise ApiError(f"messages[{i}]: only text content parts are supported", param="messages")
            content = "".join(str(p.get("text", "")) for p in content)
        if not isinstance(content, str):
            raise ApiError(f"messages[{i}].content must be a string", param="messages")
        out.append((message["role"], content))
    return tuple(out)


def _stop(value: object) -> tuple[str, ...]:
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops) or len(stops) > MAX_STOP:
        raise ApiError(f"stop must be a non-empty string or a list of at most {MAX_STOP} of them", param="stop")
    return tuple(stops)
