"""Train the shipped code models (target and draft) on the standard library source, resumably.

    python -m specgen.modalities.text.train --role draft --run-dir runs/draft     # the shipped recipe
    python -m specgen.modalities.text.train --finalize-card      # rebuild assets/code/README.md and MANIFEST

A run folder holds the tokenizer it started with, the token cache, `checkpoint.pt` (model, optimizer, step,
RNG state, rolling losses) and `metrics.jsonl`. Batches are a pure function of (seed, step), so a run
killed at any point resumes from its last checkpoint onto exactly the batches it would have seen.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

from specgen.settings import use_threads
from specgen.errors import InvalidRequest, VocabularyMismatch
from specgen.modalities.checkpoints import atomic_write as _atomic_write
from specgen.modalities.checkpoints import export_fp16, restore
from specgen.modalities.text.models import ASSETS_CODE, VOCAB_SIZE

# The shipped recipe. On one CPU core the budget is optimizer steps, not tokens: batches of 8 windows with a
# higher peak lr reached a lower loss per token than 16 windows at 6e-4 / 1e-3 (draft val 3.83 vs 4.48).
DEFAULT_LR = {"target": 1.5e-3, "draft": 2e-3}
DEFAULT_STEPS = {"target": 1600, "draft": 2400}
DEFAULT_BATCH = 8
# Shown in the model card. No trailing space: byte-level BPE attaches a space to the word after it.
SAMPLE_PROMPTS = ("import os\n\n\ndef", "def main(")
LOSS_WINDOW = 50  # the reported final train loss is the mean over this many last steps


def _save_npy(path: Path, array) -> None:
    import numpy as np

    with open(path, "wb") as f:  # a file object, because np.save would append ".npy" to the tmp name
        np.save(f, array)


def _file_sha256(path: Path) -> str:
    import hashlib

    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _prepare_tokenizer(run_dir: Path, export_dir: Path | None, corpus, vocab_size: int):
    """The run's own tokenizer if resuming, else the shared exported one, else a new one from the train split."""
    from specgen.modalities.text.models import load_tokenizer, train_tokenizer

    own = run_dir / "tokenizer"
    for source in (own, export_dir):
        if source is not None and (source / "tokenizer.json").exists():
            tok = load_tokenizer(source)
            break
    else:
        tok = train_tokenizer(corpus.texts("train"), vocab_size)
    if not (own / "tokenizer.json").exists():
        tok.save_pretrained(own)
    return tok


def _token_cache(run_dir: Path, corpus, tok) -> dict:
    """Train/val token arrays (uint16; each file is <bos> text <eos>), built once per corpus and tokenizer."""
    import numpy as np

    key = {"corpus_sha256": corpus.sha256, "tokenizer_sha256": _file_sha256(run_dir / "tokenizer" / "tokenizer.json")}
    meta = run_dir / "tokens.json"
    if not (meta.exists() and json.loads(meta.read_text()) == key):
        for split in ("train", "val"):
            ids = [[tok.bos_token_id, *e.ids, tok.eos_token_id]
                   for e in tok.backend_tokenizer.encode_batch(corpus.texts(split), add_special_tokens=False)]
            array = np.fromiter((i for seq in ids for i in seq), dtype=np.uint16)
            _atomic_write(run_dir / f"tokens_{split}.npy", lambda p, a=array: _save_npy(p, a))
        _atomic_write(meta, lambda p: p.write_text(json.dumps(key)))
    return {split: np.load(run_dir / f"tokens_{split}.npy") for split in ("train", "val")}


def _batch(tokens, seed: int, step: int, batch_size: int, seq_len: int):
    """Random windows of seq_len + 1 tokens, chosen by (seed, step) alone: the data position is the step."""
    import numpy as np
    import torch

    starts = np.random.default_rng((seed, step)).integers(0, len(tokens) - seq_len, size=batch_size)
    return torch.from_numpy(np.stack([tokens[s:s + seq_len + 1] for s in starts]).astype(np.int64))


def _lr_at(step: int, steps: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))  # cosine down to 10 %


def _loss(model, batch):
    import torch.nn.functional as F

    logits = model(input_ids=batch[:, :-1]).logits
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))


