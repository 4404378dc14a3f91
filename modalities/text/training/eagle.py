"""`specgen train head --method eagle|poss|mtp|falcon`: the text EAGLE head (modalities/drafters/eagle.py), PosS
position specialists over one (modalities/drafters/poss.py), FastMTP's module (modalities/drafters/mtp.py) or
Falcon's semi-autoregressive head (modalities/drafters/falcon.py), trained on the frozen target's own features,
resumably.

Data (`windows` windows of `window_len` tokens; the target's forward over each gives its final-normed hidden state
at every position, the feature the head reads and predicts):
- the code target: prompts from the code corpus's train split continued greedily by the target (its own text);
- Gemma 3 270M: a third each of (a) the shipped Gemma corpus (code prompts with Gemma's greedy continuations,
  assets/gemma/corpus), (b) docstring prompts from the standard library continued greedily by Gemma and (c) real
  docstring prose, teacher-forced. Docstrings are the English on this machine; none of the bench prompts is used.
The validation split (held-out files) gives `eval_windows` windows of each kind for the held-out numbers.

Output layer: the target's own rows (frozen), the full vocabulary, or with `vocab_size` the most frequent tokens
of the training windows (special tokens first): a reduced output layer whose other tokens have draft probability
0, so verification stays exact (FastMTP / the reduced-vocabulary draft's argument).

Loss per position (EAGLE-1): SmoothL1(predicted feature, target feature) + law_weight × cross-entropy of the
draft's law against the target's (both through the kept rows), the law term on a `law_share` of positions drawn per
step (the output layer is most of a step's cost). Input features get uniform noise (±noise) so the head tolerates
its own errors when it feeds on them further down a chain; with `unroll` 2 the head is also trained reading its own
predicted features (module `EagleTask.loss`). Held out: α = Σ min(target, draft) and greedy agreement at every
position, before and after, reading the target's features (depth 1) and the head's own predictions (depth 2).

PosS (`--method poss`): the EAGLE head `base` (default: the target's) stays frozen and gives the kept vocabulary;
`specialists - 1` copies of its layer are trained, the chain unrolled at least one pass per specialist, drafted
position d read by specialist min(d, specialists) - 1. A run may reuse an EAGLE run's `features/` and `windows/`
(the same settings give the same windows).

FastMTP (`--method mtp`, eagle_config.MTP_DEFAULTS): the module with its two input norms, the law term alone on half
the positions, three recursive depths weighted 0.6 ** (d - 1), no input noise, and for Gemma sampled docstring
continuations in place of real docstrings (every continuation the target's own); with `vocab_size` a kept list per
kind of text (code, prose) beside the union the loss reads.

Falcon (`--method falcon`, eagle_config.FALCON_DEFAULTS): the EAGLE head under a block mask at a random phase per
step (pairs see their whole block of `block`), pair t predicting f_{t+k-1}; the second pass reads, at pair t, the
first pass's prediction from pair t - k (the previous block's, as a drafted block reads it), except in a share of
blocks, which read the target's features instead: glancing, the share = λ × the first pass's greedy disagreement,
λ from `glance_start` to `glance_end` over the run (module `EagleTask.block_loss`).

Run folder: `features/` (chunk files, resumable), `run.json`, `checkpoint.pt` (every checkpoint_minutes),
`metrics.jsonl`, `training.json`; the head is exported into `out` (default run_dir/export) with its `vocab_ids.json`
and a model card.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from specgen.modalities.text.training.eagle_config import EagleConfig, config_for
from specgen.modalities.training import RunFolder, apply_gradients, cosine_lr, progress_bar, set_lr
from specgen.settings import use_threads

CHUNK = 64  # windows per feature file


# ---- the target -----------------------------------------------------------------------------------------------


def load_target(name: str):
    """(model, tokenizer, folder) of the code target, Gemma or a model folder."""
    from specgen.modalities.text.generator import load_causal_lm, load_tokenizer, resolve_model_path, shipped_code_pair

    folder = shipped_code_pair()[0] if name == "code" else resolve_model_path(name)
    model = load_causal_lm(folder)
    for p in model.parameters():
        p.requires_grad_(False)
    return model, load_tokenizer(folder), folder


def is_gemma(model) -> bool:
    return getattr(model.config, "model_type", "") == "gemma3_text"


def output_rows(model, vocab_ids: torch.Tensor | None) -> torch.Tensor:
    """[kept, d] float32 rows of the target's output layer (an int8 one dequantised), all rows without vocab_ids."""
    head = model.lm_head
    weight = head.dequantized() if hasattr(head, "dequantized") else head.weight.detach().float()
    return weight if vocab_ids is None else weight[vocab_ids]


