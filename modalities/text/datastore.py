"""Retrieval datastores for the model-free drafters `rest` (sparse: a suffix array over the tokenised corpus) and
`dresd` (dense: context embeddings from a model's hidden states -> the next tokens, behind an ANN index).

A datastore is a folder:
  meta.json        kind, tokenizer fingerprint, model, corpus, token count, build time, sizes
  tokens.npy       int32 corpus token ids, documents separated by -1, MAX_MATCH sentinels (-1) at the end
  suffixes.npy     positions sorted by their first MAX_MATCH tokens (a suffix array truncated at MAX_MATCH)
  dense/           dresd only: keys.npy (float16, unit norm), positions.npy, index.faiss, pca.npz
  build/           while building: per-shard token files and progress, so an interrupted build resumes

Building tokenises the corpus in shards (a progress bar on stderr; a rerun skips finished shards), sorts the
suffixes by prefix doubling in numpy (O(n log MAX_MATCH)), and writes a size/time report into meta.json.
A datastore records the fingerprint of the tokenizer it was built with; loading it for another tokenizer is a
VocabularyMismatch naming both.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Sequence

import numpy as np

from specgen.errors import InvalidRequest, ModelNotFound, VocabularyMismatch

MAX_MATCH = 16  # the longest context suffix matched (REST's maximum)
SEPARATOR = -1  # between documents and after the corpus: never matched, never drafted
KINDS = ("rest", "dresd")
TEXT_SUFFIXES = (".txt", ".py", ".md", ".rst", ".json", ".jsonl", ".html", ".tex", ".c", ".h", "")
SKIPPED_DIRS = frozenset({"__pycache__", "site-packages", "dist-packages", "node_modules"})
SHARD_BYTES = 4 << 20  # corpus text per shard (resume granularity)


def tokenizer_fingerprint(tokenizer) -> str:
    """sha256 of the tokenizer's full definition (fast tokenizers) or of its vocabulary."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    text = backend.to_str() if backend is not None else json.dumps(sorted(tokenizer.get_vocab().items()))
    return hashlib.sha256(text.encode()).hexdigest()


def corpus_files(corpus: Path) -> list[Path]:
    """The corpus: one file, or every text file below a folder (sorted, hidden folders and caches skipped)."""
    corpus = Path(corpus)
    if corpus.is_file():
        return [corpus]
    if not corpus.is_dir():
        raise InvalidRequest(f"corpus {str(corpus)!r} is neither a file nor a folder")
    files = []
    for folder, dirs, names in os.walk(corpus):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in SKIPPED_DIRS)
        files += [Path(folder) / n for n in sorted(names) if Path(n).suffix in TEXT_SUFFIXES and not n.startswith(".")]
    if not files:
        raise InvalidRequest(f"corpus folder {str(corpus)!r} holds no text files")
    return files


def _shards(files: list[Path]) -> list[list[Path]]:
    shards, current, size = [], [], 0
    for f in files:
        current.append(f)
        size += f.stat().st_size
        if size >= SHARD_BYTES:
            shards.append(current)
            current, size = [], 0
    return shards + ([current] if current else [])


def _progress(total: int, desc: str):
    try:
        from tqdm import tqdm

        return tqdm(total=total, desc=desc, unit="B", unit_scale=True, file=sys.stderr, disable=None)
    except ImportError:  # a plain line per update
        class Plain:
            def __init__(self):
                self.n = 0

            def update(self, n):
                self.n += n
                print(f"{desc}: {self.n / total:.0%}", file=sys.stderr)

            def close(self):
                pass

        return Plain()


def tokenize_corpus(files: list[Path], encode: Callable[[list[str]], list[list[int]]], work: Path) -> np.ndarray:
    """Token ids of every document, each followed by SEPARATOR, shard by shard; finished shards are kept in `work`
    and skipped by a rerun."""
    work.mkdir(parents=True, exist_ok=True)
    shards = _shards(files)
    bar = _progress(sum(f.stat().st_size for f in files), "tokenising")
    parts = []
    for s, shard in enumerate(shards):
        out = work / f"shard-{s:05d}.npy"
        if not out.exists():
            texts = [f.read_text(encoding="utf-8", errors="replace") for f in shard]
            ids = encode(texts)
            flat = np.fromiter((t for doc in ids for t in (*doc, SEPARATOR)), dtype=np.int32)
            np.save(work / "partial.npy", flat)
            os.replace(work / "partial.npy", out)  # a shard exists only once complete
        parts.append(np.load(out))
        bar.update(sum(f.stat().st_size for f in shard))
    bar.close()
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32)