def _val_loss(model, tokens, seq_len: int, windows: int, batch_size: int) -> float:
    """Mean loss over fixed, evenly spaced, non-overlapping windows of the held-out files."""
    import numpy as np
    import torch

    count = min(windows, (len(tokens) - 1) // (seq_len + 1))
    if count == 0:
        return float("nan")
    stride = (len(tokens) - 1) // count
    data = torch.from_numpy(np.stack([tokens[i * stride:i * stride + seq_len + 1] for i in range(count)])
                            .astype(np.int64))
    model.eval()
    with torch.no_grad():
        total = sum(_loss(model, data[i:i + batch_size]).item() * len(data[i:i + batch_size])
                    for i in range(0, count, batch_size))
    model.train()
    return total / count


def _command(args: dict) -> str:
    flags = ["role", "steps", "batch_size", "seq_len", "lr", "seed", "threads", "run_dir"]
    parts = ["python -m specgen.modalities.text.train"]
    parts += [f"--{k.replace('_', '-')} {args[k]}" for k in flags]
    if args.get("max_files"):
        parts.append(f"--max-files {args['max_files']}")
    if Path(args["export_dir"]).resolve() != ASSETS_CODE:
        parts.append(f"--export-dir {args['export_dir']}")
    return " ".join(parts)


def train_text_model(role: str, out_dir, steps: int, batch_size: int = DEFAULT_BATCH, seq_len: int = 256,
                     lr: float | None = None, seed: int = 0, threads: int = 1, checkpoint_minutes: float = 5,
                     resume: bool = True, log_every: int = 10, *, export_dir=ASSETS_CODE,
                     eval_every: int | None = None, val_windows: int = 64, warmup: int | None = None,
                     max_files: int | None = None, vocab_size: int = VOCAB_SIZE) -> dict:
    """Train `role` ("target" or "draft") for `steps` AdamW steps in run folder `out_dir`, then export fp16
    safetensors to `export_dir/role` next to the shared tokenizer (`export_dir=None` skips the export).
    Returns the training summary that is also written as `training.json`."""
    import platform

    import torch
    import transformers
    from tqdm import tqdm

    from specgen.modalities.text.corpus import load_corpus
    from specgen.modalities.text.models import build_model

    if steps < 1 or batch_size < 1 or seq_len < 1:
        raise InvalidRequest("steps, batch_size and seq_len must be positive")
    lr = DEFAULT_LR.get(role, 1e-3) if lr is None else lr
    warmup = min(100, max(1, steps // 20)) if warmup is None else warmup
    eval_every = max(1, min(200, steps // 10)) if eval_every is None else eval_every
    run_dir, export_dir = Path(out_dir), (Path(export_dir) if export_dir is not None else None)
    run_dir.mkdir(parents=True, exist_ok=True)
    use_threads(threads)
    args = dict(role=role, steps=steps, batch_size=batch_size, seq_len=seq_len, lr=lr, seed=seed, threads=threads,
                run_dir=str(run_dir), export_dir=str(export_dir), max_files=max_files, warmup=warmup,
                vocab_size=vocab_size)

    corpus = load_corpus(max_files=max_files)
    tok = _prepare_tokenizer(run_dir, export_dir, corpus, vocab_size)
    tokens = _token_cache(run_dir, corpus, tok)
    torch.manual_seed(seed)
    model = build_model(role, tok)
    decay = [p for p in model.parameters() if p.dim() >= 2]  # no weight decay on norms
    rest = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.95), eps=1e-8)

    ckpt_path, metrics_path = run_dir / "checkpoint.pt", run_dir / "metrics.jsonl"
    state = {"step": 0, "elapsed_s": 0.0, "recent_losses": [], "val_loss": None, "resumed_from": []}
    if resume and ckpt_path.exists():
        ckpt = torch.load(ckpt_path, weights_only=True)
        fixed = ("role", "batch_size", "seq_len", "seed", "vocab_size", "max_files")
        if any(ckpt["args"][k] != args[k] for k in fixed):
            raise InvalidRequest(f"{ckpt_path} was made with different settings ({', '.join(fixed)} must match); "
                                 "pass resume=False (--no-resume) to start over")
        state = restore(ckpt, model, opt, metrics_path)
        torch.set_rng_state(ckpt["torch_rng"])
    elif metrics_path.exists():
        metrics_path.unlink()
    _atomic_write(run_dir / "run.json", lambda p: p.write_text(json.dumps({**args, "command": _command(args)},
                                                                           indent=1)))

    def checkpoint():
        blob = {"model": model.state_dict(), "optimizer": opt.state_dict(), "torch_rng": torch.get_rng_state(),
                "args": args, "state": {**state, "data_step": state["step"]}}
        _atomic_write(ckpt_path, lambda p: torch.save(blob, p))

    def log(record):
        with open(metrics_path, "a") as f:
            f.write(json.dumps(record) + "\n")

    model.train()
    tokens_per_step = batch_size * seq_len
    started = last_ckpt = last_log = time.monotonic()
    elapsed0, log_step = state["elapsed_s"], state["step"]
    bar = tqdm(total=steps, initial=state["step"], desc=f"train {role}", file=sys.stderr, dynamic_ncols=True,
               mininterval=1 if sys.stderr.isatty() else 30)
    while state["step"] < steps:
        step = state["step"]
        for group in opt.param_groups:
            group["lr"] = _lr_at(step, steps, lr, warmup)
        loss = _loss(model, _batch(tokens["train"], seed, step, batch_size, seq_len))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0).item()
        opt.step()
        if not math.isfinite(loss.item()):
            raise FloatingPointError(f"{role}: loss is {loss.item()} at step {step}")
        state["step"] = step + 1
        state["recent_losses"] = (state["recent_losses"] + [loss.item()])[-LOSS_WINDOW:]
        now = time.monotonic()
        state["elapsed_s"] = elapsed0 + now - started
        bar.update(1)
        if state["step"] % log_every == 0 or state["step"] == steps:
            rate = (state["step"] - log_step) * tokens_per_step / max(now - last_log, 1e-9)
            last_log, log_step = now, state["step"]
            bar.set_postfix(loss=f"{loss.item():.3f}", lr=f"{group['lr']:.2e}", tok_s=f"{rate:.0f}", refresh=False)
            log({"step": state["step"], "loss": loss.item(), "lr": group["lr"], "grad_norm": grad_norm,
                 "tokens_per_s": rate, "elapsed_s": state["elapsed_s"]})
        if state["step"] % eval_every == 0 or state["step"] == steps:
            state["val_loss"] = _val_loss(model, tokens["val"], seq_len, val_windows, batch_size)
            log({"step": state["step"], "val_loss": state["val_loss"]})
            bar.write(f"{role} step {state['step']}: train {loss.item():.4f}  val {state['val_loss']:.4f}",
                      file=sys.stderr)
        if now - last_ckpt >= checkpoint_minutes * 60 or state["step"] == steps:
            checkpoint()
            last_ckpt = time.monotonic()
    bar.close()

    summary = {
        "role": role, "params": sum(p.numel() for p in model.parameters()), "command": _command(args),
        "seed": seed, "steps": steps, "batch_size": batch_size, "seq_len": seq_len, "lr": lr, "warmup": warmup,
        "schedule": "linear warmup, cosine to 10 %", "optimizer": "AdamW b=(0.9, 0.95) wd=0.1 clip=1.0",
        "tokens_seen": steps * tokens_per_step,
        "final_train_loss": sum(state["recent_losses"]) / len(state["recent_losses"]),
        "final_train_loss_steps": len(state["recent_losses"]), "final_val_loss": state["val_loss"],
        "wall_s": round(state["elapsed_s"], 1), "resumed_from_steps": state["resumed_from"], "threads": threads,
        "corpus": corpus.describe(), "train_tokens": int(len(tokens["train"])), "val_tokens": int(len(tokens["val"])),
        "tokenizer_sha256": _file_sha256(run_dir / "tokenizer" / "tokenizer.json"),
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "python": platform.python_version()},
        "cpu": platform.processor() or platform.machine(),
    }
    _atomic_write(run_dir / "training.json", lambda p: p.write_text(json.dumps(summary, indent=1)))
    if export_dir is not None:
        export(model, role, run_dir, export_dir, summary)
    return summary


def export(model, role: str, run_dir: Path, export_dir: Path, summary: dict) -> Path:
    """fp16 safetensors + config into export_dir/role; the run's tokenizer into export_dir (shared by both roles)."""

    export_dir.mkdir(parents=True, exist_ok=True)
    shared = export_dir / "tokenizer.json"
    if shared.exists() and _file_sha256(shared) != summary["tokenizer_sha256"]:
        raise VocabularyMismatch(f"{shared} differs from the tokenizer this {role} was trained with "
                                 f"({run_dir / 'tokenizer'}); target and draft must share one tokenizer")
    if not shared.exists():
        from specgen.modalities.text.models import load_tokenizer

        load_tokenizer(run_dir / "tokenizer").save_pretrained(export_dir)
    return export_fp16(model, export_dir / role,
                       lambda tmp: (tmp / "training.json").write_text(json.dumps(summary, indent=1)))


def _params_line(cfg: dict) -> str:
    heads = cfg["num_attention_heads"]
    return (f"{cfg['num_hidden_layers']} layers, hidden {cfg['hidden_size']}, {heads} heads "
            f"(head dim {cfg['hidden_size'] // heads}), MLP {cfg['intermediate_size']}, vocab {cfg['vocab_size']}, "
            f"{'tied' if cfg.get('tie_word_embeddings') else 'untied'} embeddings, RoPE, "
            f"max positions {cfg['max_position_embeddings']}")


def _samples(folder: Path, prompts, new_tokens: int = 48) -> str:
    import torch
    from transformers import LlamaForCausalLM

    from specgen.modalities.text.models import load_tokenizer

    tok = load_tokenizer(folder.parent)
    model = LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32)
    texts = []
    for prompt in prompts:
        ids = tok(prompt, return_tensors="pt").input_ids
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens, do_sample=False,
                             pad_token_id=tok.pad_token_id)
        texts.append(tok.decode(out[0], skip_special_tokens=True).replace("```", "` ` `"))
    return "\n# ----\n".join(texts)