# ---- data -----------------------------------------------------------------------------------------------------


def docstring_stream(tokenizer, split: str, cache: Path, max_files: int | None = None) -> np.ndarray:
    """The standard library's docstrings of `split` (the code corpus's file split) as one token stream."""
    from specgen.modalities.text.training.stdlib_corpus import load_corpus

    path = cache / f"docstrings-{split}-{type(tokenizer).__name__}-{len(tokenizer)}-{max_files}.npy"
    if path.exists():
        return np.load(path)
    texts = []
    for text in load_corpus(max_files=max_files).texts(split):
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc and len(doc) > 80:
                    texts.append(doc)
    encoded = tokenizer.backend_tokenizer.encode_batch(texts, add_special_tokens=False)
    stream = np.fromiter((i for e in encoded for i in (*e.ids, tokenizer.eos_token_id)), dtype=np.uint32)
    cache.mkdir(parents=True, exist_ok=True)
    np.save(path, stream)
    return stream


def windows_of(cfg: EagleConfig, model, tokenizer, split: str, count: int, cache: Path) -> np.ndarray:
    """[count, window_len] token windows of `split` (module docstring), deterministic in (seed, split)."""
    from specgen.modalities.text.training.distill import windows as window_data

    seed = cfg.seed * 7 + (0 if split == "train" else 1)
    cache.mkdir(parents=True, exist_ok=True)
    new_tokens = cfg.window_len - cfg.prompt_len

    def continued(stream, n, tag, temperature=0.0):
        prompts = window_data.corpus_windows(stream, n, cfg.prompt_len, new_tokens, seed)
        name = f"{'greedy' if not temperature else f't{temperature}'}-{tag}-{split}-{n}"
        return window_data.target_windows(model, prompts, new_tokens, temperature, seed, cache / name).tokens

    max_files = cfg.max_files or None
    if not is_gemma(model):
        return continued(window_data.corpus_stream(tokenizer, split, max_files, cache), count, "code")
    third = count // 3
    docs = docstring_stream(tokenizer, split, cache, max_files)
    if cfg.sampled_prose:
        prose = continued(docs, count - 2 * third, "prose", temperature=1.0)
    else:
        prose = window_data.corpus_windows(docs, count - 2 * third, cfg.window_len, 0, seed).tokens
    if split == "train":
        from specgen.modalities.assets import assets_dir

        shipped = np.load(assets_dir() / "gemma" / "corpus" / "tokens.npz")
        shipped = shipped[shipped.files[0]].astype(np.int64)[:, :cfg.window_len]
        code = shipped[np.random.default_rng(seed).permutation(len(shipped))[:third]]
    else:
        code = continued(window_data.corpus_stream(tokenizer, split, max_files, cache), third, "code")
    return np.concatenate([code, continued(docs, third, "prose"), prose]).astype(np.int64)


