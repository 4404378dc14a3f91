"""FastMTP (Cai et al. 2025, arXiv 2509.18362) for text: one multi-token-prediction module, its weights shared by
every drafted position, applied recursively; trained on the target's own continuations; and a draft vocabulary
compressed per request by the prompt's kind of text.

    pair t = fc([RMSNorm(embed(x_t)); RMSNorm(h_{t-1})]) ─► one decoder layer + norm ─► h_t ─► target output rows

The module is DeepSeek-V3's MTP block in FastMTP's use: the two inputs normed separately (the target's hidden state
and the head's own output live on different scales), projected, one transformer layer; step k + 1 reads step k's
output h in place of the target's. Serving is `eagle`'s chain (modalities/drafters/eagle.py: a position-indexed KV
cache of the true pairs, the target's feature store, deeper pairs on the module's own outputs), with the two norms
folded into the drafter's pairs. What differs from the EAGLE head is the training (modalities/text/training/eagle.py,
`--method mtp`): cross-entropy against the target's law only (no feature regression), the K recursive steps trained
together with weights decaying by depth, on self-distilled windows only, without input noise.

Vocabulary (FR-Spec, language-aware): the training windows' token counts per kind of text (`vocab_kinds.json`:
for Gemma "code" and "prose", each most frequent first). A request's draft rows are the first `output_rows` of the
kind whose list covers most of its prompt, plus the prompt's own tokens; tokens outside them have draft probability
0, so verification stays exact, and one drafted token reads `output_rows` rows of the output layer, not 262,144.
FastMTP picks English or Chinese lists; this machine has English prose and Python, so the kinds are those.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from specgen.modalities.drafters import eagle
from specgen.modalities.drafters.trained_files import file_stamp, trained_for
from specgen.modalities.image.eagle_head.head import FC_FILE, EagleHead

RECORD_FILE = "mtp.json"  # the training summary and the target's identity
NORMS_FILE = "norms.safetensors"  # the two input norms' weights
KINDS_FILE = "vocab_kinds.json"  # {kind: target ids, most frequent in that kind's training windows first}


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(dim)), eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * eagle.unit_rms(x, self.eps)


class MtpHead(eagle.TextEagleHead):
    """The EAGLE head's fc and decoder layer with FastMTP's two input norms; one module for every depth."""

    def __init__(self, config):
        super().__init__(config)
        self.embed_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.feature_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def inputs(self, token_embeddings, features):
        # [rows, n, d] each -> [rows, n, d]
        return self.fc(torch.cat([self.embed_norm(token_embeddings), self.feature_norm(features)], -1))

    def input_norms(self) -> tuple[torch.Tensor, torch.Tensor, float]:
        """(embedding norm weight [d], feature norm weight [d], eps): the drafter folds the weights into fc."""
        return self.embed_norm.weight.detach().float(), self.feature_norm.weight.detach().float(), self.embed_norm.eps

    def save(self, folder: Path, target_folder: str, vocab_ids: torch.Tensor | None, record: dict,
             kinds: dict[str, torch.Tensor] | None = None) -> Path:
        from safetensors.torch import save_file

        from specgen.modalities.text.training.distill.windows import model_sha256

        def extra(tmp: Path):
            save_file({"embed": self.embed_norm.weight.detach().half().contiguous(),
                       "feature": self.feature_norm.weight.detach().half().contiguous()}, str(tmp / NORMS_FILE))
            if vocab_ids is not None:
                (tmp / eagle.VOCAB_FILE).write_text(json.dumps([int(i) for i in vocab_ids]))
            if kinds:
                (tmp / KINDS_FILE).write_text(json.dumps({k: [int(i) for i in ids] for k, ids in kinds.items()}))
            (tmp / RECORD_FILE).write_text(json.dumps({**record, "target_sha256": model_sha256(target_folder)},
                                                      indent=1))
            write_card(tmp, record)

        return EagleHead.save(self, folder, add_files=extra)

    @classmethod
    def load(cls, folder: str | Path, dtype=torch.float32) -> "MtpHead":
        from safetensors.torch import load_file

        head = super().load(folder, dtype)
        norms = load_file(str(Path(folder) / NORMS_FILE))
        head.embed_norm.weight.data = norms["embed"].to(dtype)
        head.feature_norm.weight.data = norms["feature"].to(dtype)
        return head


def write_card(folder: Path, record: dict) -> None:
    after = record.get("after", {})
    depths = sorted(int(k.removeprefix("alpha_depth")) for k in after if k.startswith("alpha_depth"))
    before = record.get("before", {})
    notice = ("**Gemma is provided under and subject to the Gemma Terms of Use found at ai.google.dev/gemma/terms.** "
              "This module was trained on Gemma 3 270M's hidden states and reads its output layer: a Model Derivative "
              "of Gemma (see ../NOTICE), loaded only with the `gemma` extra.\n\n" if record.get("target") == "gemma"
              else "")
    rows = [f"| 1 | {before.get('alpha')} | **{after.get('alpha')}** | **{after.get('greedy_agreement')}** |"]
    rows += [f"| {d} | {before.get(f'alpha_depth{d}')} | **{after.get(f'alpha_depth{d}')}** | "
             f"**{after.get(f'greedy_agreement_depth{d}')}** |" for d in depths]
    kinds = record.get("kinds") or {}
    (Path(folder) / "README.md").write_text(
        "# FastMTP module (text)\n\n" + notice +
        "One multi-token-prediction module (fc over [RMSNorm(token embedding); RMSNorm(hidden)] and one Llama decoder "
        "layer), its weights shared by every drafted position; the target's own output rows turn its output into "
        "the draft's law (`specgen.modalities.drafters.mtp`, docs/eagle.md § FastMTP).\n\n"
        f"- target: `{record.get('target')}`; {record.get('params', 0):,} parameters (fp16); "
        f"{record.get('output_rows')} output rows in training"
        + (f"; per-kind vocabularies: {', '.join(f'{k} ({v:,} tokens)' for k, v in kinds.items())}" if kinds else "")
        + "\n"
        f"- data: {record.get('windows')} self-distilled windows of {record.get('window_len')} tokens "
        f"({record.get('data_s')} s of target continuations and features); {record.get('steps')} steps in "
        f"{record.get('train_s')} s; loss weights by depth {record.get('depth_weights')}\n\n"
        f"Held out ({record.get('heldout_windows')} windows); depth d reads the module's own outputs from depth 2 on:"
        "\n\n| drafted position | α before | α after | greedy agreement after |\n|---|---|---|---|\n"
        + "\n".join(rows) + f"\n\nTrained with:\n\n```\n{record.get('command')}\n```\n")


# ---- finding a target's module ----------------------------------------------------------------------------------


def mtp_folders(model_path: str) -> list[Path]:
    """Beside each place an EAGLE head may be: `<model>/mtp/`, a pair folder's `mtp/`, assets/gemma/mtp."""
    return [folder.parent / "mtp" for folder in eagle.head_folders(model_path)]


