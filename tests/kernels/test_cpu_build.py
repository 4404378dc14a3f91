"""The C++ kernels' builder. A build killed mid-way leaves torch's lock file behind, and torch then waits on it at
every later load: the builder removes a lock older than any build takes, and leaves a fresh one (a build running
elsewhere) alone. Kernels a runner needs build side by side."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

from specgen.kernels import cpu_build


def test_only_an_old_lock_is_removed(tmp_path):
    assert cpu_build.clear_stale_lock(tmp_path) is False  # no lock: nothing to do
    lock = tmp_path / "lock"
    lock.touch()
    assert cpu_build.clear_stale_lock(tmp_path) is False and lock.exists()  # a build running now
    old = time.time() - cpu_build.STALE_LOCK_S - 5
    os.utime(lock, (old, old))
    assert cpu_build.clear_stale_lock(tmp_path) is True and not lock.exists()


@pytest.mark.skipif(not cpu_build.buildable(), reason="no C++ compiler/ninja or no AVX2/FMA here")
def test_a_kernel_loads_past_a_lock_a_killed_build_left(tmp_path):
    """The folder torch builds the attention kernel in gets a day-old lock; a new process still loads the kernel
    (before the fix it waited forever, which hung test collection). The kernel is built first, here: a lock planted
    while another process builds it would be that build's own, and removing it would start a second build beside it."""
    from specgen.kernels import query_attention

    assert query_attention.available()
    name = cpu_build.extension_name("specgen_query_attention_", cpu_build.source("query_attention.cpp"),
                                    cpu_build.compile_flags())
    lock = cpu_build.build_dir(name) / "lock"
    lock.touch()
    day_ago = time.time() - 86_400
    os.utime(lock, (day_ago, day_ago))
    try:
        code = "from specgen.kernels import query_attention; print(query_attention.available())"
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    finally:
        if lock.exists() and lock.stat().st_mtime < day_ago + 10:
            lock.unlink()
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-1] == "True" and "stale build lock" in out.stderr


def test_sources_name_no_folder_so_a_wheel_and_a_checkout_share_one_build():
    """csrc/'s headers are written into the source (once, however many files include them), and no include path is
    passed: torch rebuilds an extension whose build arguments changed, so an installed wheel's kernels (csrc/ in
    site-packages) and the checkout's would otherwise rebuild each other on every alternate run."""
    text = cpu_build.source("int8_rows.cpp", "gemma_glue.cpp", "decode_step.cpp")
    assert '#include "' not in text and "#pragma once" not in text
    header = (cpu_build.CSRC / "row_norm.h").read_text().replace("#pragma once\n", "")
    assert text.count(header) == 1
    assert str(cpu_build.CSRC) not in text


def test_kernels_build_side_by_side(monkeypatch):
    """Every `load` runs at once, on a thread of its own: each waits at a barrier the others must reach too, which
    loads called one after another never do (the barrier times out and the test fails)."""
    monkeypatch.setattr(cpu_build, "buildable", lambda: True)
    monkeypatch.setattr(cpu_build, "_CALLED", set())
    barrier = threading.Barrier(3, timeout=10)
    loaded = []

    def load():
        barrier.wait()
        loaded.append(threading.get_ident())

    cpu_build.build_side_by_side(load, load, load)
    assert len(set(loaded)) == 3


def test_nothing_builds_where_the_kernels_cannot(monkeypatch):
    monkeypatch.setattr(cpu_build, "buildable", lambda: False)
    cpu_build.build_side_by_side(lambda: pytest.fail("a load ran where no kernel can build"))


def test_a_load_runs_once_side_by_side(monkeypatch):
    """Runners are made per request: a load already run is not run again (nor is a thread started for it)."""
    monkeypatch.setattr(cpu_build, "buildable", lambda: True)
    monkeypatch.setattr(cpu_build, "_CALLED", set())
    calls = []

    def first():
        calls.append("first")

    def second():
        calls.append("second")

    cpu_build.build_side_by_side(first)
    cpu_build.build_side_by_side(first, second)
    cpu_build.build_side_by_side(first, second)
    assert calls == ["first", "second"]
