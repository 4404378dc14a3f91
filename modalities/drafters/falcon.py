"""Falcon (Gao et al. 2025, arXiv 2412.12639) for text: a semi-autoregressive head that drafts k tokens per forward.

    pair t = fc([embed(x_t); f_{t-1}]) ─► one decoder layer, pairs in blocks of k seeing their whole block ─►
    pair t's output predicts f_{t+k-1} ─► target output rows ─► the law of x_{t+k}

The head is EAGLE's (modalities/drafters/eagle.py: fc over the token's embedding and the target's feature, one
Llama decoder layer, the target's own output rows) with Falcon's relaxed causal mask: pairs come in blocks of k,
and a pair sees every pair up to the end of its block. The block's first pair then predicts what EAGLE's last pair
predicts, and the others predict one token further each, so one forward over the last k pairs of the context
(x_{L-1} pending) gives the laws of the k tokens after the pending one. The next forward feeds those k drafted
tokens with the head's own k predicted features as one block, and so on: budget k·n costs n head forwards where
EAGLE's chain costs k·n. A drafted token's law does not condition on the tokens drafted beside it in its block;
verification checks every one against the target, so this costs acceptance, never exactness.

The head's KV cache holds the true pairs only (one layer: a pair's keys and values depend on its own input, not on
the mask), so serving is EAGLE's catch-up with the last k pairs queried under the block mask; drafted blocks are
dropped from the cache after the proposal, as EAGLE's deeper pairs are.

Training (`specgen train head --method falcon`, modalities/text/training/eagle.py): the block mask at a random
phase, pair t predicting f_{t+k-1}; a second pass on the head's own predictions (a block reads the previous block's
outputs, as drafted blocks do), whose blocks read the true features instead for a share set by the first pass's
disagreement and annealed over training (Falcon's coupled sequential glancing distillation, in our reading).
Falcon's custom decoding tree is not built: `falcon` drafts a chain.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from specgen.kernels import sample_categorical
from specgen.modalities.drafters import eagle
from specgen.modalities.drafters.trained_files import file_stamp, trained_for
from specgen.modalities.image.eagle_head.head import FC_FILE
from specgen.samplers.noise import draft_uniforms
from specgen.samplers.types import DecodeContext, Draft

RECORD_FILE = "falcon.json"  # the training summary (block size in its config) and the target's identity


def block_visible(count: int, block: int, phase: int = 0) -> torch.Tensor:
    """[count, count] bool: pair i sees pair j when j's block is not after i's (blocks of `block` pairs, the first
    one `block - phase` long)."""
    blocks = (torch.arange(count) + phase) // block
    return blocks[None, :] <= blocks[:, None]


class FalconHead(eagle.TextEagleHead):
    """The EAGLE head's fc and decoder layer, trained under the block mask; `block` tokens per forward."""

    block = 2
    method = "falcon"
    record_file = RECORD_FILE

    def forward(self, token_embeddings, features, position_ids, depth: int = 1, visible=None):
        """Training: pairs [rows, n, d] under `visible` [n, n] (None: causal). Returns predicted features."""
        hidden = self.inputs(token_embeddings, features)
        mask = None if visible is None else visible[None, None].expand(len(hidden), 1, -1, -1)
        return self.body.model(inputs_embeds=hidden, position_ids=position_ids, attention_mask=mask).last_hidden_state

    def record_fields(self) -> dict:
        return {"block": self.block}

    def write_card(self, folder: Path, record: dict) -> None:
        write_card(folder, record, self.block)


def write_card(folder: Path, record: dict, block: int) -> None:
    before, after = record.get("before", {}), record.get("after", {})
    (Path(folder) / "README.md").write_text(
        "# Falcon head (text)\n\n"
        f"A semi-autoregressive draft head: one Llama decoder layer over fc([token embedding; target feature]) "
        f"whose pairs see their whole block of {block}, so one forward drafts {block} tokens; the target's own output "
        "rows turn its outputs into the draft's laws (`specgen.modalities.drafters.falcon`, docs/eagle.md § Falcon)."
        "\n\n"
        f"- target: `{record.get('target')}`; {record.get('params', 0):,} parameters (fp16); "
        f"{record.get('output_rows')} output rows\n"
        f"- data: {record.get('windows')} windows of {record.get('window_len')} tokens "
        f"({record.get('data_s')} s of target features); {record.get('steps')} steps in {record.get('train_s')} s\n"
        f"- held out ({record.get('heldout_windows')} windows, every block position together): on the target's "
        f"features α {before.get('alpha')} → **{after.get('alpha')}**, greedy agreement "
        f"{before.get('greedy_agreement')} → **{after.get('greedy_agreement')}**; on the head's own predictions "
        f"(a drafted block) α **{after.get('alpha_depth2')}**, greedy agreement "
        f"**{after.get('greedy_agreement_depth2')}**\n\n"
        f"Trained with:\n\n```\n{record.get('command')}\n```\n")


# ---- finding a target's head ------------------------------------------------------------------------------------


def falcon_folders(model_path: str) -> list[Path]:
    """Beside each place an EAGLE head may be: `<model>/falcon/`, a pair folder's `falcon/`."""
    return [folder.parent / "falcon" for folder in eagle.head_folders(model_path)]


