"""The Python standard library source as a deterministic training corpus for the shipped code models.

The file list is sorted and filtered by fixed rules, so the same CPython release gives the same corpus
everywhere; `Corpus.sha256` names the exact data (relative paths plus contents) in the model card.
"""

from __future__ import annotations

import functools
import hashlib
import os
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

# Folders whose code is not library code (test suites, third-party installs, build configuration).
EXCLUDED_DIRS = frozenset({"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"})
# Generated data rather than code: 757 kB of prose in one string literal, and charmap tables made by
# gencodec.py (a tenth of the stdlib by size) would spend the small training budget on repetition.
EXCLUDED_FILES = frozenset({"pydoc_data/topics.py"})
GENERATED_MARKER = b"Python Character Mapping Codec"
VAL_EVERY = 50  # file i (in sorted order) is held out for validation when i % VAL_EVERY == 0


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def _excluded(rel: Path) -> bool:
    if any(part in EXCLUDED_DIRS or part.startswith("config-") for part in rel.parts[:-1]):
        return True
    name = rel.name
    # _sysconfigdata_* records the build's own paths and flags, so it differs between installs.
    return (rel.as_posix() in EXCLUDED_FILES or name.startswith("_sysconfigdata")
            or name.startswith("test_") or name.endswith("_test.py"))


@functools.lru_cache(maxsize=4)  # trainers and tests ask repeatedly
def _scan(root: Path) -> tuple[str, ...]:
    files = []
    for folder, dirs, names in os.walk(root):
        # Pruning here keeps the walk out of site-packages, which dwarfs the stdlib.
        dirs[:] = [d for d in dirs if d not in EXCLUDED_DIRS and not d.startswith("config-")]
        for name in names:
            rel = (Path(folder) / name).relative_to(root)
            if not name.endswith(".py") or _excluded(rel):
                continue
            with open(root / rel, "rb") as f:
                if GENERATED_MARKER in f.read(300):
                    continue
            files.append(rel.as_posix())
    return tuple(sorted(files))


def corpus_files(root: Path | None = None) -> list[str]:
    """Relative POSIX paths of the corpus files under `root` (default: this interpreter's stdlib), sorted.
    All are UTF-8 (PEP 3120); `Corpus.texts` would raise on one that is not."""
    return list(_scan(Path(root) if root is not None else stdlib_root()))


@dataclass(frozen=True)
class Corpus:
    root: Path
    train: tuple[str, ...]
    val: tuple[str, ...]
    sha256: str  # over every file's relative path and content, in sorted order
    python: str

    def texts(self, split: str) -> list[str]:
        names = self.train if split == "train" else self.val
        return [(self.root / name).read_text(encoding="utf-8") for name in names]

    def describe(self) -> dict:
        size = {split: sum((self.root / n).stat().st_size for n in getattr(self, split)) for split in ("train", "val")}
        return {"source": "CPython standard library (.py files)", "python": self.python, "sha256": self.sha256,
                "files": {"train": len(self.train), "val": len(self.val)}, "bytes": size,
                "val_rule": f"file i of the sorted list is held out when i % {VAL_EVERY} == 0",
                "excluded": sorted(EXCLUDED_DIRS) + ["config-*/", "_sysconfigdata*", "test_*.py", "*_test.py",
                                                     *sorted(EXCLUDED_FILES), "gencodec charmap tables"]}


def load_corpus(root: Path | None = None, max_files: int | None = None) -> Corpus:
    """The corpus with its fixed validation split; `max_files` keeps the first files only (for quick tests)."""
    root = Path(root) if root is not None else stdlib_root()
    files = corpus_files(root)[:max_files]
    digest = hashlib.sha256()
    for name in files:
        digest.update(name.encode() + b"\0" + hashlib.sha256((root / name).read_bytes()).digest())
    val = tuple(f for i, f in enumerate(files) if i % VAL_EVERY == 0)
    train = tuple(f for i, f in enumerate(files) if i % VAL_EVERY != 0)
    return Corpus(root, train, val, digest.hexdigest(), ".".join(map(str, sys.version_info[:3])))