def _model_section(role: str, folder: Path) -> str:
    if not (folder / "training.json").exists():
        return f"## {role.capitalize()}\n\nNot exported yet (`assets/code/{role}/` is missing).\n"
    t = json.loads((folder / "training.json").read_text())
    cfg = json.loads((folder / "config.json").read_text())
    resumed = "; resumed from its checkpoint at step " + ", ".join(map(str, t["resumed_from_steps"])) \
        if t["resumed_from_steps"] else ""
    return f"""## {role.capitalize()} (`{role}/`)
{_distillation_lines(folder)}
- `LlamaForCausalLM`: {_params_line(cfg)}; **{t['params']:,} parameters**, stored fp16 \
({(folder / 'model.safetensors').stat().st_size:,} bytes).
- Trained {t['steps']:,} steps x {t['batch_size']} windows x {t['seq_len']} tokens = **{t['tokens_seen']:,} tokens** \
({t['tokens_seen'] / t['train_tokens']:.2f} passes over the {t['train_tokens']:,}-token train split); \
{t['optimizer']}, peak lr {t['lr']:g}, {t['warmup']} warmup steps, {t['schedule']}; seed {t['seed']}.
- Final train loss {t['final_train_loss']:.4f} (mean of the last {t['final_train_loss_steps']} steps), \
**validation loss {t['final_val_loss']:.4f}** ({t['val_tokens']:,} held-out tokens); \
wall time {t['wall_s'] / 60:.1f} min on {t['threads']} CPU thread(s), \
{t['tokens_seen'] / max(t['wall_s'], 0.1):,.0f} tokens/s on a shared machine \
(torch {t['versions']['torch']}, transformers {t['versions']['transformers']}){resumed}.
- Command: `{t['command']}`

Greedy continuations (48 new tokens) of {" and ".join(f"`{p!r}`" for p in SAMPLE_PROMPTS)}:

```python
{_samples(folder, SAMPLE_PROMPTS)}
```
"""