def sort_suffixes(tokens: np.ndarray, depth: int = MAX_MATCH) -> np.ndarray:
    """Positions sorted by their first `depth` tokens (then by position): prefix doubling on ranks, log2(depth)
    rounds of one numpy lexsort each. Separators (and the end) rank below every token."""
    n = len(tokens)
    rank = tokens.astype(np.int64) + 1  # separator -> 0
    k = 1
    while k < depth:
        shifted = np.zeros(n, dtype=np.int64)
        shifted[:n - k] = rank[k:]
        order = np.lexsort((shifted, rank))
        pair_r, pair_s = rank[order], shifted[order]
        new = np.empty(n, dtype=np.int64)
        changes = np.concatenate([[True], (pair_r[1:] != pair_r[:-1]) | (pair_s[1:] != pair_s[:-1])])
        new[order] = np.cumsum(changes)
        rank = new
        k *= 2
    return np.lexsort((np.arange(n), rank)).astype(np.int64)


@dataclass
class Datastore:
    """An opened datastore. `tokens` ends in MAX_MATCH separators, so reads past a match never run off the end."""

    path: Path
    meta: dict
    tokens: np.ndarray
    suffixes: np.ndarray

    @classmethod
    def open(cls, path, fingerprint: str | None = None, kind: str | None = None) -> "Datastore":
        path = Path(path)
        meta_file = path / "meta.json"
        if not meta_file.exists():
            raise ModelNotFound(f"no datastore at {str(path)!r} (build one: specgen datastore build --kind rest "
                                f"--corpus DIR --model M --out {path})")
        meta = json.loads(meta_file.read_text())
        if fingerprint is not None and meta.get("tokenizer_sha256") != fingerprint:
            raise VocabularyMismatch(f"datastore {str(path)!r} was built for the tokenizer of {meta.get('model')!r} "
                                     f"({meta.get('tokenizer_sha256', '?')[:12]}), not this model's "
                                     f"({fingerprint[:12]}); rebuild it with --model for this model")
        if kind == "dresd" and meta.get("kind") != "dresd":
            raise InvalidRequest(f"datastore {str(path)!r} is a {meta.get('kind')!r} datastore; dresd needs one built "
                                 f"with --kind dresd")
        tokens = np.load(path / "tokens.npy", mmap_mode="r")
        suffixes = np.load(path / "suffixes.npy", mmap_mode="r")
        return cls(path, meta, tokens, suffixes)

    def match_range(self, query: Sequence[int], lo: int = 0, hi: int | None = None,
                    start: int = 0) -> tuple[int, int]:
        """[lo, hi) of suffixes whose tokens start with `query` (len <= MAX_MATCH), given that those in the
        starting range already agree on its first `start` tokens."""
        hi = len(self.suffixes) if hi is None else hi
        sa, toks = self.suffixes, self.tokens
        for d in range(start, len(query)):
            q = int(query[d])
            if hi - lo <= 64:  # small ranges: one numpy comparison
                column = toks[sa[lo:hi] + d]
                lo, hi = lo + int(np.searchsorted(column, q, "left")), lo + int(np.searchsorted(column, q, "right"))
            else:
                key = lambda i, d=d: int(toks[sa[i] + d])  # noqa: E731
                lo, hi = bisect_left(range(hi), q, lo, hi, key=key), bisect_right(range(hi), q, lo, hi, key=key)
            if lo >= hi:
                return lo, lo
        return lo, hi

    def longest_match(self, context: Sequence[int], max_match: int, min_match: int) -> tuple[int, int, int]:
        """(length, lo, hi) of the longest suffix of `context` (min_match <= length <= max_match) found in the
        corpus; length 0 if none. Grows the match one token to the left at a time, narrowing the range."""
        best = (0, 0, 0)
        limit = min(max_match, MAX_MATCH, len(context))
        for n in range(min_match, limit + 1):
            lo, hi = self.match_range(context[len(context) - n:])
            if lo >= hi:
                break
            best = (n, lo, hi)
        return best

    def continuations(self, lo: int, hi: int, offset: int, length: int, limit: int) -> list[list[int]]:
        """Up to `limit` continuations (`length` tokens after the match, cut at a separator) of the suffixes in
        [lo, hi), evenly spaced over the range so frequent continuations stay frequent."""
        picks = np.linspace(lo, hi - 1, num=min(limit, hi - lo)).round().astype(np.int64)
        starts = self.suffixes[picks] + offset
        window = self.tokens[starts[:, None] + np.arange(length)]
        out = []
        for row in window.tolist():
            cut = row.index(SEPARATOR) if SEPARATOR in row else len(row)
            if cut:
                out.append(row[:cut])
        return out


