import os

# Offline by construction, and Triton kernels on CPU tensors only through the interpreter. Set before any test
# module imports triton: the interpreter is chosen when a kernel is decorated.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("TRITON_INTERPRET", "1")

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