@torch.no_grad()
def feature_chunks(model, tokens: np.ndarray, folder: Path, batch: int = 16) -> list[Path]:
    """The target's final-normed features over `tokens` [n, T], CHUNK windows per file (a killed run resumes at
    the first missing file): {"ids": int32 [c, T], "features": fp16 [c, T, d]}."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    starts = range(0, len(tokens), CHUNK)
    bar = progress_bar(len(starts), 0, f"target features ({folder.name})")
    for index, start in enumerate(starts):
        path = folder / f"chunk-{index:04d}.pt"
        if not path.exists():
            ids = torch.from_numpy(tokens[start:start + CHUNK])
            features = torch.cat([model.model(input_ids=ids[i:i + batch]).last_hidden_state.half()
                                  for i in range(0, len(ids), batch)])
            tmp = path.with_suffix(".tmp")
            torch.save({"ids": ids.int(), "features": features}, tmp)
            tmp.replace(path)
        paths.append(path)
        bar.update(1)
    bar.close()
    return paths


def kept_vocabulary(model, tokenizer, ids: torch.Tensor, size: int) -> torch.Tensor | None:
    """Special tokens first, then the most frequent tokens of `ids`, `size` in all (None: size 0, every token)."""
    if not size:
        return None
    specials = [t for t in (tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id) if t is not None]
    counts = torch.bincount(ids.flatten().long(), minlength=model.config.vocab_size)
    counts[specials] = -1
    order = counts.argsort(descending=True)[:size - len(specials)]
    return torch.cat([torch.tensor(specials), order])


# ---- training -------------------------------------------------------------------------------------------------


class EagleTask:
    """Target, head, output rows and the feature chunks in memory."""

    def __init__(self, cfg: EagleConfig, say=print):
        from specgen.modalities.drafters.eagle import TextEagleHead

        self.cfg = cfg
        self.model, self.tokenizer, self.folder = load_target(cfg.model)
        run = Path(cfg.run_dir)
        use_threads(cfg.data_threads)
        began = time.perf_counter()
        blobs = {}
        for split, count in (("train", cfg.windows), ("val", cfg.eval_windows * (3 if is_gemma(self.model) else 1))):
            tokens = windows_of(cfg, self.model, self.tokenizer, split, count, run / "windows")
            blobs[split] = [torch.load(p) for p in feature_chunks(self.model, tokens, run / "features" / split)]
        self.data_s = time.perf_counter() - began
        use_threads(cfg.threads)
        self.ids = torch.cat([b["ids"] for b in blobs["train"]]).long()
        self.features = torch.cat([b["features"] for b in blobs["train"]])
        self.eval_ids = torch.cat([b["ids"] for b in blobs["val"]]).long()
        self.eval_features = torch.cat([b["features"] for b in blobs["val"]])
        torch.manual_seed(cfg.seed)
        self.kinds = None  # mtp: {kind of text: its kept ids, most frequent first}
        if cfg.method == "poss":
            self.head, self.vocab_ids, self.base_folder = poss_head(cfg, self.folder)
        else:
            from specgen.modalities.drafters.falcon import FalconHead
            from specgen.modalities.drafters.mtp import MtpHead

            self.vocab_ids = kept_vocabulary(self.model, self.tokenizer, self.ids, cfg.vocab_size)
            if cfg.method == "mtp" and cfg.vocab_size and is_gemma(self.model):
                third = cfg.windows // 3  # windows_of: code, then prose
                self.kinds = {kind: kept_vocabulary(self.model, self.tokenizer, ids, cfg.vocab_size)
                              for kind, ids in (("code", self.ids[:third]), ("prose", self.ids[third:]))}
            kind = {"mtp": MtpHead, "falcon": FalconHead}.get(cfg.method, TextEagleHead)
            self.head = kind.for_target(self.model, intermediate_size=cfg.intermediate_size, heads=cfg.heads,
                                        kv_heads=cfg.kv_heads)
            if cfg.method == "falcon":
                self.head.block = cfg.block
        self.rows = output_rows(self.model, self.vocab_ids)  # [kept, d]
        self.unroll = max(cfg.unroll, cfg.specialists if cfg.method == "poss" else 1)
        say(f"data: {len(self.ids)} windows x {self.ids.shape[1]} tokens, {len(self.eval_ids)} held out "
            f"({self.data_s:.0f} s); output rows {self.rows.shape[0]}")

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model.model.embed_tokens(ids).float()

    def loss(self, ids, features, noise: float = 0.0, law_share: float = 1.0, generator=None, unroll: int = 1,
             glance: float = 0.0):
        """Per depth 1..unroll, (feature loss, law loss, α, greedy agreement) over every predicted position of
        windows ids [B, T]. Depth 1 reads the target's features; depth d + 1 reads, at every pair, the head's own
        depth-d prediction of the feature before it (EAGLE-3's training-time test, in its plainest form: deeper
        drafted tokens feed on predicted features, and this trains the head for that). Falcon: `block_loss`."""
        if self.cfg.block > 1:
            return self.block_loss(ids, features, noise, law_share, generator, unroll, glance)
        inputs = features[:, :-1].float()  # the feature at t - 1 ...
        if noise:
            inputs = inputs + (torch.rand(inputs.shape, generator=generator) * 2 - 1) * noise
        positions = torch.arange(1, ids.shape[1]).expand(ids.shape[0], -1)
        embed, wanted = self.embed(ids[:, 1:]), features[:, 1:].float()
        depths = []
        for depth in range(1, unroll + 1):
            trains = any(p.requires_grad for p in self.head.layer(depth - 1).parameters())
            with torch.set_grad_enabled(torch.is_grad_enabled() and trains):  # a frozen base: no graph
                predicted = self.head(embed, inputs, positions, depth)  # ... and token t predict the feature at t
                depths.append(self._terms(predicted, wanted, law_share, generator))
            inputs = torch.cat([inputs[:, :1], predicted[:, :-1]], 1)  # pair t reads the prediction of f_{t-1}
        return depths

    def block_loss(self, ids, features, noise: float, law_share: float, generator, unroll: int, glance: float):
        """Falcon's terms per pass (module docstring): pairs 1..T-1 under the block mask, pair t predicting
        f_{t+k-1}; pass d + 1 reads at pair t pass d's prediction from pair t - k, or with probability `glance` per
        block the target's feature (the first k pairs always do: no block precedes them)."""
        from specgen.modalities.drafters.falcon import block_visible

        block, count = self.cfg.block, ids.shape[1] - 1  # pairs
        true_inputs = features[:, :-1].float()  # pair t reads f_{t-1}
        if noise:
            true_inputs = true_inputs + (torch.rand(true_inputs.shape, generator=generator) * 2 - 1) * noise
        phase = int(torch.randint(block, (1,), generator=generator)) if generator is not None else 0
        visible, blocks = block_visible(count, block, phase), (torch.arange(count) + phase) // block
        positions = torch.arange(1, ids.shape[1]).expand(ids.shape[0], -1)
        embed, wanted = self.embed(ids[:, 1:]), features[:, block:].float()  # pair t (< T - k + 1): f_{t+k-1}
        inputs, depths = true_inputs, []
        for depth in range(1, unroll + 1):
            predicted = self.head(embed, inputs, positions, depth, visible)
            depths.append(self._terms(predicted[:, :wanted.shape[1]], wanted, law_share, generator))
            read = torch.cat([true_inputs[:, :block], predicted[:, :count - block]], 1)  # pair t: from pair t - k
            if glance > 0:
                disagreement = 1.0 - float(depths[-1][3])
                chosen = torch.rand(ids.shape[0], int(blocks[-1]) + 1, generator=generator) < glance * disagreement
                read = torch.where(chosen[:, blocks][..., None], true_inputs, read)
            inputs = read
        return depths

    def _terms(self, predicted, wanted, law_share: float, generator):
        feature_loss = F.smooth_l1_loss(predicted, wanted)
        predicted, wanted = predicted.flatten(0, 1), wanted.flatten(0, 1)
        if law_share < 1.0:
            keep = torch.randperm(len(predicted), generator=generator)[:max(1, int(len(predicted) * law_share))]
            predicted, wanted = predicted[keep], wanted[keep]
        target_law = F.softmax(F.linear(wanted, self.rows), -1)
        draft_log = F.log_softmax(F.linear(predicted, self.rows), -1)
        law_loss = -(target_law * draft_log).sum(-1).mean()
        acceptance = torch.minimum(target_law, draft_log.exp()).sum(-1).mean()
        agreement = (target_law.argmax(-1) == draft_log.argmax(-1)).float().mean()
        return feature_loss, law_loss, acceptance, agreement

    @torch.no_grad()
    def evaluate(self) -> dict:
        """Held-out figures at depth 1 (the target's features) and each depth 2.. (the head's own predictions)."""
        self.head.eval()
        totals = torch.zeros(max(2, self.unroll), 4)
        for start in range(0, len(self.eval_ids), 16):
            depths = self.loss(self.eval_ids[start:start + 16], self.eval_features[start:start + 16],
                               unroll=len(totals))
            count = len(self.eval_ids[start:start + 16])
            totals += torch.tensor([[float(p) for p in parts] for parts in depths]) * count
        self.head.train()
        totals /= len(self.eval_ids)
        names = ("feature_loss", "law_loss", "alpha", "greedy_agreement")
        result = {name: round(float(v), 4) for name, v in zip(names, totals[0])}
        for depth, row in enumerate(totals[1:], 2):
            result.update({f"{name}_depth{depth}": round(float(v), 4) for name, v in zip(names[2:], row[2:])})
        return result


