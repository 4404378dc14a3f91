"""Sampling ops behind one dispatch (`dispatch.py`), installed as `specgen.kernels`.

Run from the repository root (`python -m pytest`, `python -m specgen …`, a script beside this folder), Python
puts the root on sys.path, and this folder answers to the top-level name `kernels` too. That name belongs to
Hugging Face's `kernels` package, which transformers imports whenever a model module loads. Imported under that
name, this file hands the import over to the installed package, so the folder never shadows it. Imported as
`specgen.kernels`, it re-exports the dispatched ops.
"""

if __name__ == "kernels":
    import importlib.machinery
    import importlib.util
    import os
    import sys

    _root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    _rest = [entry for entry in sys.path if os.path.abspath(entry or os.curdir) != _root]
    _spec = importlib.machinery.PathFinder.find_spec("kernels", _rest)
    if _spec is None:
        raise ModuleNotFoundError("No module named 'kernels'", name="kernels")
    _module = importlib.util.module_from_spec(_spec)
    sys.modules["kernels"] = _module  # what `import kernels` returns once this file has run
    _spec.loader.exec_module(_module)
else:
    from specgen.kernels.dispatch import *  # noqa: F401,F403
    from specgen.kernels.dispatch import __all__  # noqa: F401