def find_mtp(model_path: str) -> Path:
    """The module folder trained on the very weights at `model_path`; ModelNotFound naming the command otherwise."""
    return trained_for(model_path, mtp_folders(model_path), RECORD_FILE, method="mtp", what="a FastMTP module")


_HEADS: dict[tuple, tuple] = {}


def load_mtp(folder: Path) -> tuple[MtpHead, torch.Tensor | None, dict[str, torch.Tensor]]:
    """(module, kept target ids or None, per-kind ids), kept while the files are unchanged."""
    folder = Path(folder)
    key = (file_stamp(folder / FC_FILE), file_stamp(folder / NORMS_FILE))
    if key not in _HEADS:
        from specgen.modalities.text import gemma

        gemma.require_extra_for(folder)
        vocab, kinds = folder / eagle.VOCAB_FILE, folder / KINDS_FILE
        _HEADS[key] = (MtpHead.load(folder),
                       torch.tensor(json.loads(vocab.read_text())) if vocab.exists() else None,
                       {k: torch.tensor(v) for k, v in json.loads(kinds.read_text()).items()} if kinds.exists()
                       else {})
    return _HEADS[key]


def choose_kind(kinds: dict[str, torch.Tensor], context: torch.Tensor, rows: int) -> str | None:
    """The kind whose first `rows` ids cover most of the context's tokens (the first listed on a tie; None: no
    kinds). FastMTP's language detection, on the kinds of text this machine has."""
    best, covered = None, -1
    for kind, ids in kinds.items():
        count = int(torch.isin(context, ids[:rows]).sum())
        if count > covered:
            best, covered = kind, count
    return best


def build_drafter(generator, knobs: dict, processing, policy, engine) -> "eagle.EagleDrafter":
    """The `mtp` drafter; knob `vocabulary` picks the rows' list: the prompt's kind's, the global one, or none."""
    head, vocab_ids, kinds = load_mtp(find_mtp(generator.model_path))
    vocabulary, rows = knobs.get("vocabulary", "kind"), knobs.get("output_rows", 0)
    if vocabulary != "kind":
        kinds = {}
    if vocabulary == "full":
        vocab_ids, rows = None, 0
    return eagle.EagleDrafter(generator.model, engine, head, processing, vocab_ids=vocab_ids,
                              output_rows=rows, vocab_kinds=kinds,
                              stop_policy=policy if hasattr(policy, "stop") else None)
