"""Benchmark prompts: JSON Lines files under benchmarks/prompts/, read with one set of checks whose errors name the
file and line (an InvalidRequest before any model loads)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from specgen.app.jsonl import read_objects
from specgen.errors import InvalidRequest


@dataclass(frozen=True)
class Prompt:
    id: str
    category: str
    prompt: str


def load_prompts(path: Path, classes: bool = False) -> list[Prompt]:
    """JSON Lines of {"id", "category", "prompt"} (with classes=True, "class" may stand for "prompt", as for
    class-conditional image models); any problem is an InvalidRequest naming the line."""

    def text_key(item: dict) -> str:
        return "class" if classes and "prompt" not in item and "class" in item else "prompt"

    def check(where: str, item: dict) -> None:
        if not isinstance(item.get("category", ""), str):
            raise InvalidRequest(f"{where}: 'category' must be a string")

    return _read(path, text_key, check,
                 lambda item: Prompt(item["id"], item.get("category", "") or "-", item[text_key(item)]))


def load_speech_prompts(path: Path) -> list[dict]:
    """JSON Lines of {"id", "text"} (optional "voice"); any problem is an InvalidRequest naming the line. Dicts,
    since the bench fills in the default voice."""

    def check(where: str, item: dict) -> None:
        if "voice" in item and not isinstance(item["voice"], str):
            raise InvalidRequest(f"{where}: 'voice' must be a string")

    return _read(path, lambda item: "text", check,
                 lambda item: {"id": item["id"], "text": item["text"], "voice": item.get("voice")})


def _read(path: Path, text_key: Callable[[dict], str], check: Callable[[str, dict], None], make: Callable) -> list:
    """Every line's "id" and text field (`text_key(item)`) are non-empty strings, `check` passes and the ids are
    unique; an empty file is an error too."""
    prompts, seen = [], set()
    for number, item in read_objects(path, "prompts file"):
        where = f"{path} line {number}"
        for key in ("id", text_key(item)):
            if not isinstance(item.get(key), str) or not item[key].strip():
                raise InvalidRequest(f"{where}: {key!r} must be a non-empty string")
        check(where, item)
        if item["id"] in seen:
            raise InvalidRequest(f"{where}: id {item['id']!r} is used twice")
        seen.add(item["id"])
        prompts.append(make(item))
    if not prompts:
        raise InvalidRequest(f"prompts file {path} holds no prompts")
    return prompts
