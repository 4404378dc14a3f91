"""The model card of the shipped code models (`assets/code/README.md`) and their entries in
`assets/MANIFEST.json`, written from the exported files and their training records.

    python -m specgen.modalities.text.training.code_models --finalize-card
"""

from __future__ import annotations

import json
from pathlib import Path

from specgen.errors import VocabularyMismatch
from specgen.modalities.text.models import ASSETS_CODE
from specgen.modalities.training import atomic_write, file_sha256

# Shown in the model card. No trailing space: byte-level BPE attaches a space to the word after it.
SAMPLE_PROMPTS = ("import os\n\n\ndef", "def main(")
TRAINER = "python -m specgen.modalities.text.training.code_models"
# Training records keep the command as it was run; the card names the module where that trainer lives now.
MOVED_MODULES = {"python -m specgen.modalities.text.train ": f"{TRAINER} "}


def current_command(recorded: str | None) -> str | None:
    """A recorded training command with the trainer's module as it is named today."""
    if recorded is None:
        return None
    for old, new in MOVED_MODULES.items():
        recorded = recorded.replace(old, new)
    return recorded


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
- Command: `{current_command(t['command'])}`

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


def _data_section(corpus: dict | None) -> str:
    if corpus is None:
        return ""
    excluded = ", ".join(f"`{e}`" for e in corpus["excluded"])
    return f"""The `.py` files of the CPython {corpus['python']} standard library \
(`sysconfig.get_paths()['stdlib']`), read in sorted path order, excluding {excluded}: \
{corpus['files']['train']} train files ({corpus['bytes']['train']:,} bytes) and {corpus['files']['val']} validation \
files ({corpus['bytes']['val']:,} bytes; {corpus['val_rule']}). Each file is tokenized as `<bos>` text `<eos>`; \
training samples random windows of the concatenation. sha256 over every (relative path, content sha256) pair, \
in order: `{corpus['sha256']}` (`specgen.modalities.text.training.stdlib_corpus.load_corpus().sha256` recomputes it).
"""


def _readme(export_dir: Path, trained: dict, vocab: int, tok_sha: str) -> str:
    corpus = next(iter(trained.values()))["corpus"] if trained else None
    windows = ", ".join(sorted({str(t['seq_len']) for t in trained.values()})) or "?"
    return f"""# Code models: target and draft trained on the Python standard library

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
`{TRAINER} --tokenizer-only` rebuilds it (deterministic). sha256 `{tok_sha}`.

## Data

{_data_section(corpus) or "Not recorded yet (no model exported)."}
{_model_section("target", export_dir / "target")}
{_model_section("draft", export_dir / "draft")}
## Limits

Trained on {windows}-token windows: contexts longer \
than that are outside what the models saw, although RoPE positions go to 1024. These are small models: they \
write plausible, often repetitive Python, not correct programs. Weights are fp16; load them as float32 on CPU.

## Licence

Trained here from scratch on Python standard library source, which is distributed under the Python Software
Foundation License; the weights are released with specgen under Apache-2.0, with that provenance noted.
`{TRAINER} --finalize-card` regenerates this card and the manifest entries.
"""


def _manifest_command(path: Path, export_dir: Path, trained: dict) -> str:
    """How the file at `path` is made: its model's training command (then the distillation, for a distilled
    draft), or the tokenizer's or the card's command."""
    role = path.parent.name if path.parent != export_dir else None
    t = trained.get(role)
    if t is None:
        return f"{TRAINER} --tokenizer-only" if path.name.startswith("tokenizer") else f"{TRAINER} --finalize-card"
    command = current_command(t["command"])
    distilled = export_dir / "draft" / "distillation.json"
    if role == "draft" and distilled.exists():
        command = f"{command} && {json.loads(distilled.read_text())['command']}"
    return command


def _write_manifest(export_dir: Path, trained: dict) -> None:
    """This folder's entries in ../MANIFEST.json; a "commit" already recorded for an unchanged file is kept."""
    manifest_path = export_dir.parent / "MANIFEST.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {"files": []}
    prefix = export_dir.name + "/"
    old = {e["path"]: e for e in manifest["files"]}
    entries = [e for e in manifest["files"] if not e["path"].startswith(prefix)]
    for path in sorted(p for p in export_dir.rglob("*") if p.is_file() and not p.name.startswith(".")):
        rel = path.relative_to(export_dir.parent).as_posix()
        t = trained.get(path.parent.name if path.parent != export_dir else None)
        entry = {"path": rel, "sha256": file_sha256(path), "bytes": path.stat().st_size,
                 "command": _manifest_command(path, export_dir, trained),
                 "seed": t["seed"] if t else None, "commit": "to be filled"}
        if rel in old and old[rel].get("sha256") == entry["sha256"]:
            entry["commit"] = old[rel].get("commit", entry["commit"])
        entries.append(entry)
    manifest["files"] = sorted(entries, key=lambda e: e["path"])
    atomic_write(manifest_path, lambda tmp: tmp.write_text(json.dumps(manifest, indent=1) + "\n"))


def finalize_card(export_dir=ASSETS_CODE) -> Path:
    """Write export_dir/README.md (the model card) and this folder's entries in ../MANIFEST.json from the
    exported files and their training.json."""
    export_dir = Path(export_dir)
    trained = {r: json.loads((export_dir / r / "training.json").read_text())
               for r in ("target", "draft") if (export_dir / r / "training.json").exists()}
    tok_sha = file_sha256(export_dir / "tokenizer.json")
    vocab = len(json.loads((export_dir / "tokenizer.json").read_text())["model"]["vocab"])
    for role, t in trained.items():
        if t["tokenizer_sha256"] != tok_sha:
            raise VocabularyMismatch(f"the exported {role} was trained with another tokenizer than tokenizer.json")
    readme = _readme(export_dir, trained, vocab, tok_sha)
    (export_dir / "README.md").write_text(readme + _kept_sections(export_dir / "README.md", readme))
    _write_manifest(export_dir, trained)
    return export_dir / "README.md"
