import os

# Triton kernels run on CPU tensors only through the interpreter, which is chosen when triton_ops is imported.
os.environ.setdefault("TRITON_INTERPRET", "1")
