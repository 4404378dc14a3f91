"""A regular install carries what the defaults need: the wheel built from this checkout holds the shipped models,
and installed away from the checkout it generates text, an image and speech from another folder.

The wheel is built offline (`--no-build-isolation`, setuptools from the test extra) from a copy of the tracked
sources, so a stale build/ folder cannot leak into it, and installed without dependencies into a folder of its own
(the test environment already holds them). `.ci/run` repeats this with a new virtual environment.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("pyproject.toml", "README.md", "specgen", "app", "modalities", "samplers", "kernels", "assets")

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """site folder: the wheel built from a copy of the checkout, installed there with `pip install --target`."""
    work = tmp_path_factory.mktemp("wheel")
    source = work / "source"
    source.mkdir()
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(ROOT / name, source / name)
    pip = [sys.executable, "-m", "pip"]
    subprocess.run([*pip, "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(work / "dist"),
                    str(source)], check=True, capture_output=True, timeout=600)
    wheel = next((work / "dist").glob("specgen-*.whl"))
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    manifest = json.loads((ROOT / "assets" / "MANIFEST.json").read_text())
    missing = [e["path"] for e in manifest["files"] if f"specgen/assets/{e['path']}" not in names]
    assert not missing, f"the wheel lacks shipped files: {missing[:5]}"
    kernel_sources = {f"specgen/kernels/csrc/{p.name}" for p in (ROOT / "kernels" / "csrc").iterdir()}
    assert kernel_sources and kernel_sources <= names, "the wheel lacks the C++ kernel sources"
    assert not any(n.startswith(("kernels/", "app/", "tests/")) for n in names)  # one `specgen` namespace only
    site = work / "site"
    subprocess.run([*pip, "install", "-q", "--no-deps", "--target", str(site), str(wheel)], check=True,
                   capture_output=True, timeout=600)
    return site


def _specgen(site: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    # the installed package first on the path; the checkout is nowhere on it (the editable install's finder comes
    # after every path entry, so it never answers for `specgen` here)
    env = {**os.environ, "PYTHONPATH": str(site), "HF_HUB_OFFLINE": "1", "SPECGEN_HOME": str(cwd / "home")}
    env.pop("SPECGEN_ASSETS", None)
    return subprocess.run([sys.executable, "-m", "specgen", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)


def test_the_installed_wheel_finds_its_own_models(installed, tmp_path):
    code = ("import specgen.modalities.assets as a, specgen.kernels as k; "
            "print(a.assets_dir()); print(k.__file__)")
    env = {**os.environ, "PYTHONPATH": str(installed)}
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                         check=True).stdout.split()
    assert Path(out[0]) == installed / "specgen" / "assets" and Path(out[1]).is_relative_to(installed)


@pytest.mark.skipif(os.environ.get("SPECGEN_WHEEL_GENERATES_IN_CI") == "1",
                    reason=".ci/run's step 2 generates with the installed wheel in a new environment")
def test_the_installed_wheel_generates_text_an_image_and_speech(installed, tmp_path):
    code = installed / "specgen" / "assets" / "code"
    text = _specgen(installed, tmp_path, "generate", "text", "--prompt", "def add(a, b):", "--max-new-tokens", "12",
                    "--model", str(code / "target"), "--draft", str(code / "draft"), "--json")
    assert text.returncode == 0, text.stderr
    assert json.loads(text.stdout)["stats"]["committed"] == 12

    image = _specgen(installed, tmp_path, "generate", "image", "--prompt", "red K on blue", "--out", "k.png")
    assert image.returncode == 0, image.stderr
    from PIL import Image

    with Image.open(tmp_path / "k.png") as png:
        assert png.size[0] >= 64

    speech = _specgen(installed, tmp_path, "generate", "speech", "--text", "Hello there.", "--out", "hello.wav")
    assert speech.returncode == 0, speech.stderr
    import soundfile

    audio, rate = soundfile.read(tmp_path / "hello.wav")
    assert len(audio) > rate // 4 and abs(audio).max() > 0.01