def find_falcon(model_path: str) -> Path:
    """The head folder trained on the very weights at `model_path`; ModelNotFound naming the command otherwise."""
    return trained_for(model_path, falcon_folders(model_path), RECORD_FILE, method="falcon", what="a Falcon head")


_HEADS: dict[tuple, tuple] = {}


def load_falcon(folder: Path) -> tuple[FalconHead, torch.Tensor | None]:
    """(head with its block size, kept target ids or None), kept while the files are unchanged."""
    folder = Path(folder)
    key = file_stamp(folder / FC_FILE)
    if key not in _HEADS:
        from specgen.modalities.text import gemma

        gemma.require_extra_for(folder)
        head = FalconHead.load(folder)
        head.block = int(json.loads((folder / RECORD_FILE).read_text())["block"])
        vocab = folder / eagle.VOCAB_FILE
        _HEADS[key] = (head, torch.tensor(json.loads(vocab.read_text())) if vocab.exists() else None)
    return _HEADS[key]


# ---- serving ------------------------------------------------------------------------------------------------------


class FalconDrafter(eagle.EagleDrafter):
    """Falcon's head as a chain drafter (module docstring): the last `block` true pairs queried under the block
    mask give the first block's laws; each further forward feeds the block just drafted, on the head's own
    predicted features, and gives the next block's."""

    def __init__(self, target_model, target, head: FalconHead, processing, *, vocab_ids=None, output_rows: int = 0):
        super().__init__(target_model, target, head, processing, vocab_ids=vocab_ids, output_rows=output_rows)
        self.block = head.block

    def _first_block(self, ctx: DecodeContext) -> torch.Tensor:
        """Roll the head's cache back to the longest committed prefix, but at least the last `block` true pairs,
        feed them under the causal mask with the last `block` real slots one block, and return their outputs
        [rows, block, d]: the predicted features before the first `block` drafted tokens (zero for a context with
        fewer pairs than a block: uniform laws)."""
        rows, engine, block = ctx.rows.tolist(), self.engines[0], self.block
        inputs, positions, counts = self._true_inputs(ctx, self._roll_back(ctx, 0, keep=block))
        width = inputs.shape[1]  # >= min(block, pairs) per row
        if width == 0:
            return torch.zeros(len(rows), block, self.token_fc.shape[0])
        slots = torch.arange(width)
        valid = slots < counts[:, None]  # [rows, width]
        last = valid & (slots >= (counts - block)[:, None])  # the block the queries end on
        causal = torch.ones(width, width, dtype=torch.bool).tril()
        mask = (causal | (last[:, :, None] & last[:, None, :])) & valid[:, None, :]
        mask |= torch.eye(width, dtype=torch.bool)  # padding sees itself
        hidden = engine.score(inputs, positions, ctx.rows, mask)  # [rows, width, d]
        self.forward_calls += 1
        engine.commit(valid, ctx.rows)
        picks = (counts - block)[:, None] + torch.arange(block)  # [rows, block]
        outputs = hidden[torch.arange(len(rows))[:, None], picks.clamp(min=0)]
        return torch.where((counts >= block)[:, None, None], outputs, torch.zeros_like(outputs))

    def propose(self, ctx: DecodeContext, budget: int) -> Draft:
        rows, block, engine = ctx.rows, self.block, self.engines[0]
        self._start_step(ctx)
        outputs = self._first_block(ctx)  # [rows, block, d]
        true_lengths = engine.cache.lengths[rows].clone()
        positions = ctx.next_positions  # [rows] where the first drafted token goes
        uniforms = None if self.processing.greedy else draft_uniforms(ctx.seed, ctx.sample_ids, positions, budget)
        drafted, laws = [], []
        try:
            while True:
                logits = self._logits(outputs.flatten(0, 1)).view(len(rows), block, -1)  # [rows, block, kept]
                for j in range(min(block, budget - len(drafted))):
                    law = self.processing(logits[:, j])
                    index = law.argmax(-1) if uniforms is None else sample_categorical(law, uniforms[:, len(drafted)])
                    drafted.append(index if self.vocab_ids is None else self.vocab_ids[index])
                    laws.append(law)
                if len(drafted) == budget:
                    break
                # the block just drafted: its tokens on the features predicted before them, one block deeper
                pairs = self._pairs(torch.stack(drafted[-block:], 1), outputs)  # [rows, block, d]
                at = (positions + len(drafted) - block)[:, None] + torch.arange(block)
                outputs = engine.score(pairs, at, rows, torch.ones(len(rows), block, block, dtype=torch.bool))
                self.forward_calls += 1
                engine.cache.lengths[rows] += block
        finally:
            engine.cache.lengths[rows] = true_lengths  # only true pairs persist
        return Draft(torch.stack(drafted, 1), torch.stack(laws, 1), vocab_ids=self.vocab_ids)

    def run_summary(self) -> dict:
        return {**super().run_summary(), "block": self.block}


def build_drafter(generator, knobs: dict, processing, policy, engine) -> FalconDrafter:
    """The pipeline's `falcon` drafter for a text generator (its target model, folder and engine)."""
    head, vocab_ids = load_falcon(find_falcon(generator.model_path))
    return FalconDrafter(generator.model, engine, head, processing, vocab_ids=vocab_ids,
                         output_rows=knobs.get("output_rows", 0))