def depth_weights(cfg: EagleConfig, depths: int) -> list[float]:
    """Each unrolled depth's share of the loss: depth_decay ** (d - 1), normalised (1: equal shares)."""
    weights = [cfg.depth_decay ** d for d in range(depths)]
    return [w / sum(weights) for w in weights]


def poss_head(cfg: EagleConfig, target_folder):
    """(PossHead over the frozen EAGLE head `cfg.base` or the target's, its kept ids, its folder)."""
    from specgen.modalities.drafters.eagle import TextEagleHead, VOCAB_FILE, find_head
    from specgen.modalities.drafters.poss import PossHead

    base_folder = Path(cfg.base) if cfg.base else find_head(str(target_folder))
    vocab = base_folder / VOCAB_FILE
    vocab_ids = torch.tensor(json.loads(vocab.read_text())) if vocab.exists() else None
    return PossHead(TextEagleHead.load(base_folder), cfg.specialists), vocab_ids, base_folder


def train_eagle(cfg: EagleConfig, say=print) -> dict:
    """Train (or resume) the head `cfg` describes, export it and return the summary (also run_dir/training.json)."""
    run = RunFolder(cfg.run_dir)
    task = EagleTask(cfg, say)
    trained = [p for p in task.head.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trained, lr=cfg.lr, weight_decay=0.0)
    if run.checkpoint.exists():
        state, _ = run.resume(task.head, optimizer, {}, weights_only=False)
    else:
        state = {"step": 0, "resumed_from": [], "before": task.evaluate(), "train_s": 0.0}
    run.record("run.json", {**asdict(cfg), "command": command_line(cfg)})

    def checkpoint():
        run.save_checkpoint({"model": task.head.state_dict(), "optimizer": optimizer.state_dict(), "state": state})

    last_save, began = time.monotonic(), time.monotonic()
    train_s0 = state["train_s"]
    bar = progress_bar(cfg.steps, state["step"], f"train {cfg.method} head")
    while state["step"] < cfg.steps:
        step = state["step"]
        generator = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step)
        rows = torch.randint(len(task.ids), (cfg.batch_size,), generator=generator)
        set_lr(optimizer, cosine_lr(step, cfg.steps, cfg.lr, cfg.warmup, floor=0.0))
        glance = cfg.glance_start + (cfg.glance_end - cfg.glance_start) * step / max(cfg.steps - 1, 1)
        depths = task.loss(task.ids[rows], task.features[rows], cfg.noise, cfg.law_share, generator, task.unroll,
                           glance)
        loss = sum(weight * (cfg.feature_weight * feature + cfg.law_weight * law)
                   for weight, (feature, law, _, _) in zip(depth_weights(cfg, len(depths)), depths))
        feature, law, acceptance, agreement = depths[0]
        apply_gradients(loss, optimizer, trained)
        state["step"] = step + 1
        state["train_s"] = train_s0 + time.monotonic() - began
        loss, feature, law = loss.detach(), feature.detach(), law.detach()
        record = {"step": step + 1, "loss": float(loss), "feature_loss": float(feature), "law_loss": float(law),
                  "alpha": float(acceptance.detach()), "greedy_agreement": float(agreement)}
        if (step + 1) % cfg.eval_every == 0 or step + 1 == cfg.steps:
            record["eval"] = task.evaluate()
            say(json.dumps(record))
        run.log(record)
        bar.update(1)
        bar.set_postfix(loss=f"{float(loss):.3f}", alpha=f"{float(acceptance.detach()):.3f}")
        if time.monotonic() - last_save > cfg.checkpoint_minutes * 60:
            checkpoint()
            last_save = time.monotonic()
    bar.close()
    checkpoint()
    target = cfg.model if cfg.model in ("code", "gemma") else task.folder
    summary = {"target": target, "before": state["before"], "after": task.evaluate(), "steps": cfg.steps,
               "windows": len(task.ids), "window_len": cfg.window_len, "heldout_windows": len(task.eval_ids),
               "output_rows": int(task.rows.shape[0]), "params": sum(p.numel() for p in trained),
               "train_s": round(state["train_s"], 1), "data_s": round(task.data_s, 1),
               "resumed_from": state["resumed_from"], "config": asdict(cfg), "command": command_line(cfg),
               "depth_weights": [round(w, 3) for w in depth_weights(cfg, task.unroll)]}
    if task.kinds:
        summary["kinds"] = {kind: len(ids) for kind, ids in task.kinds.items()}
    run.record("training.json", summary)
    out = Path(cfg.out or Path(cfg.run_dir) / "export")
    if cfg.method == "poss":
        task.head.save(out, task.base_folder, task.folder, summary)
    elif cfg.method == "mtp":
        task.head.save(out, task.folder, task.vocab_ids, summary, task.kinds)
    else:
        task.head.save(out, task.folder, task.vocab_ids, summary)
    say(f"exported the head to {out}")
    record_in_manifest(out, {"poss": "poss.json", "mtp": "mtp.json", "falcon": "falcon.json"}.get(cfg.method))
    return summary


