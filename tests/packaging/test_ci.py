"""CI runs exactly the README's test command, offline, under a time limit, and fails when pytest fails or
collects nothing."""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TEST_COMMAND = "python -m pip install -e '.[test]' && python -m pytest"
MAIN_COMMAND = "python -m pip install -e . && specgen selfcheck"
CI_SCRIPT = ROOT / ".ci" / "run"


def _fenced_lines(markdown: str) -> list[str]:
    blocks = re.findall(r"^```[^\n]*\n(.*?)^```", markdown, flags=re.S | re.M)
    return [line.strip() for block in blocks for line in block.splitlines()]


def test_readme_gives_the_commands_in_fenced_blocks():
    lines = _fenced_lines((ROOT / "README.md").read_text(encoding="utf-8"))
    assert TEST_COMMAND in lines
    assert MAIN_COMMAND in lines


def test_ci_script_runs_the_readme_command():
    text = CI_SCRIPT.read_text()
    assert CI_SCRIPT.stat().st_mode & stat.S_IXUSR, ".ci/run must be executable"
    assert text.startswith("#!/usr/bin/env bash\n") and "set -euo pipefail" in text
    assert re.findall(r'^TEST_COMMAND="(.*)"$', text, flags=re.M) == [TEST_COMMAND]
    assert re.search(r'^timeout .*"\$LIMIT_S" bash -c "\$TEST_COMMAND"', text, flags=re.M)
    assert re.findall(r"^LIMIT_S=(\d+)$", text, flags=re.M) == ["1080"]  # 18 minutes


FAKE_PYTHON = """#!/usr/bin/env bash
echo "$PWD|$*|$CI|$HF_HUB_OFFLINE|$GRADIO_ANALYTICS_ENABLED|$TOKENIZERS_PARALLELISM" >> "$FAKE_LOG"
if [ "$1 $2" = "-m pytest" ]; then exit "$FAKE_PYTEST_RC"; fi
exit "$FAKE_PIP_RC"
"""


@pytest.fixture
def fake_repo(tmp_path):
    """A copy of .ci/run in a bare repo whose `python` only records how it was called."""
    (tmp_path / "repo" / ".ci").mkdir(parents=True)
    shutil.copy2(CI_SCRIPT, tmp_path / "repo" / ".ci" / "run")
    (tmp_path / "bin").mkdir()
    python = tmp_path / "bin" / "python"
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)

    def run_ci(pytest_rc=0, pip_rc=0):
        log = tmp_path / "log"
        log.unlink(missing_ok=True)
        env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "FAKE_LOG": str(log),
               "FAKE_PYTEST_RC": str(pytest_rc), "FAKE_PIP_RC": str(pip_rc)}
        for name in ("CI", "HF_HUB_OFFLINE", "GRADIO_ANALYTICS_ENABLED", "TOKENIZERS_PARALLELISM"):
            env.pop(name, None)
        proc = subprocess.run([str(tmp_path / "repo" / ".ci" / "run")], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=60)
        calls = log.read_text().splitlines() if log.exists() else []
        return proc, calls

    return tmp_path / "repo", run_ci


def test_ci_runs_install_then_pytest_offline_from_the_repo_root(fake_repo):
    repo, run_ci = fake_repo
    proc, calls = run_ci()
    assert proc.returncode == 0, proc.stderr
    offline = "true|1|False|false"
    assert calls == [f"{repo}|-m pip install -e .[test]|{offline}", f"{repo}|-m pytest|{offline}"]
    assert re.search(r"finished in \d+ s", proc.stderr)


@pytest.mark.parametrize("pytest_rc", [1, 2, 5])
def test_ci_fails_when_pytest_fails_or_collects_nothing(fake_repo, pytest_rc):
    _, run_ci = fake_repo
    proc, _ = run_ci(pytest_rc=pytest_rc)
    assert proc.returncode != 0


def test_ci_stops_when_the_install_fails(fake_repo):
    _, run_ci = fake_repo
    proc, calls = run_ci(pip_rc=1)
    assert proc.returncode != 0
    assert len(calls) == 1  # pytest never ran
