"""Every SPECGEN_* setting is declared and read in specgen/settings.py, the torch thread count is set there only,
and `specgen info` shows them."""

from __future__ import annotations

import json
import re
from pathlib import Path

from specgen import settings
from specgen.app.cli import main

ROOT = Path(__file__).resolve().parents[2]
PACKAGE_FOLDERS = ("specgen", "app", "modalities", "samplers", "kernels")


def _sources():
    for folder in PACKAGE_FOLDERS:
        for path in (ROOT / folder).rglob("*.py"):
            if "__pycache__" not in path.parts:
                yield path, path.read_text(encoding="utf-8")


def test_the_environment_is_read_in_the_settings_module_only():
    readers = {path.relative_to(ROOT).as_posix() for path, text in _sources()
               if re.search(r"os\.environ(?!\.setdefault\(\"(GRADIO|HF_))|os\.getenv", text)}
    assert readers == {"specgen/settings.py"}


def test_every_setting_named_in_the_code_is_declared():
    named = {name for _, text in _sources() for name in re.findall(r"\bSPECGEN_[A-Z0-9_]+\b", text)}
    assert named - set(settings.SETTINGS) == set(), "undeclared settings"


def test_the_thread_count_is_set_in_one_place():
    setters = {path.relative_to(ROOT).as_posix() for path, text in _sources() if "set_num_threads(" in text}
    assert setters == {"specgen/settings.py"}


def test_a_setting_is_read_when_used(monkeypatch, tmp_path):
    monkeypatch.delenv("SPECGEN_HOME", raising=False)
    assert settings.snapshot()["SPECGEN_HOME"] == "~/.cache/specgen (default)"
    monkeypatch.setenv("SPECGEN_HOME", f" {tmp_path} ")
    assert settings.path("SPECGEN_HOME", Path("/nowhere")) == tmp_path
    assert settings.snapshot()["SPECGEN_HOME"] == str(tmp_path)
    monkeypatch.setenv("SPECGEN_KERNELS", "torch")
    from specgen import kernels
    from specgen.kernels import dispatch

    monkeypatch.setattr(dispatch, "_backend", None)  # no set_backend call in force (other tests make some)
    assert kernels.backend() == "torch"  # read when an op dispatches, not when the module was imported


def test_info_shows_every_setting(monkeypatch, capsys):
    monkeypatch.setenv("SPECGEN_ESPEAK", "library")
    assert main(["info", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert set(record["settings"]) == set(settings.SETTINGS) and record["settings"]["SPECGEN_ESPEAK"] == "library"
    assert Path(record["assets"]).name == "assets" and record["packages"]["torch"]
    assert main(["info"]) == 0
    assert "SPECGEN_ESPEAK=library" in capsys.readouterr().out
