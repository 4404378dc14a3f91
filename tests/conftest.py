import os

# Offline by construction, and Triton kernels on CPU tensors only through the interpreter. Set before any test
# module imports triton: the interpreter is chosen when a kernel is decorated.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("TRITON_INTERPRET", "1")
# The suite runs on one process per core (pytest-xdist, `-n auto` in pyproject.toml): torch in each keeps to one
# thread, so two workers on two cores do not oversubscribe them.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")

import collections  # noqa: E402
import contextlib  # noqa: E402
import fcntl  # noqa: E402
import tempfile  # noqa: E402

import pytest  # noqa: E402 - the environment above must be set first


@pytest.fixture(autouse=True, scope="session")
def _isolated_user_cache(tmp_path_factory):
    """What is built at first use and cached (PCG's token groups) goes to a fresh SPECGEN_HOME, never the user's."""
    before = os.environ.get("SPECGEN_HOME")
    os.environ["SPECGEN_HOME"] = str(tmp_path_factory.mktemp("specgen-home"))
    yield
    if before is None:
        os.environ.pop("SPECGEN_HOME", None)
    else:
        os.environ["SPECGEN_HOME"] = before


@contextlib.contextmanager
def _cpu_lock(exclusive: bool):
    """A readers-writer lock between the suite's worker processes (a no-op in a run of one process). Every test
    holds it shared while it runs, its fixtures' set-up and tear-down included; a test marked `timed` (it reads
    wall-clock speed) holds it alone while it runs, so no other test shares the CPU while it times. Its module's
    fixtures (loading models) are set up before, outside the lock, but for what they run under `cpu_alone`. The
    gate gives the timed test precedence: once it waits, no other test starts until it has run."""
    run_folder = os.environ.get("SPECGEN_TEST_RUN_FOLDER")
    if not os.environ.get("PYTEST_XDIST_WORKER") or not run_folder:
        yield
        return
    gate_path, lock_path = os.path.join(run_folder, "cpu.gate"), os.path.join(run_folder, "cpu.lock")
    with open(gate_path, "a+") as gate, open(lock_path, "a+") as lock:
        fcntl.flock(gate, fcntl.LOCK_EX)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        finally:
            if not exclusive:
                fcntl.flock(gate, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
            fcntl.flock(gate, fcntl.LOCK_UN)


def pytest_configure(config):
    if not hasattr(config, "workerinput") and config.getoption("numprocesses", None):
        # the controller names the folder its workers share (they inherit its environment)
        os.environ["SPECGEN_TEST_RUN_FOLDER"] = tempfile.mkdtemp(prefix="specgen-tests-")


# Files that run for minutes, longest first: two workers finish together only when the long files start early.
# pytest-xdist hands out files in collection order (`--no-loadscope-reorder`); its own order, most tests first, left
# these few-test files to the end, where the browser test's timed clicks then ran with the other worker idle (its
# set-up builds and converts beside other tests, but times alone).
LONG_FILES = ("app/test_browser_defaults.py", "packaging/test_readme_examples.py", "app/test_serve_replicas.py",
              "app/test_ui.py", "app/test_batch.py", "app/test_serve_bench.py", "packaging/test_wheel.py",
              "app/test_serve.py", "modalities/test_image_lantern.py", "app/test_bench_image.py")


def pytest_collection_modifyitems(session, config, items):
    """Long files first (LONG_FILES), then the others by their number of tests, most first; a file's tests keep
    their order. Every worker sorts its identical collection alike, as pytest-xdist requires."""
    tests_dir = os.path.dirname(os.path.abspath(__file__))
    files = [os.path.relpath(str(item.path), tests_dir).replace(os.sep, "/") for item in items]
    counts = collections.Counter(files)

    def rank(index: int):
        name = files[index]
        return (LONG_FILES.index(name) if name in LONG_FILES else len(LONG_FILES), -counts[name], name, index)

    items[:] = [items[i] for i in sorted(range(len(items)), key=rank)]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if item.get_closest_marker("timed") is not None:
        yield
        return
    with _cpu_lock(exclusive=False):
        yield


@pytest.fixture(scope="session")
def cpu_alone():
    """`with cpu_alone():` runs the block while no other test runs, for set-up that measures this machine (`auto`'s
    calibration while the demo's models warm up) in a timed test's module (only there: other tests hold the lock
    shared while they run)."""
    return lambda: _cpu_lock(exclusive=True)


@pytest.fixture(autouse=True)
def _timed_alone(request):
    if request.node.get_closest_marker("timed") is None:
        yield
        return
    with _cpu_lock(exclusive=True):
        yield