def _distillation_lines(folder: Path) -> str:
    """A draft distilled after its pre-training (`specgen train draft`) keeps the pre-training record in
    training.json and the distillation's summary in distillation.json; the card says both."""
    if not (folder / "distillation.json").exists():
        return ""
    d = json.loads((folder / "distillation.json").read_text())
    cfg, heldout = d["config"], d["heldout"]
    return f"""
Pre-trained on the corpus (below), then **distilled from the target** with {cfg['loss'].upper()} on the target's own \
samples ({cfg['windows']:,} prompts of {cfg['prompt_len']} tokens, {cfg['new_tokens']} sampled tokens each, \
temperature {cfg['temperature']:g}, top-{cfg['top_k']} teacher cache): {d['steps']} steps x {cfg['batch_size']} \
windows, peak lr {cfg['lr']:g}, seed {cfg['seed']}, {d['wall_s'] / 60:.1f} min. Held-out agreement with the target \
({heldout['positions']:,} positions of target samples on validation prompts): **α = Σ min(target, draft) = \
{heldout['alpha']:.4f}** (before distillation: {(d.get('heldout_before') or {}).get('alpha', float('nan')):.4f}), greedy agreement \
{heldout['greedy_agreement']:.4f}. Command, run after the pre-training command below (whose export it starts from): \
`{d['command']}`; comparisons in `docs/distill.md`.
"""


