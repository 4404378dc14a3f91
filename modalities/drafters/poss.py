"""PosS, position specialists (Huang et al. 2025, arXiv 2506.03566): an EAGLE head whose deeper drafted tokens come
from layers of their own.

    drafted token k ─► specialist min((k - 1) // per_layer, K - 1)     (k = 1, 2, ...; per_layer r = 1 by default)

An EAGLE head drafts token 1 from the target's true feature, but token k > 1 from features it predicted itself, whose
error grows with k; one layer serves every depth badly. PosS gives each depth its own decoder layer, trained on the
deviated features it will read there (the training unrolls the chain). The token embedding, the fc over
[embedding; feature] and the target's output rows stay shared.

Here specialist 0 and the fc are an EAGLE head of ours (`eagle`'s, frozen: the paper warm-starts from an EAGLE
checkpoint; freezing it keeps position 1 identical to `eagle`'s, so the two compare position by position), and a
PosS folder ships only specialists 1..K-1 with the fingerprint of the head it extends. Each specialist keeps its own
KV cache of the true pairs (caught up when the chain first reaches its depth in a step, together with that step's
drafted pairs), so its latency is a layer's, as for EAGLE; only the parameters grow.

Drafting and exactness are `eagle`'s (modalities/drafters/eagle.py): the law each drafted token was drawn from is
what the target verifies against.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import torch
from torch import nn

from specgen.errors import ModelNotFound
from specgen.modalities.drafters import eagle
from specgen.modalities.drafters.trained_files import file_stamp, target_sha256
from specgen.modalities.image.eagle_head.head import FC_FILE

RECORD_FILE = "poss.json"
WEIGHTS_FILE = "specialists.safetensors"


def base_fingerprint(folder: Path) -> dict:
    """sha256 of the EAGLE head files a PosS folder extends."""
    from specgen.modalities.training import file_sha256

    return {name: file_sha256(Path(folder) / name) for name in (FC_FILE, "model.safetensors")}


class PossHead(nn.Module):
    """An EAGLE head (`base`: fc and specialist 0, frozen) and `count - 1` further specialists, each one decoder
    layer like the base's (initialised as copies of it)."""

    def __init__(self, base: "eagle.TextEagleHead", count: int):
        super().__init__()
        if count < 2:
            raise ValueError("PosS needs at least two specialists")
        self.base = base
        for p in base.parameters():
            p.requires_grad_(False)
        self.specialists = nn.ModuleList(copy.deepcopy(base.body) for _ in range(count - 1))
        for p in self.specialists.parameters():
            p.requires_grad_(True)

    @property
    def count(self) -> int:
        return len(self.specialists) + 1

    def layer(self, index: int):
        """Specialist `index` (0: the base head's layer; past the last: the last) as a one-layer Llama model."""
        index = min(index, self.count - 1)
        return self.base.body if index == 0 else self.specialists[index - 1]

    def forward(self, token_embeddings, features, position_ids, depth: int = 1):
        """Training: a causal pass of the specialist of drafted position `depth` (1-based) over whole sequences."""
        body = self.layer(depth - 1)
        hidden = self.base.inputs(token_embeddings, features)
        return body.model(inputs_embeds=hidden, position_ids=position_ids).last_hidden_state

    def save(self, folder: Path, base_folder: Path, target_folder: str, record: dict) -> Path:
        """The specialists (fp16), the record (with the base head's fingerprint and the target's sha256) and a
        card, replacing `folder` as a whole."""
        import os
        import shutil

        from safetensors.torch import save_file

        from specgen.modalities.text.training.distill.windows import model_sha256

        folder = Path(folder)
        tmp = folder.with_name(f".{folder.name}.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        weights = {f"{j + 1}.{name}": value.detach().half().contiguous()
                   for j, body in enumerate(self.specialists) for name, value in body.state_dict().items()}
        save_file(weights, str(tmp / WEIGHTS_FILE))
        record = {**record, "specialists": self.count, "base": base_fingerprint(base_folder),
                  "target_sha256": model_sha256(target_folder)}
        (tmp / RECORD_FILE).write_text(json.dumps(record, indent=1))
        write_card(tmp, record)
        for path in tmp.iterdir():
            path.chmod(0o644)
        shutil.rmtree(folder, ignore_errors=True)
        os.replace(tmp, folder)
        return folder

    @classmethod
    def load(cls, folder: Path, base: "eagle.TextEagleHead") -> "PossHead":
        from safetensors.torch import load_file

        record = json.loads((Path(folder) / RECORD_FILE).read_text())
        head = cls(base, int(record["specialists"]))
        weights = load_file(str(Path(folder) / WEIGHTS_FILE))
        for j, body in enumerate(head.specialists):
            prefix = f"{j + 1}."
            body.load_state_dict({k[len(prefix):]: v.float() for k, v in weights.items() if k.startswith(prefix)})
        return head.eval()


