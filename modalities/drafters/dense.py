"""`dresd`: dense retrieval drafting (DReSD, Gritta et al. 2025, arXiv 2502.15572).

Datastore (built by `specgen datastore build --kind dresd`, on top of the sparse one's token array): an embedder (a
causal LM's last hidden state: the text model's shipped draft when it has one, else the model itself) runs over
windows of the corpus; the state after position t is the key of the continuation that starts at t + 1. Keys are
centred, projected on their top `PCA_DIM` principal directions, scaled to unit norm and indexed by faiss (inner
products, i.e. cosine similarity: HNSW above `FLAT_KEYS` keys, exact below). At decode time the embedder keeps a
per-sample cache of the committed text, so each step feeds only the newly committed tokens; the state after the last
one queries the `neighbours` nearest keys, and their continuations (plus the context's own prompt-lookup
continuations, weighted `context_weight`) are merged into a trie of deterministic candidates
(`retrieval.trie_tree`): the deterministic tree rule verifies them exactly, greedy tree matching at temperature 0.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

from specgen.errors import InvalidRequest, MissingExtra
from specgen.modalities.drafters.retrieval import context_continuations, trie_proposal
from specgen.samplers.types import DecodeContext, Draft, DraftTree, Verdict

PCA_DIM = 64
WINDOW = 256  # tokens per embedding window when building
MAX_KEYS = 300_000  # keys per datastore (windows are spread evenly over a larger corpus)
HNSW_M = 32
FLAT_KEYS = 100_000  # up to this many keys the index is exact (IndexFlatIP), above it HNSW


def _faiss():
    try:
        import faiss
    except ImportError:
        raise MissingExtra("dresd needs faiss: pip install 'specgen[retrieval]' (faiss-cpu)") from None
    return faiss


class Embedder:
    """Last hidden states of a transformers causal LM over target token ids (mapped to the model's own vocabulary
    when it has a reduced one, `vocab_ids`: target ids of its rows; other tokens read as its unknown row)."""

    def __init__(self, model, vocab_ids: torch.Tensor | None = None, target_vocab: int | None = None, name: str = ""):
        self.model, self.name = model.eval(), name
        self.dim = model.config.hidden_size
        self.map = None
        if vocab_ids is not None:
            self.map = torch.full((int(target_vocab or vocab_ids.max() + 1),), len(vocab_ids), dtype=torch.long)
            self.map[vocab_ids] = torch.arange(len(vocab_ids))
        self.states: dict[int, tuple[object, int]] = {}  # sample -> (cache, tokens fed)

    def _ids(self, tokens: torch.Tensor) -> torch.Tensor:
        return tokens if self.map is None else self.map[tokens]

    @torch.no_grad()
    def hidden(self, tokens: torch.Tensor, cache=None):
        """tokens [b, n] target ids -> ([b, n, dim] float32 last hidden states, the updated cache)."""
        out = self.model.model(input_ids=self._ids(tokens), cache=cache, use_cache=cache is not None)
        return out.last_hidden_state.float(), cache

    def query(self, sample: int, context: list[int]) -> np.ndarray:
        """The state after the context's last token, feeding only what this sample committed since its last query
        (a context that is not an extension of the fed one starts over)."""
        from transformers import DynamicCache

        cache, fed, fed_tokens = self.states.get(sample, (None, 0, []))
        if cache is None or context[:fed] != fed_tokens:
            cache, fed, fed_tokens = DynamicCache(), 0, []
        new = torch.tensor([context[fed:]], dtype=torch.long)
        hidden, cache = self.hidden(new, cache)
        self.states[sample] = (cache, len(context), list(context))
        return hidden[0, -1].numpy()


def embedder_for(generator) -> Embedder:
    """The text generator's shipped draft (it has one) or the model itself, as an embedder."""
    if generator.draft_path is not None:
        model = generator.draft_model
        return Embedder(model, generator.draft_vocab_ids, generator.model.config.vocab_size,
                        _model_name(generator.draft_path))
    if not hasattr(generator.model, "model"):
        raise InvalidRequest("dresd needs a transformers model to embed contexts: give a draft model (--draft)")
    return Embedder(generator.model, name=_model_name(generator.model_path))


