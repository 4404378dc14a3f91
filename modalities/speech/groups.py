"""Acoustic Similarity Groups of a speech token model, for PCG (`specgen.samplers.groups`).

Groups come from the target's input embeddings of the acoustic tokens (PCG builds them from the target's embedding
space); BOS/BOA/EOS/PAD, the voices and the characters are singletons, so EOS is only ever accepted as itself. They
are built once per model and theta and cached in `$SPECGEN_HOME/groups/` (default ~/.cache/specgen/groups/), keyed
by a hash of the embedding rows, so a retrained model never reuses stale groups.

    python -m specgen.modalities.speech.groups [--model DIR] --theta 0.25 [0.3 ...] [--codec DIR] [--rebuild] [--json]

builds (or loads) the groups and prints the group-size table; with a codebook it also prints how close group mates
sound: the mean distance between the log-mel centroids of two tokens of one group, as a fraction of that of random
token pairs (1 = groups no better than chance).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import math
import sys
from pathlib import Path

import torch

from specgen.settings import use_threads
from specgen.errors import InvalidRequest, SpecgenError
from specgen.modalities.assets import cache_dir
from specgen.samplers.groups import TokenGroups, build_groups

log = logging.getLogger(__name__)


def acoustic_embeddings(model, num_tokens: int) -> torch.Tensor:
    """[num_tokens, hidden] float32: the input embedding rows of the acoustic tokens (ids 0 .. num_tokens-1)."""
    return model.get_input_embeddings().weight[:num_tokens].detach().float().cpu()


def embeddings_key(embeddings: torch.Tensor, vocab_size: int) -> str:
    digest = hashlib.sha256(embeddings.contiguous().numpy().tobytes())
    digest.update(f"{tuple(embeddings.shape)}:{vocab_size}".encode())
    return digest.hexdigest()[:16]


def groups_path(key: str, theta: float) -> Path:
    return cache_dir() / "groups" / f"{key}-theta{theta:.6g}.npz"


def check_theta(theta) -> float:
    try:
        theta = float(theta)
    except (TypeError, ValueError):
        raise InvalidRequest(f"theta must be a number, got {theta!r}") from None
    if not math.isfinite(theta):
        raise InvalidRequest(f"theta must be finite, got {theta}")
    return theta


def load_or_build_groups(model, num_tokens: int, vocab_size: int, theta: float, *,
                         rebuild: bool = False) -> TokenGroups:
    """The groups of `model` at `theta`: from the cache when present and valid, else built and cached (a cache
    that cannot be written is only a warning)."""
    theta = check_theta(theta)
    embeddings = acoustic_embeddings(model, num_tokens)
    path = groups_path(embeddings_key(embeddings, vocab_size), theta)
    if path.exists() and not rebuild:
        try:
            groups = TokenGroups.load(path)
            if groups.vocab_size == vocab_size and groups.theta == theta:
                return groups
        except (OSError, ValueError, KeyError, SpecgenError) as exc:  # a damaged cache entry is rebuilt
            log.warning("rebuilding unreadable token groups %s: %s", path, exc)
    groups = build_groups(embeddings, theta, vocab_size)
    try:
        groups.save(path)
    except OSError as exc:
        log.warning("could not cache token groups in %s: %s", path, exc)
    return groups


def centroid_spread(groups: TokenGroups, centroids: torch.Tensor, seed: int = 0) -> float | None:
    """Mean log-mel centroid distance between distinct tokens of one group / that between random distinct tokens."""
    num_tokens = centroids.shape[0]
    members = groups.member_ids.long()
    owner = torch.repeat_interleave(torch.arange(groups.num_groups), groups.sizes)
    pairs = (owner < num_tokens) & (members < num_tokens) & (owner != members)  # group seed and one other member
    if not bool(pairs.any()):
        return None
    within = (centroids[owner[pairs]] - centroids[members[pairs]]).norm(dim=-1).mean()
    g = torch.Generator().manual_seed(seed)
    a, b = torch.randint(0, num_tokens, (2, 20_000), generator=g)
    keep = a != b
    chance = (centroids[a[keep]] - centroids[b[keep]]).norm(dim=-1).mean()
    return float(within / chance)


def group_table(rows: list[dict]) -> str:
    lines = ["| theta | mean size | median | p90 | max | singletons | table entries | tables | centroid spread |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        spread = "—" if r.get("centroid_spread") is None else f"{r['centroid_spread']:.2f}"
        lines.append(f"| {r['theta']:g} | {r['mean_size']:.2f} | {r['median_size']:g} | {r['p90_size']:g} | "
                     f"{r['max_size']} | {100 * r['singletons']:.1f} % | {r['entries']} | "
                     f"{r['table_bytes'] / 1024:.0f} KiB | {spread} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from specgen.modalities.speech.models import default_paths, load_speech_lm, load_speech_vocab

    parser = argparse.ArgumentParser(prog="python -m specgen.modalities.speech.groups",
                                     description="Build (or load from the cache) the PCG token groups of a speech "
                                                 "model and print their group-size table.")
    parser.add_argument("--model", help="speech token model folder (default: the shipped assets/speech/target)")
    parser.add_argument("--theta", type=float, nargs="+", required=True, help="cosine threshold(s)")
    parser.add_argument("--codec", help="codebook folder for the centroid spread (default: the shipped one when "
                                        "--model is not given)")
    parser.add_argument("--rebuild", action="store_true", help="ignore cached groups")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    use_threads(1)
    try:
        paths = default_paths()
        model_dir = Path(args.model or paths["target"])
        model, vocab = load_speech_lm(model_dir), load_speech_vocab(model_dir)
        codec_dir = args.codec or (paths["codec"] if args.model is None else None)
        centroids = None
        if codec_dir is not None:
            from specgen.modalities.speech.codec import AcousticCodec

            centroids = AcousticCodec.load(codec_dir).centroids
        rows = []
        for theta in args.theta:
            groups = load_or_build_groups(model, vocab.num_tokens, vocab.vocab_size, theta, rebuild=args.rebuild)
            row = groups.stats(range(vocab.num_tokens))  # the acoustic tokens: every other token is a singleton
            row["centroid_spread"] = None if centroids is None else centroid_spread(groups, centroids)
            row["cache"] = str(groups_path(embeddings_key(acoustic_embeddings(model, vocab.num_tokens),
                                                          vocab.vocab_size), groups.theta))
            rows.append(row)
    except SpecgenError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"model": str(model_dir), "acoustic_tokens": vocab.num_tokens, "rows": rows}))
    else:
        print(f"{model_dir}: {vocab.num_tokens} acoustic tokens (statistics over them; other tokens are singletons)")
        print(group_table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