def _kept_sections(path: Path, generated: str) -> str:
    """The `## ` sections of an existing card that this generator does not write (notes added by hand, such as
    measured acceptance), so that regenerating the card keeps them."""
    if not path.exists():
        return ""
    ours = {line.split("(")[0].strip() for line in generated.splitlines() if line.startswith("## ")}
    kept, keep = [], False
    for line in path.read_text().splitlines(keepends=True):
        if line.startswith("## "):
            keep = line.split("(")[0].strip() not in ours
        if keep:
            kept.append(line)
    return ("\n" + "".join(kept).rstrip("\n") + "\n") if kept else ""


def finalize_card(export_dir=ASSETS_CODE) -> Path:
    """Write export_dir/README.md (the model card) and this folder's entries in ../MANIFEST.json from the
    exported files and their training.json; a "commit" already recorded for an unchanged file is kept."""
    export_dir = Path(export_dir)
    trained = {r: json.loads((export_dir / r / "training.json").read_text())
               for r in ("target", "draft") if (export_dir / r / "training.json").exists()}
    tok_sha = _file_sha256(export_dir / "tokenizer.json")
    vocab = len(json.loads((export_dir / "tokenizer.json").read_text())["model"]["vocab"])
    for role, t in trained.items():
        if t["tokenizer_sha256"] != tok_sha:
            raise VocabularyMismatch(f"the exported {role} was trained with another tokenizer than tokenizer.json")
    corpus = next(iter(trained.values()))["corpus"] if trained else None
    data = "" if corpus is None else f"""The `.py` files of the CPython {corpus['python']} standard library \
(`sysconfig.get_paths()['stdlib']`), read in sorted path order, excluding {', '.join(f'`{e}`' for e in corpus['excluded'])}: \
{corpus['files']['train']} train files ({corpus['bytes']['train']:,} bytes) and {corpus['files']['val']} validation \
files ({corpus['bytes']['val']:,} bytes; {corpus['val_rule']}). Each file is tokenized as `<bos>` text `<eos>`; \
training samples random windows of the concatenation. sha256 over every (relative path, content sha256) pair, \
in order: `{corpus['sha256']}` (`specgen.modalities.text.corpus.load_corpus().sha256` recomputes it).
"""
    readme = f"""# Code models: target and draft trained on the Python standard library

A small `LlamaForCausalLM` pair for speculative decoding of Python source: the draft proposes, the target
verifies. It is specgen's default text model when the Gemma extra is not installed. Both share one tokenizer.

```python
from transformers import AutoTokenizer, LlamaForCausalLM
import torch
tok = AutoTokenizer.from_pretrained("assets/code")
target = LlamaForCausalLM.from_pretrained("assets/code/target", dtype=torch.float32)  # fp16 on disk
draft = LlamaForCausalLM.from_pretrained("assets/code/draft", dtype=torch.float32)
ids = tok({SAMPLE_PROMPTS[0]!r}, return_tensors="pt").input_ids
out = target.generate(ids, assistant_model=draft, max_new_tokens=64, do_sample=False)
```

## Tokenizer (`tokenizer.json`, `tokenizer_config.json`)

Byte-level BPE (Hugging Face `tokenizers`), {vocab} tokens including `<pad>` (0), `<bos>` (1), `<eos>` (2);
no prefix space, no normalisation, so any text decodes back byte for byte. Trained on the train split;
`python -m specgen.modalities.text.train --tokenizer-only` rebuilds it (deterministic). sha256 `{tok_sha}`.

## Data

{data or "Not recorded yet (no model exported)."}
{_model_section("target", export_dir / "target")}
{_model_section("draft", export_dir / "draft")}
## Limits

Trained on {", ".join(sorted({str(t['seq_len']) for t in trained.values()})) or "?"}-token windows: contexts longer \
than that are outside what the models saw, although RoPE positions go to 1024. These are small models: they \
write plausible, often repetitive Python, not correct programs. Weights are fp16; load them as float32 on CPU.

## Licence

Trained here from scratch on Python standard library source, which is distributed under the Python Software
Foundation License; the weights are released with specgen under Apache-2.0, with that provenance noted.
`python -m specgen.modalities.text.train --finalize-card` regenerates this card and the manifest entries.
"""
    (export_dir / "README.md").write_text(readme + _kept_sections(export_dir / "README.md", readme))

    manifest_path = export_dir.parent / "MANIFEST.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {"files": []}
    prefix = export_dir.name + "/"
    old = {e["path"]: e for e in manifest["files"]}
    tok_cmd = "python -m specgen.modalities.text.train --tokenizer-only"
    entries = [e for e in manifest["files"] if not e["path"].startswith(prefix)]
    for path in sorted(p for p in export_dir.rglob("*") if p.is_file() and not p.name.startswith(".")):
        rel = path.relative_to(export_dir.parent).as_posix()
        role = path.parent.name if path.parent != export_dir else None
        t = trained.get(role)
        command = t["command"] if t else None
        distilled = export_dir / "draft" / "distillation.json"
        if role == "draft" and distilled.exists():
            command = f"{command} && {json.loads(distilled.read_text())['command']}"
        entry = {"path": rel, "sha256": _file_sha256(path), "bytes": path.stat().st_size,
                 "command": command if t else (tok_cmd if path.name.startswith("tokenizer")
                                                    else "python -m specgen.modalities.text.train --finalize-card"),
                 "seed": t["seed"] if t else None, "commit": "to be filled"}
        if rel in old and old[rel].get("sha256") == entry["sha256"]:
            entry["commit"] = old[rel].get("commit", entry["commit"])
        entries.append(entry)
    manifest["files"] = sorted(entries, key=lambda e: e["path"])
    _atomic_write(manifest_path, lambda p: p.write_text(json.dumps(manifest, indent=1) + "\n"))
    return export_dir / "README.md"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m specgen.modalities.text.train", description=__doc__.split("\n")[0])
    p.add_argument("--role", choices=["target", "draft"])
    p.add_argument("--steps", type=int, default=None, help="default: target 1600, draft 2400")
    p.add_argument("--batch-size", type=int, default=DEFAULT_BATCH)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--lr", type=float, default=None, help="peak learning rate (default: target 1.5e-3, draft 2e-3)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--run-dir", type=Path, help="checkpoints, token cache and logs (default: runs/ROLE)")
    p.add_argument("--export-dir", type=Path, default=ASSETS_CODE)
    p.add_argument("--checkpoint-minutes", type=float, default=5)
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--eval-every", type=int, default=None)
    p.add_argument("--max-files", type=int, default=None, help="use only the first N corpus files (quick checks)")
    p.add_argument("--no-resume", action="store_true", help="start over even if the run folder has a checkpoint")
    p.add_argument("--tokenizer-only", action="store_true", help="build the shared tokenizer into --export-dir")
    p.add_argument("--finalize-card", action="store_true",
                   help="rebuild README.md in --export-dir and its entries in MANIFEST.json from the exported files")
    a = p.parse_args(argv)
    if a.finalize_card:
        print(finalize_card(a.export_dir))
        return 0
    if a.tokenizer_only:
        from specgen.modalities.text.corpus import load_corpus
        from specgen.modalities.text.models import train_tokenizer

        if (a.export_dir / "tokenizer.json").exists():
            raise SystemExit(f"{a.export_dir / 'tokenizer.json'} exists; remove it first to rebuild")
        train_tokenizer(load_corpus(max_files=a.max_files).texts("train")).save_pretrained(a.export_dir)
        return 0
    if a.role is None:
        p.error("--role is required")
    summary = train_text_model(a.role, a.run_dir or Path("runs") / a.role, a.steps or DEFAULT_STEPS[a.role],
                               a.batch_size, a.seq_len, a.lr, a.seed, a.threads, a.checkpoint_minutes,
                               not a.no_resume, a.log_every, export_dir=a.export_dir, eval_every=a.eval_every,
                               max_files=a.max_files)
    print(json.dumps({k: summary[k] for k in ("role", "params", "steps", "tokens_seen", "final_train_loss",
                                              "final_val_loss", "wall_s")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
