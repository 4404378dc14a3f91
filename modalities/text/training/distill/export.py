"""What a distillation exports: the draft's fp16 weights, its reduced vocabulary (`vocab_ids.json`), the target's
tokenizer, the training summary and a model card."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from specgen.modalities.training import export_fp16


def export(draft, folder: Path, target_path: str, vocab_ids, summary: dict) -> Path:
    """fp16 weights, `vocab_ids.json` for a reduced vocabulary, the target's tokenizer and a model card."""
    def add_files(tmp: Path) -> None:
        for name in ("tokenizer.json", "tokenizer_config.json"):
            for source in (Path(target_path) / name, Path(target_path).parent / name):
                if source.exists():
                    shutil.copy(source, tmp / name)
                    break
        if vocab_ids is not None:
            (tmp / "vocab_ids.json").write_text(json.dumps(vocab_ids.tolist()))
        (tmp / "training.json").write_text(json.dumps(summary, indent=1))
        (tmp / "README.md").write_text(model_card(summary))

    return export_fp16(draft, folder, add_files)


def _before(summary: dict) -> str:
    before = summary.get("heldout_before")
    return f"{before['alpha']:.4f} at the start" if before else "start not measured"


def model_card(summary: dict) -> str:
    cfg, heldout = summary["config"], summary["heldout"]
    loss = {"ce": "cross-entropy on the text (no teacher)", "fkl": "forward KL(target ‖ draft)",
            "rkl": "reverse KL(draft ‖ target)", "jsd": f"JSD(β = {cfg['beta']})",
            "tvd": "total variation"}[cfg["loss"]]
    if cfg["adaspec"] is not None:
        loss += f", AdaSPEC token selection (keep {cfg['adaspec']:g}, reference `{cfg['reference']}`)"
    lines = [f"# Draft distilled from `{summary['target']}`", "",
             f"- Loss: {loss}; data: {cfg['data']} ({cfg['windows']} prompts of {cfg['prompt_len']} tokens, "
             f"{cfg['new_tokens']} continuation tokens with a loss each), temperature {cfg['temperature']:g}"
             + (f" (samples drawn at {cfg['sample_temperature']:g}, the teacher kept while sampling)"
                if cfg.get("sample_temperature") is not None else "") + f", top-{cfg['top_k']} teacher cache.",
             f"- Start: `{cfg['init'] or 'the shipped draft'}`; {summary['params']:,} parameters, stored fp16.",
             f"- {summary['steps']} AdamW steps × {cfg['batch_size']} windows, peak lr {cfg['lr']:g} "
             f"({cfg['warmup']} warm-up steps, cosine to 10 %), seed {cfg['seed']}, data seed {cfg['data_seed']}; "
             f"{summary['tokens_with_gradient']:,} tokens with a loss; {summary['wall_s']} s.",
             f"- Held-out ({heldout['positions']} positions of target samples, validation prompts): "
             f"**α = {heldout['alpha']:.4f}** (Σ min(target, draft); {_before(summary)}), greedy agreement "
             f"{heldout['greedy_agreement']:.4f}, " + (f"KL(target ‖ draft) {heldout['fkl']:.4f}." if "fkl" in heldout else
                                                       f"KL(target restricted to the vocabulary ‖ draft) "
                                                       f"{heldout['fkl_in_vocab']:.4f}.")]
    if "coverage" in summary:
        cov = summary["coverage"]
        lines.append(f"- Reduced vocabulary: {cov['vocab_size']} tokens (`vocab_ids.json`, target ids); target "
                     f"mass inside it (the ceiling on α): {cov['train']:.4f} on training samples, "
                     f"{cov['heldout']:.4f} held out.")
    if "prune" in summary:
        prune = summary["prune"]
        lines.append(f"- Pruned from the target: layers {prune['start']}..{prune['start'] + prune['block'] - 1} "
                     f"dropped (least angular distance; distances {[round(d, 4) for d in prune['distances']]}).")
    lines += ["", "Command:", "", "```", summary["command"], "```", ""]
    return "\n".join(lines)
