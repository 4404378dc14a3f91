"""The model-free drafters a text generator builds by registry key: `stand`, `rest`, `dresd`, `consensus`.

`rest` and `dresd` read a datastore: the `datastore` knob's path, else the default one for the model's tokenizer
in the user cache ($SPECGEN_HOME/datastores/<kind>-<tokenizer>), built on first use from the default corpus (2 MB
of the Python standard library source, `training/stdlib_corpus.py`, every k-th file) with a progress bar on stderr.
"""

from __future__ import annotations

import logging
from pathlib import Path

from specgen.errors import InvalidRequest

KINDS = ("stand", "rest", "dresd", "consensus")
DEFAULT_CORPUS_BYTES = 2 << 20  # the default datastores index this much of the standard library (seconds to build)
DEFAULT_DENSE_KEYS = 50_000  # the default dresd datastore embeds this many contexts (seconds, an exact index)

_opened: dict = {}  # (path, fingerprint, kind) -> Datastore: a process opens each datastore once


def tree_room(kind: str | None, knobs: dict) -> int:
    """Cache slots beyond the context that the drafter's widest tree needs (0 for other drafters)."""
    return knobs["tree_budget"] + 1 if kind in KINDS else 0


def default_corpus(files: list[Path], budget: int | None = None) -> list[Path]:
    """Every k-th file of the sorted list, k the smallest that keeps the text under `budget` bytes (spread over
    the whole library rather than its first packages)."""
    budget = budget or DEFAULT_CORPUS_BYTES
    sizes = [f.stat().st_size for f in files]
    step = 1
    while sum(sizes[::step]) > budget:
        step += 1
    return files[::step]


def open_datastore(kind: str, path: str, tokenizer, model: str, embedder=None):
    from specgen.modalities.text import datastore as ds

    fingerprint = ds.tokenizer_fingerprint(tokenizer)
    if not path:
        folder = ds.default_datastore_dir(kind, fingerprint)
        if embedder is not None:  # one dense datastore per embedder
            folder = folder.with_name(f"{folder.name}-{ds.hashlib.sha256(embedder.name.encode()).hexdigest()[:8]}")
        if not (folder / "meta.json").exists():
            from specgen.modalities.text.training.stdlib_corpus import corpus_files, stdlib_root

            logging.getLogger("specgen").warning(
                "building the default %s datastore for this tokenizer from the Python standard library into %s "
                "(once; `specgen datastore build` makes one from another corpus)", kind, folder)
            root = stdlib_root()
            ds.build(kind, root, folder, tokenizer, model=model, embedder=embedder,
                     files=default_corpus([root / f for f in corpus_files(root)]), dense_keys=DEFAULT_DENSE_KEYS)
        path = str(folder)
    key = (str(Path(path).resolve()), fingerprint, kind)
    if key not in _opened:
        _opened[key] = ds.Datastore.open(path, fingerprint, kind)
    return _opened[key]


def make_drafter(kind: str, generator, knobs: dict, processing):
    """The drafter of registry key `kind` for a TextGenerator (its tokenizer, target and model path)."""
    if kind == "stand":
        from specgen.modalities.drafters.stand import StandDrafter

        return StandDrafter(generator.model.config.vocab_size, processing, tree_budget=knobs["tree_budget"],
                            max_depth=knobs["max_depth"], max_ngram=knobs["max_ngram"], top_k=knobs["store_top_k"],
                            share=knobs["share"], min_value=knobs["min_value"])
    if kind == "consensus":
        from specgen.modalities.drafters.consensus import ConsensusDrafter

        return ConsensusDrafter(tree_budget=knobs["tree_budget"], max_depth=knobs["max_depth"],
                                max_match=knobs["max_match"], min_match=knobs["min_match"], group=knobs["group"],
                                min_share=knobs["min_share"])
    if kind == "rest":
        from specgen.modalities.drafters.retrieval import RestDrafter

        store = open_datastore("rest", knobs["datastore"], generator.tokenizer, generator.model_path)
        return RestDrafter(store, tree_budget=knobs["tree_budget"], max_depth=knobs["max_depth"],
                           max_match=knobs["max_match"], min_match=knobs["min_match"],
                           candidates=knobs["retrieved"], context_weight=knobs["context_weight"],
                           min_share=knobs["min_share"])
    if kind == "dresd":
        from specgen.modalities.drafters.dense import DenseDrafter, embedder_for

        embedder = embedder_for(generator)
        store = open_datastore("dresd", knobs["datastore"], generator.tokenizer, generator.model_path, embedder)
        return DenseDrafter(store, embedder, tree_budget=knobs["tree_budget"], max_depth=knobs["max_depth"],
                            neighbours=knobs["neighbours"], context_weight=knobs["context_weight"],
                            min_share=knobs["min_share"])
    raise InvalidRequest(f"unknown model-free drafter {kind!r}")
