"""How specgen installs: one `specgen` namespace, no top-level `kernels`, imports flowing app -> modalities ->
samplers -> kernels, and generated docs kept in step with the code."""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

import specgen.kernels
from specgen.samplers.registry import render_methods_markdown

tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = {"specgen": "specgen", "app": "specgen.app", "modalities": "specgen.modalities",
           "samplers": "specgen.samplers", "kernels": "specgen.kernels"}
HEAVY_LIBRARIES = ("transformers", "diffusers", "torchaudio", "gradio")
MODALITIES = ("text", "image", "speech")


def _python(code: str, cwd: Path) -> str:
    proc = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


# ---- (a) what the installation exposes --------------------------------------------------------------------------

def test_no_top_level_packages_from_this_repo(tmp_path):
    # A fresh interpreter outside the repository sees what the installation provides (`python -m pytest` from
    # the repository root would also put the root folder itself on sys.path).
    code = ("import importlib.util, json\n"
            "specs = {n: importlib.util.find_spec(n) for n in ('kernels', 'app', 'tests', 'samplers', 'modalities')}\n"
            "print(json.dumps({n: s and (s.origin or list(s.submodule_search_locations or [])) "
            "for n, s in specs.items()}))")
    found = json.loads(_python(code, cwd=tmp_path))
    for name, origin in found.items():  # (a virtual environment may live inside the checkout: CI's does)
        origins = [] if origin is None else origin if isinstance(origin, list) else [origin]
        assert not any(Path(o).resolve().is_relative_to(ROOT / name) for o in origins), \
            f"top-level {name!r} comes from this repo: {origin}"


def test_specgen_kernels_is_the_repo_folder(tmp_path):
    assert Path(specgen.kernels.__file__).resolve() == ROOT / "kernels" / "__init__.py"
    origin = _python("import specgen.kernels; print(specgen.kernels.__file__)", cwd=tmp_path).strip()
    assert Path(origin).resolve() == ROOT / "kernels" / "__init__.py"


# ---- (b) transformers' probe for Hugging Face's `kernels` -------------------------------------------------------

def test_the_root_kernels_folder_never_shadows_hugging_faces_package():
    # transformers >= 5.25 imports Hugging Face's `kernels` (`from kernels import CUDAProperties, ...`) when a model
    # module loads; from the root, `import kernels` finds our folder first, which must hand over to the package.
    pytest.importorskip("kernels")  # Hugging Face's, from site-packages: this test module's own root is not first
    code = ("from transformers.models.llama import modeling_llama\n"
            "import kernels, specgen.kernels\n"
            "print(kernels.__file__)\n"
            "print(specgen.kernels.rejection_sample.__name__)")
    origin, op = _python(code, cwd=ROOT).strip().splitlines()[-2:]
    assert not Path(origin).resolve().is_relative_to(ROOT / "kernels"), origin
    assert op == "rejection_sample"


