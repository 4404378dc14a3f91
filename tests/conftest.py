import os

# Offline by construction, and Triton kernels on CPU tensors only through the interpreter. Set before any test
# module imports triton: the interpreter is chosen when a kernel is decorated.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("TRITON_INTERPRET", "1")