def record_in_manifest(folder: Path, record_file: str | None = None) -> None:
    """An export inside the shipped assets: its files' entries in assets/MANIFEST.json (size, sha256, the command
    from its eagle.json; "commit" is filled when it is committed)."""
    from specgen.modalities.assets import assets_dir
    from specgen.modalities.drafters.eagle import RECORD_FILE
    from specgen.modalities.training import atomic_write, file_sha256

    folder, assets = Path(folder).resolve(), assets_dir().resolve()
    if not folder.is_relative_to(assets):
        return
    record = json.loads((folder / (record_file or RECORD_FILE)).read_text())
    manifest_path = assets / "MANIFEST.json"
    manifest = json.loads(manifest_path.read_text())
    prefix = folder.relative_to(assets).as_posix() + "/"
    entries = [e for e in manifest["files"] if not e["path"].startswith(prefix)]
    for path in sorted(p for p in folder.iterdir() if p.is_file()):
        entries.append({"path": path.relative_to(assets).as_posix(), "sha256": file_sha256(path),
                        "bytes": path.stat().st_size, "command": record["command"],
                        "seed": record["config"]["seed"], "commit": "to be filled"})
    manifest["files"] = sorted(entries, key=lambda e: e["path"])
    atomic_write(manifest_path, lambda tmp: tmp.write_text(json.dumps(manifest, indent=1) + "\n"))


def command_line(cfg: EagleConfig) -> str:
    """The `specgen train head` command that reruns (or resumes) this run (the method's own defaults left out)."""
    defaults = config_for(cfg.method)
    flags = {"run_dir": "--out", "out": "--export"}
    parts = [f"specgen train head --method {cfg.method}"]
    for key, value in asdict(cfg).items():
        if key != "method" and value is not None and (value != getattr(defaults, key)
                                                      or key in ("model", "run_dir", "out")):
            parts.append(f"{flags.get(key, '--' + key.replace('_', '-'))} {value}")
    return " ".join(parts)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from specgen.modalities.text.training.eagle_config import yes_no

    for key, value in asdict(EagleConfig()).items():
        kind = yes_no if isinstance(value, bool) else type(value) if value is not None else str
        parser.add_argument(f"--{key.replace('_', '-')}", type=kind)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="specgen train head --method eagle", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    given = {k: v for k, v in vars(parser.parse_args(argv)).items() if v is not None}
    summary = train_eagle(config_for(given.pop("method", "eagle"), **given))
    print(json.dumps({"before": summary["before"], "after": summary["after"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