def default_datastore_dir(kind: str, fingerprint: str) -> Path:
    from specgen.modalities.assets import cache_dir

    return cache_dir() / "datastores" / f"{kind}-{fingerprint[:12]}"


def build(kind: str, corpus, out, tokenizer, *, model: str = "", embedder=None, max_tokens: int | None = None,
          files: list[Path] | None = None, dense_keys: int | None = None,
          log: Callable[[str], None] = lambda line: print(line, file=sys.stderr)) -> dict:
    """Build (or resume) a datastore; returns the report written to meta.json. `files`: the corpus files (default:
    every text file under `corpus`). embedder (dresd): see `dense.py`."""
    if kind not in KINDS:
        raise InvalidRequest(f"unknown datastore kind {kind!r}; choose rest or dresd")
    out = Path(out)
    files = files if files is not None else corpus_files(Path(corpus))
    started = time.perf_counter()
    fingerprint = tokenizer_fingerprint(tokenizer)
    work = out / "build"
    stamp = work / "inputs.sha256"  # what the shards were made from: a partial build of other inputs is discarded
    described = [fingerprint, str(SHARD_BYTES)] + [f"{f}:{f.stat().st_size}:{f.stat().st_mtime_ns}" for f in files]
    inputs = hashlib.sha256("\n".join(described).encode()).hexdigest()
    if stamp.exists() and stamp.read_text() != inputs:
        log(f"{work} holds a partial build of another corpus or tokenizer: starting over")
        for stale in work.glob("*"):
            stale.unlink()
    work.mkdir(parents=True, exist_ok=True)
    stamp.write_text(inputs)

    def encode(texts):
        backend = getattr(tokenizer, "backend_tokenizer", None)  # the Rust tokenizer, batched, no length warning
        if backend is not None:
            return [e.ids for e in backend.encode_batch(texts, add_special_tokens=False)]
        return tokenizer(texts, add_special_tokens=False)["input_ids"]

    tokens = tokenize_corpus(files, encode, work)
    if max_tokens is not None:
        tokens = tokens[:max_tokens]
    tokenised_s = time.perf_counter() - started
    log(f"tokenised {len(files)} files into {len(tokens):,} tokens in {tokenised_s:.1f} s; sorting suffixes")
    suffixes = sort_suffixes(tokens)
    padded = np.concatenate([tokens, np.full(MAX_MATCH + 64, SEPARATOR, dtype=np.int32)])
    np.save(out / "tokens.npy", padded)
    np.save(out / "suffixes.npy", suffixes.astype(np.int32 if len(tokens) < 2 ** 31 else np.int64))
    sorted_s = time.perf_counter() - started - tokenised_s
    report = {"kind": kind, "model": model, "tokenizer_sha256": fingerprint, "vocab_size": len(tokenizer),
              "corpus": str(Path(corpus).resolve()), "files": len(files),
              "corpus_bytes": sum(f.stat().st_size for f in files), "tokens": int(len(tokens)),
              "tokenise_s": round(tokenised_s, 2), "sort_s": round(sorted_s, 2)}
    if kind == "dresd":
        from specgen.modalities.drafters.dense import build_dense

        from specgen.modalities.drafters.dense import MAX_KEYS

        report.update(build_dense(out, padded, embedder, log=log, max_keys=dense_keys or MAX_KEYS))
    report["build_s"] = round(time.perf_counter() - started, 2)
    report["size_bytes"] = sum(f.stat().st_size for f in out.rglob("*") if f.is_file() and "build" not in f.parts)
    (out / "meta.json").write_text(json.dumps(report, indent=2) + "\n")
    for shard in work.glob("*"):
        shard.unlink()
    work.rmdir()
    log(f"datastore {out}: {report['tokens']:,} tokens, {report['size_bytes'] / 1e6:.1f} MB, built in "
        f"{report['build_s']:.1f} s")
    return report


def iter_lines(path) -> Iterable[str]:
    with open(path, encoding="utf-8") as f:
        yield from f