def _model_name(path: str) -> str:
    """A model's name as the datastore records it: its folder's resolved path (or the name given)."""
    return str(Path(path).resolve()) if Path(path).exists() else str(path)


def build_dense(out: Path, tokens: np.ndarray, embedder: Embedder, *, log=lambda line: None,
                max_keys: int = MAX_KEYS) -> dict:
    """Embed windows of the corpus (`tokens`: the padded token array of the sparse datastore), fit the projection,
    build the HNSW index; writes out/dense/ and returns the report's dense part."""
    faiss = _faiss()
    if embedder is None:
        raise InvalidRequest("a dresd datastore needs an embedder model")
    started = time.perf_counter()
    dense = Path(out) / "dense"
    dense.mkdir(parents=True, exist_ok=True)
    separators = np.flatnonzero(tokens == -1)
    starts = np.concatenate([[0], separators + 1])
    windows = []  # (start, length) inside one document
    for begin, end in zip(starts, np.concatenate([separators, [len(tokens)]])):
        for w in range(int(begin), int(end), WINDOW):
            if min(WINDOW, int(end) - w) > 1:
                windows.append((w, min(WINDOW, int(end) - w)))
    total = sum(n for _, n in windows)
    if total > max_keys:  # spread the embedded windows evenly over the corpus
        keep = np.linspace(0, len(windows) - 1, num=max(1, max_keys * len(windows) // total)).round().astype(int)
        windows = [windows[i] for i in sorted(set(keep.tolist()))]
    keys, positions = [], []
    done, last = 0, time.perf_counter()
    for start, length in windows:
        chunk = torch.from_numpy(tokens[start:start + length].astype(np.int64))[None]
        hidden, _ = embedder.hidden(chunk)
        keys.append(hidden[0, :-1].numpy())  # the state after token t keys the continuation from t + 1
        positions.append(np.arange(start + 1, start + length))
        done += length
        if time.perf_counter() - last > 5:
            print(f"embedding: {done:,} of {sum(n for _, n in windows):,} tokens", file=sys.stderr, flush=True)
            last = time.perf_counter()
    keys = np.concatenate(keys).astype(np.float32)
    positions = np.concatenate(positions).astype(np.int64)
    embed_s = time.perf_counter() - started
    log(f"embedded {len(keys):,} contexts in {embed_s:.1f} s; indexing")
    mean = keys.mean(0)
    sample = keys[np.linspace(0, len(keys) - 1, num=min(len(keys), 20_000)).astype(int)] - mean
    _, _, vt = np.linalg.svd(sample, full_matrices=False)
    components = vt[:min(PCA_DIM, vt.shape[0])].astype(np.float32)
    projected = project(keys, mean, components)
    if len(projected) > FLAT_KEYS:  # a graph index: sublinear search, built in minutes for millions of keys
        index = faiss.IndexHNSWFlat(projected.shape[1], HNSW_M, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = 64
    else:  # few keys: exact inner products are as fast as a graph walk and build instantly
        index = faiss.IndexFlatIP(projected.shape[1])
    index.add(projected)
    faiss.write_index(index, str(dense / "index.faiss"))
    np.save(dense / "positions.npy", positions)
    np.savez(dense / "pca.npz", mean=mean, components=components)
    (dense / "embedder.json").write_text(json.dumps({"embedder": embedder.name, "dim": embedder.dim}))
    return {"dense_keys": int(len(keys)), "dense_dim": int(projected.shape[1]), "embedder": embedder.name,
            "embed_s": round(embed_s, 2), "index_s": round(time.perf_counter() - started - embed_s, 2)}


def project(keys: np.ndarray, mean: np.ndarray, components: np.ndarray) -> np.ndarray:
    out = (keys - mean) @ components.T
    return np.ascontiguousarray(out / np.maximum(np.linalg.norm(out, axis=-1, keepdims=True), 1e-12), np.float32)


class DenseIndex:
    """An opened dresd datastore's dense part."""

    def __init__(self, path: Path):
        faiss = _faiss()
        dense = Path(path) / "dense"
        if not (dense / "index.faiss").exists():
            raise InvalidRequest(f"datastore {str(path)!r} has no dense index (build it with --kind dresd)")
        self.index = faiss.read_index(str(dense / "index.faiss"))
        if hasattr(self.index, "hnsw"):
            self.index.hnsw.efSearch = 64
        self.positions = np.load(dense / "positions.npy")
        pca = np.load(dense / "pca.npz")
        self.mean, self.components = pca["mean"], pca["components"]
        self.embedder = json.loads((dense / "embedder.json").read_text())

    def search(self, vector: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        scores, ids = self.index.search(project(vector[None], self.mean, self.components), k)
        keep = ids[0] >= 0
        return self.positions[ids[0][keep]], scores[0][keep]


class DenseDrafter:
    """`dresd` over an opened datastore (its token array) and its dense index, with the embedder it was built with."""

    siblings = "deterministic"

    def __init__(self, datastore, embedder: Embedder, *, tree_budget: int = 16, max_depth: int = 8,
                 neighbours: int = 16, context_weight: float = 8.0, min_match: int = 2, min_share: float = 0.0):
        if tree_budget < 1 or max_depth < 1 or neighbours < 1:
            raise InvalidRequest("dresd needs tree_budget, max_depth and neighbours >= 1")
        self.datastore, self.embedder = datastore, embedder
        self.dense = DenseIndex(datastore.path)
        if self.dense.embedder.get("embedder") != embedder.name or self.dense.embedder.get("dim") != embedder.dim:
            raise InvalidRequest(f"datastore {str(datastore.path)!r} was embedded with "
                                 f"{self.dense.embedder.get('embedder')!r}, not {embedder.name!r}; rebuild it")
        self.tree_budget, self.max_depth, self.neighbours = tree_budget, max_depth, neighbours
        self.context_weight, self.min_match, self.min_share = context_weight, min_match, min_share
        self.retrieval_s, self.embed_s, self.steps = 0.0, 0.0, 0

    def continuations(self, sample: int, context: list[int], depth: int) -> list[tuple[list[int], float]]:
        started = time.perf_counter()
        vector = self.embedder.query(sample, context)
        embedded = time.perf_counter()
        positions, scores = self.dense.search(vector, self.neighbours)
        tokens = self.datastore.tokens
        found = []
        for position, score in zip(positions.tolist(), scores.tolist()):
            row = tokens[position:position + depth].tolist()
            cut = row.index(-1) if -1 in row else len(row)
            if cut:
                found.append((row[:cut], max(score, 0.0)))
        if self.context_weight > 0:
            own = context_continuations(np.asarray(context), 16, self.min_match, depth)
            found += [(c, self.context_weight) for c in own]
        self.embed_s += embedded - started
        self.retrieval_s += time.perf_counter() - embedded
        return found

    def propose(self, ctx: DecodeContext, budget: int) -> DraftTree | Draft:
        depth = min(self.max_depth, max(1, budget))
        self.steps += len(ctx.tokens)
        return trie_proposal(ctx, lambda context, sample: self.continuations(sample, context, depth),
                             self.tree_budget, depth, self.min_share)

    def observe(self, verdict: Verdict) -> None:
        pass

    def run_summary(self) -> dict:
        steps = max(self.steps, 1)
        return {"retrieval_ms_per_step": 1e3 * (self.retrieval_s + self.embed_s) / steps,
                "embed_ms_per_step": 1e3 * self.embed_s / steps, "search_ms_per_step": 1e3 * self.retrieval_s / steps}
