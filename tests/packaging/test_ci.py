"""CI runs the README's test command, offline, under a time limit, in fresh environments (the locked versions, then
today's), and fails when pytest fails or collects nothing."""

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
MAIN_COMMAND = "python -m pip install -e '.[gemma]' && specgen generate text --compare"
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
    assert re.search(r'^\s*timeout .*"\$LIMIT_S" bash -c "\$TEST_COMMAND"', text, flags=re.M)
    assert re.findall(r"^LIMIT_S=(\d+)$", text, flags=re.M) == ["1500"]  # 25 minutes


FAKE_PYTHON = """#!/usr/bin/env bash
echo "$PWD|$*|$CI|$HF_HUB_OFFLINE|$GRADIO_ANALYTICS_ENABLED|$TOKENIZERS_PARALLELISM" >> "$FAKE_LOG"
case "$1 $2 $3" in
  "-m venv "*) mkdir -p "$3/bin" && cp "$0" "$3/bin/python" && printf '#!/usr/bin/env bash\\nexit 0\\n' > "$3/bin/specgen"
               chmod +x "$3/bin/specgen"; exit 0 ;;
  "-m pip freeze") echo "torch==2.11.0"; if [ -n "$FAKE_LATEST" ] && [[ "$0" == *latest* ]]; then echo "new==2"; fi; exit 0 ;;
  "-m pytest "*) exit "$FAKE_PYTEST_RC" ;;
  "- "*) cat >/dev/null; exit 0 ;;
esac
if [ "$1 $2 $3" = "-m pip install" ] && [ "$4" != "--upgrade" ]; then exit "$FAKE_PIP_RC"; fi
exit 0
"""


@pytest.fixture
def fake_repo(tmp_path):
    """A copy of .ci/run in a bare repo whose base `python` (and the environments it makes) only record calls."""
    (tmp_path / "repo" / ".ci").mkdir(parents=True)
    shutil.copy2(CI_SCRIPT, tmp_path / "repo" / ".ci" / "run")
    (tmp_path / "bin").mkdir()
    python = tmp_path / "bin" / "python"
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)

    def run_ci(pytest_rc=0, pip_rc=0, latest_differs=False):
        log = tmp_path / "log"
        log.unlink(missing_ok=True)
        env = {**os.environ, "SPECGEN_CI_PYTHON": str(python), "FAKE_LOG": str(log),
               "FAKE_PYTEST_RC": str(pytest_rc), "FAKE_PIP_RC": str(pip_rc), "FAKE_LATEST": "1" if latest_differs else "",
               "SPECGEN_APT_TRIED": "1"}
        for name in ("CI", "HF_HUB_OFFLINE", "GRADIO_ANALYTICS_ENABLED", "TOKENIZERS_PARALLELISM", "VIRTUAL_ENV"):
            env.pop(name, None)
        proc = subprocess.run([str(tmp_path / "repo" / ".ci" / "run")], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=60)
        calls = log.read_text().splitlines() if log.exists() else []
        return proc, calls

    return tmp_path / "repo", run_ci


def _installs_and_tests(calls: list[str]) -> list[str]:
    return [c.split("|")[1] for c in calls if "-m pytest" in c or ("-m pip install" in c and "--upgrade" not in c)]


def test_ci_tests_the_locked_set_then_the_readme_command_offline_from_the_repo_root(fake_repo):
    repo, run_ci = fake_repo
    proc, calls = run_ci()
    assert proc.returncode == 0, proc.stderr
    offline = "true|1|False|false"
    assert all(c.endswith(offline) for c in calls)
    assert _installs_and_tests(calls) == [
        "-m pip install -c constraints.txt -e .[test]",  # 1. the locked set ...
        "-m pip install -e .[test]", "-m pytest",        # ... then the README's test command in it
        "-m pip install -c constraints.txt " + next(c.split("|")[1].split()[-1] for c in calls if ".whl" in c),
        "-m pip install -e .[test]"]                     # 3. the README's install as written, unpinned
    assert all(c.startswith(f"{repo}|") for c in calls if "-m pytest" in c)
    assert "pip resolves exactly the locked versions" in proc.stderr and "passed" in proc.stderr
    assert re.search(r"finished in \d+ s", proc.stderr)


def test_ci_runs_the_suite_again_when_today_resolves_other_versions(fake_repo):
    _, run_ci = fake_repo
    proc, calls = run_ci(latest_differs=True)
    assert proc.returncode == 0, proc.stderr
    assert sum("-m pytest" in c for c in calls) == 2
    assert "latest: new==2" in proc.stderr


@pytest.mark.parametrize("pytest_rc", [1, 2, 5])
def test_ci_fails_when_pytest_fails_or_collects_nothing(fake_repo, pytest_rc):
    _, run_ci = fake_repo
    proc, calls = run_ci(pytest_rc=pytest_rc)
    assert proc.returncode != 0
    assert sum("-m pytest" in c for c in calls) == 1  # nothing after a failed suite


def test_ci_stops_when_the_install_fails(fake_repo):
    _, run_ci = fake_repo
    proc, calls = run_ci(pip_rc=1)
    assert proc.returncode != 0
    assert not any("-m pytest" in c for c in calls)  # pytest never ran


def test_a_timed_test_runs_alone_and_before_tests_that_start_after_it_waits(monkeypatch, tmp_path):
    """The suite's lock between worker processes (tests/conftest.py): a timed test waits for the running test, and a
    test that starts while it waits waits for it, so the timed test never shares the CPU and never starves."""
    import threading
    import time

    from conftest import _cpu_lock

    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    monkeypatch.setenv("SPECGEN_TEST_RUN_FOLDER", str(tmp_path))
    order, release = [], {name: threading.Event() for name in ("running", "timed", "next")}

    def test(name, exclusive):
        with _cpu_lock(exclusive):
            order.append(name)
            release[name].wait(10)

    threads = {"running": threading.Thread(target=test, args=("running", False))}
    threads["running"].start()
    time.sleep(0.2)
    threads["timed"] = threading.Thread(target=test, args=("timed", True))
    threads["timed"].start()
    time.sleep(0.2)
    threads["next"] = threading.Thread(target=test, args=("next", False))
    threads["next"].start()
    time.sleep(0.3)
    assert order == ["running"]  # the timed test waits for the running one, the next test waits behind it
    for name in ("running", "timed", "next"):
        release[name].set()
        time.sleep(0.3)
        threads[name].join(5)
    assert order == ["running", "timed", "next"]