def test_python_dash_m_specgen_generates_text_from_the_repository_root():
    # the command that met the shadowing first: loading a transformers model from the root
    proc = subprocess.run([sys.executable, "-m", "specgen", "generate", "text", "--prompt", "x", "--max-new-tokens",
                           "4", "--model", "assets/code/target", "--draft", "assets/code/draft", "--json"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert len(json.loads(proc.stdout)["tokens"]) == 4


def test_the_root_kernels_folder_is_no_package_of_its_own():
    # Without Hugging Face's package on the path (-S: no site-packages), the top-level name stays unresolved.
    proc = subprocess.run([sys.executable, "-S", "-c", "import kernels"], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode != 0 and "No module named 'kernels'" in proc.stderr, proc.stderr


@pytest.mark.parametrize("where", ["repo root", "elsewhere"])
def test_transformers_kernels_probe_does_not_break(where, tmp_path):
    # From the repository root the `kernels/` folder is importable as a top-level name; transformers must
    # still not mistake it for Hugging Face's package.
    code = ("import transformers\n"
            "from transformers.utils import is_kernels_available\n"
            "import transformers.integrations.hub_kernels\n"
            "print(is_kernels_available())")
    out = _python(code, cwd=ROOT if where == "repo root" else tmp_path).strip().splitlines()[-1]
    try:
        importlib.metadata.distribution("kernels")
    except importlib.metadata.PackageNotFoundError:
        assert out == "False"
    else:  # Hugging Face's package is installed: the probe may say True, it just must not fail
        assert out in ("True", "False")


# ---- (c) every package folder is installed ----------------------------------------------------------------------

def test_every_package_folder_is_listed_in_pyproject():
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert setuptools["package-dir"] == {**{name: folder for folder, name in FOLDERS.items()},
                                         "specgen.assets": "assets"}
    listed = set(setuptools["packages"])
    assert all(name == "specgen" or name.startswith("specgen.") for name in listed)
    on_disk = {_module_name(init).removesuffix(".__init__") for folder in FOLDERS
               for init in (ROOT / folder).rglob("__init__.py") if "__pycache__" not in init.parts}
    # the shipped checkpoints install as package data: every folder under assets/ is listed, or its files are lost
    assets = [ROOT / "assets", *(ROOT / "assets").rglob("*")]
    on_disk |= {".".join(["specgen", *d.relative_to(ROOT).parts]) for d in assets if d.is_dir()}
    on_disk.add("specgen.kernels.csrc")  # the C++ kernels' sources, package data too
    assert setuptools["package-data"] == {"specgen.assets": ["*", "**/*"], "specgen.kernels.csrc": ["*.cpp", "*.h"]}
    assert on_disk - listed == set(), "package folders missing from [tool.setuptools] packages"
    assert listed - on_disk == set(), "packages listed in pyproject.toml without a folder"


# ---- (d) import direction ---------------------------------------------------------------------------------------

def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    return ".".join([FOLDERS[rel.parts[0]], *rel.parts[1:]])


def imported_modules(source: str, module: str) -> set[str]:
    """Every module `source` (the text of `module`) imports, relative imports resolved, including
    `importlib.import_module("...")` / `__import__("...")` with a literal name."""
    package = module.rsplit(".", 1)[0] if not module.endswith(".__init__") else module.removesuffix(".__init__")
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([node.module] if node.module else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)  # `from pkg import submodule`
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)
              and ((isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
                   or (isinstance(node.func, ast.Name) and node.func.id in ("import_module", "__import__")))):
            found.add(node.args[0].value)
    return found


def _violations(folder: str, forbidden: tuple[str, ...]) -> list[str]:
    bad = []
    for path in sorted((ROOT / folder).rglob("*.py")):
        module = _module_name(path)
        for name in imported_modules(path.read_text(encoding="utf-8"), module):
            if any(name == f or name.startswith(f + ".") for f in forbidden):
                bad.append(f"{path.relative_to(ROOT)} imports {name}")
    return bad


def test_import_checker_resolves_relative_and_dynamic_imports():
    source = ("from ..modalities import text\nfrom . import tree\nimport importlib\n"
              "importlib.import_module('gradio')\nfrom specgen import app\n")
    found = imported_modules(source, "specgen.samplers.loop")
    assert {"specgen.modalities.text", "specgen.samplers.tree", "gradio", "specgen.app"} <= found
    assert "specgen.samplers.tree" in imported_modules("from .tree import x", "specgen.samplers.__init__")


@pytest.mark.parametrize("folder, forbidden", [
    ("samplers", (*HEAVY_LIBRARIES, "specgen.modalities", "specgen.app")),
    ("kernels", (*HEAVY_LIBRARIES, "specgen.modalities", "specgen.app", "specgen.samplers")),
    ("modalities", ("specgen.app",)),
    *[(f"modalities/{m}", tuple(f"specgen.modalities.{other}" for other in MODALITIES if other != m))
      for m in MODALITIES],
    # The installed names are specgen.*; a bare `import kernels` would find Hugging Face's package instead.
    *[(folder, ("app", "kernels", "samplers", "modalities", "tests")) for folder in FOLDERS],
])
def test_imports_flow_one_way(folder, forbidden):
    assert _violations(folder, forbidden) == []


# ---- (e) generated docs, (f) a light top-level import -----------------------------------------------------------

def test_methods_doc_is_generated_from_the_registry():
    text = (ROOT / "docs" / "methods.md").read_text(encoding="utf-8")
    assert text == render_methods_markdown() + "\n", \
        "docs/methods.md is stale: run `python -m specgen.samplers.registry > docs/methods.md`"


def test_import_specgen_loads_no_torch(tmp_path):
    out = _python("import sys, specgen, specgen.samplers.registry; "
                  "print([m for m in ('torch', 'transformers', 'gradio') if m in sys.modules])", cwd=tmp_path)
    assert out.strip() == "[]"


def test_assets_manifest_lists_every_shipped_file_with_its_hash():
    """assets/MANIFEST.json names each shipped file with its size, sha256, command and seed, and nothing else."""
    import hashlib
    import json
    from pathlib import Path

    assets = Path(__file__).resolve().parents[2] / "assets"
    entries = {e["path"]: e for e in json.loads((assets / "MANIFEST.json").read_text())["files"]}
    files = {p.relative_to(assets).as_posix() for p in assets.rglob("*") if p.is_file() and p.name != "MANIFEST.json"}
    assert files == set(entries)
    for path, entry in entries.items():
        data = (assets / path).read_bytes()
        assert (len(data), hashlib.sha256(data).hexdigest()) == (entry["bytes"], entry["sha256"]), path
        assert entry["command"], path
    # the shipped-checkpoint budget; Gemma-derived files (loaded only with the gemma extra) have their own
    gemma = sum(e["bytes"] for path, e in entries.items() if path.startswith("gemma/"))
    # 60 MB, the speech corpus' durations, the code target's Kangaroo adapters (2 x 1.2 MB, assets/code/kangaroo),
    # its EAGLE head (2.2 MB, assets/code/eagle), PosS specialists (4.9 MB, assets/code/poss), FastMTP module
    # (2.2 MB, assets/code/mtp), early-exit heads and controllers (1.8 MB, assets/code/early_exit), PPD's prompt
    # tokens (3 KB, assets/code/ppd), the Falcon head (2.2 MB, assets/code/falcon), the image target's own
    # tokenizer (1.3 MB, assets/image/target/vq) and its wider draft head (1.8 MB, assets/image/head), within the
    # 100 MB cap of shipped checkpoints
    assert sum(e["bytes"] for e in entries.values()) - gemma <= 78_500_000
    # the draft (11.8 MB), the EAGLE head (7.6 MB), PosS specialists (12 MB) and the FastMTP module (7.8 MB); cap 60 MB
    assert gemma <= 40_000_000