def write_card(folder: Path, record: dict) -> None:
    before, after = record.get("before", {}), record.get("after", {})
    depths = sorted(int(k.removeprefix("alpha_depth")) for k in after if k.startswith("alpha_depth"))
    notice = ("**Gemma is provided under and subject to the Gemma Terms of Use found at ai.google.dev/gemma/terms.** "
              "These layers were trained on Gemma 3 270M's hidden states: a Model Derivative of Gemma (see "
              "../NOTICE), loaded only with the `gemma` extra.\n\n" if record.get("target") == "gemma" else "")
    rows = "".join(f"| {d} | {before.get(f'alpha_depth{d}')} | **{after.get(f'alpha_depth{d}')}** | "
                   f"{before.get(f'greedy_agreement_depth{d}')} | **{after.get(f'greedy_agreement_depth{d}')}** |\n"
                   for d in depths)
    (Path(folder) / "README.md").write_text(
        "# PosS position specialists (text)\n\n" + notice +
        f"{record.get('specialists', 0) - 1} decoder layers that draft positions 2.. of a chain for the EAGLE head "
        "beside them (`../eagle`, whose fc and layer, position 1, they share and leave unchanged); "
        "`specgen.modalities.drafters.poss`, docs/eagle.md.\n\n"
        f"- target: `{record.get('target')}`; {record.get('params', 0):,} trained parameters (fp16)\n"
        f"- data: the EAGLE head's ({record.get('windows')} windows of {record.get('window_len')} tokens); "
        f"{record.get('steps')} steps in {record.get('train_s')} s\n\n"
        f"Held out ({record.get('heldout_windows')} windows), reading the head's own predicted features from "
        "position 2 on; `before` is the EAGLE head alone:\n\n"
        "| drafted position | α before | α after | greedy agreement before | after |\n|---|---|---|---|---|\n"
        + rows + f"\nTrained with:\n\n```\n{record.get('command')}\n```\n")


# ---- finding a target's specialists ------------------------------------------------------------------------------


def poss_folders(model_path: str) -> list[Path]:
    """Beside each place an EAGLE head may be: `<model>/poss/`, a pair folder's `poss/`, assets/gemma/poss."""
    return [folder.parent / "poss" for folder in eagle.head_folders(model_path)]


_HEADS: dict[tuple, PossHead] = {}


def find_poss(model_path: str) -> tuple[Path, Path]:
    """(PosS folder, its EAGLE head's folder) trained for the very weights at `model_path` and the very head beside
    it; ModelNotFound naming the command otherwise."""
    command = ("train them with `specgen train head --method poss --model PATH --base EAGLE_HEAD` "
               "(docs/eagle.md)")
    try:
        base = eagle.find_head(model_path)
    except ModelNotFound:
        places = " or ".join(str(f) for f in eagle.head_folders(model_path))
        raise ModelNotFound(f"method 'poss' needs an EAGLE head and position specialists trained for the target "
                            f"{model_path} (no head trained for it in {places}); "
                            "train a head with `specgen train head --method eagle --model PATH`, then specialists "
                            "over it with `--method poss`") from None
    sha = target_sha256(model_path)
    for folder in poss_folders(model_path):
        path = folder / RECORD_FILE
        if not path.exists():
            continue
        record = json.loads(path.read_text())
        if record.get("target_sha256") == sha and record.get("base") == _fingerprint(base):
            return folder, base
    raise ModelNotFound(f"method 'poss' needs position specialists trained for the target {model_path} and its EAGLE "
                        f"head {base} (none in {' or '.join(str(f) for f in poss_folders(model_path))}); {command}")


_FINGERPRINTS: dict[tuple, dict] = {}


def _fingerprint(folder: Path) -> dict:
    key = tuple(file_stamp(Path(folder) / name) for name in (FC_FILE, "model.safetensors"))
    if key not in _FINGERPRINTS:
        _FINGERPRINTS[key] = base_fingerprint(folder)
    return _FINGERPRINTS[key]


def load_poss(folder: Path, base_folder: Path) -> tuple[PossHead, torch.Tensor | None]:
    """(head, the base's kept target ids or None), kept while the files are unchanged."""
    key = (file_stamp(Path(folder) / WEIGHTS_FILE), file_stamp(Path(base_folder) / FC_FILE))
    base, vocab_ids = eagle.load_head(base_folder)
    if key not in _HEADS:
        from specgen.modalities.text import gemma

        gemma.require_extra_for(folder)
        _HEADS[key] = PossHead.load(folder, base)
    return _HEADS[key], vocab_ids


def build_drafter(generator, knobs: dict, processing, policy, engine) -> "eagle.EagleDrafter":
    """The pipeline's `poss` drafter: `eagle`'s chain drafter over the target's EAGLE head and its specialists."""
    loaded = load_poss(*find_poss(generator.model_path))
    return eagle.build_drafter(generator, knobs, processing, policy, engine, loaded)
