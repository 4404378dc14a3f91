"""EAGLE (Li et al. 2024, arXiv 2401.15077) for text: a one-layer head drafts from the target's own features.

    pair t = fc([embed(x_t); f_{t-1}]) ─► one decoder layer (own KV cache) ─► f̂_t ─► target output rows ─► law

f_t is the target's final-normed hidden state at position t, which the target computes anyway while it verifies
(`TransformersTarget.keep_features`: a position-indexed feature store that rolls back with the KV cache, so after
every step it holds the features of exactly the committed tokens but the pending one). A row whose context is
x_0..x_{L-1} (x_{L-1} pending) has features f_0..f_{L-2}; the head's cache holds the true pairs 1..L-1, and the last
one's output f̂_{L-1} gives the law of the first drafted token. Deeper tokens feed on the head's own predicted
features (pair L = fc([embed(d_1); f̂_{L-1}]), ...), as in EAGLE-1; those pairs are dropped from the head's cache
after the proposal, so only true pairs persist.

Output layer: the target's own rows, all of them or a reduced set (`vocab_ids.json`, the most frequent tokens of the
head's training data: FastMTP's and the reduced-vocabulary draft's argument): a token outside it has draft
probability 0 and can never be proposed, so verification stays exact. For Gemma 3 270M the kept rows are the served
int8 rows themselves (its 262,144-row output layer is most of a target step; 16,384 rows are 1/16 of it).

Exactness: the draft's law enters only as `draft_probs`, the law each drafted token was drawn from; the target
verifies every drafted token (chain rejection sampling, greedy matching at temperature 0). The features feed the
draft only, so stale or wrong features cost acceptance, never exactness (tests/modalities/test_eagle_text.py).
"""

from __future__ import annotations

import json
import weakref
from pathlib import Path

import torch
import torch.nn.functional as F

from specgen.errors import InvalidRequest
from specgen.kernels import sample_categorical
from specgen.modalities.drafters.model import common_prefix
from specgen.modalities.drafters.trained_files import file_stamp, trained_for
from specgen.modalities.image.eagle_head.head import FC_FILE, EagleHead
from specgen.modalities.runtime.transformers_adapter import TransformersTarget
from specgen.samplers.length_policies import ChainStops
from specgen.samplers.noise import draft_uniforms
from specgen.samplers.processing import Processing
from specgen.samplers.types import DecodeContext, Draft

RECORD_FILE = "eagle.json"  # the training summary and the target's identity
VOCAB_FILE = "vocab_ids.json"  # target ids of the kept output rows (absent: the whole vocabulary)


def unit_rms(x: torch.Tensor, eps: float) -> torch.Tensor:
    """x / RMS(x) over the last dimension (an RMSNorm without its weight), in float32 (one fused op: a drafted
    token takes two)."""
    return F.rms_norm(x.float(), (x.shape[-1],), eps=eps)


class TextEagleHead(EagleHead):
    """`EagleHead` (fc over [embedding; feature] and one Llama decoder layer) sized for a text target: `heads`
    attention heads over the target's width with `kv_heads` key/value heads, a plain rotary embedding."""

    @classmethod
    def for_target(cls, target_model, *, intermediate_size: int = 1024, heads: int = 4,
                   kv_heads: int = 1) -> "TextEagleHead":
        from transformers import LlamaConfig

        config = target_model.config
        return cls(LlamaConfig(hidden_size=config.hidden_size, intermediate_size=intermediate_size,
                               num_hidden_layers=1, num_attention_heads=heads, num_key_value_heads=kv_heads,
                               vocab_size=1, max_position_embeddings=config.max_position_embeddings,
                               rms_norm_eps=1e-6, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                               bos_token_id=None, eos_token_id=None, pad_token_id=None, tie_word_embeddings=False))

    def forward(self, token_embeddings, features, position_ids, depth: int = 1):
        """Training: one layer serves every drafted position `depth` (PosS gives each its own)."""
        return super().forward(token_embeddings, features, position_ids)

    def layer(self, index: int):
        return self.body

    record_file = RECORD_FILE

    def record_fields(self) -> dict:
        """What the record adds to the training summary beside the target's identity (a kind of head's own)."""
        return {}

    def write_card(self, folder: Path, record: dict) -> None:
        write_card(folder, record)

    def save(self, folder: Path, target_folder: str, vocab_ids: torch.Tensor | None, record: dict) -> Path:
        from specgen.modalities.text.training.distill.windows import model_sha256

        def extra(tmp: Path):
            if vocab_ids is not None:
                (tmp / VOCAB_FILE).write_text(json.dumps([int(i) for i in vocab_ids]))
            (tmp / self.record_file).write_text(json.dumps(
                {**record, **self.record_fields(), "target_sha256": model_sha256(target_folder)}, indent=1))
            self.write_card(tmp, record)

        return super().save(folder, add_files=extra)


def write_card(folder: Path, record: dict) -> None:
    before, after = record.get("before", {}), record.get("after", {})
    notice = ("**Gemma is provided under and subject to the Gemma Terms of Use found at ai.google.dev/gemma/terms.** "
              "This head was trained on Gemma 3 270M's hidden states and reads its output layer: a Model Derivative "
              "of Gemma (see ../NOTICE), loaded only with the `gemma` extra.\n\n" if record.get("target") == "gemma"
              else "")
    (Path(folder) / "README.md").write_text(
        "# EAGLE head (text)\n\n" + notice +
        "One Llama decoder layer over fc([token embedding; target feature]) that predicts the target's next "
        "final-normed hidden state; the target's own output rows turn it into the draft's law "
        "(`specgen.modalities.drafters.eagle`, docs/eagle.md).\n\n"
        f"- target: `{record.get('target')}`; {record.get('params', 0):,} parameters (fp16); "
        f"{record.get('output_rows')} output rows\n"
        f"- data: {record.get('windows')} windows of {record.get('window_len')} tokens "
        f"({record.get('data_s')} s of target features); {record.get('steps')} steps in {record.get('train_s')} s\n"
        f"- held out ({record.get('heldout_windows')} windows, teacher-forced): α {before.get('alpha')} → "
        f"**{after.get('alpha')}**, greedy agreement {before.get('greedy_agreement')} → "
        f"**{after.get('greedy_agreement')}**"
        + (f"; reading its own predicted features (depth 2) α **{after['alpha_depth2']}**, greedy agreement "
           f"**{after['greedy_agreement_depth2']}**" if "alpha_depth2" in after else "") + "\n\n"
        f"Trained with:\n\n```\n{record.get('command')}\n```\n")


# ---- finding a target's head ------------------------------------------------------------------------------------


def head_folders(model_path: str) -> list[Path]:
    """Where a target's head may be: `<model>/eagle/`, a pair folder's `eagle/` (assets/code/eagle) and, for the
    served Gemma, assets/gemma/eagle."""
    from specgen.modalities.assets import assets_dir
    from specgen.modalities.text import gemma

    model = Path(model_path)
    folders = [model / "eagle", model.parent / "eagle"]
    if gemma.is_served(model_path):
        folders.append(assets_dir() / "gemma" / "eagle")
    return folders


_HEADS: dict[tuple, "TextEagleHead"] = {}


def find_head(model_path: str) -> Path:
    """The head folder trained on the very weights at `model_path`; ModelNotFound naming the command otherwise."""
    return trained_for(model_path, head_folders(model_path), RECORD_FILE, method="eagle", what="an EAGLE head")


def load_head(folder: Path) -> tuple["TextEagleHead", torch.Tensor | None]:
    """(head, kept target ids or None), kept while the files are unchanged."""
    folder = Path(folder)
    key = file_stamp(folder / FC_FILE)
    if key not in _HEADS:
        from specgen.modalities.text import gemma

        gemma.require_extra_for(folder)
        _HEADS[key] = TextEagleHead.load(folder)
    vocab = folder / VOCAB_FILE
    return _HEADS[key], torch.tensor(json.loads(vocab.read_text())) if vocab.exists() else None


# ---- serving ------------------------------------------------------------------------------------------------------


_OUTPUT_LAYERS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # model -> {kept ids key: layer}


def output_layer(target_model, vocab_ids: torch.Tensor | None, keep: bool = True):
    """x -> logits over the kept rows of the target's output layer, as int8 rows (`Int8Linear`): the served int8
    rows themselves for Gemma, float rows quantised per row otherwise. One drafted token reads the whole layer, so
    a quarter of the bytes is most of a drafted token's cost; the draft's law is what this computes, so exactness
    does not depend on it. Kept per model and kept set (a request builds its drafter), unless `keep` is False
    (a request's own set)."""
    from specgen.modalities.runtime.int8_linear import Int8Linear, quantize_rows

    key = None if vocab_ids is None else hash(vocab_ids.long().numpy().tobytes())
    layers = _OUTPUT_LAYERS.setdefault(target_model, {}) if keep else {}
    if key not in layers:
        head = target_model.lm_head
        if hasattr(head, "qweight"):  # already int8 rows
            layers[key] = head if vocab_ids is None else Int8Linear(head.qweight[vocab_ids].contiguous(),
                                                                    head.scales[vocab_ids])
        else:
            weight = head.weight.detach().float()
            layers[key] = Int8Linear(*quantize_rows(weight if vocab_ids is None else weight[vocab_ids]))
    return layers[key]


class EagleDrafter:
    """The EAGLE head as a chain drafter over a text target (module docstring). `target` is the engine the loop
    verifies with (a `TransformersTarget`); its feature store is switched on here. A `PossHead` (PosS,
    modalities/drafters/poss.py) drafts token k with its specialist k - 1 (the last past its count), each with
    its own cache; a `TextEagleHead` is the one-specialist case."""

    def __init__(self, target_model, target: TransformersTarget, head, processing: Processing, *,
                 vocab_ids: torch.Tensor | None = None, capacity: int | None = None, output_rows: int = 0,
                 stop_policy=None, vocab_kinds: dict[str, torch.Tensor] | None = None):
        """output_rows > 0 (a head with a kept vocabulary, which lists its tokens most frequent first): the draft's
        output rows are the first `output_rows` of them and every token of the request's context (FastMTP's
        per-request vocabulary, in its simplest form: what the prompt may make the target copy stays proposable),
        chosen at the first proposal; with `vocab_kinds` (FastMTP's per-language lists, modalities/drafters/mtp.py)
        the first `output_rows` of the kind that covers most of the context. stop_policy: a token-wise length rule
        (`length_schedule` svip or kangaroo: `stop(law, previous_law, index)`, asked before each drafted token after
        the first, on the head's temperature-1 laws), as for a draft model. A FastMTP module (`input_norms`) has its
        two RMSNorms' weights folded into fc's columns here and the unit RMS taken in `_pairs`."""
        method = getattr(head, "method", None) or ("poss" if hasattr(head, "specialists") else
                                                    "mtp" if hasattr(head, "input_norms") else "eagle")
        if target.runner is None:
            raise InvalidRequest(f"method '{method}' needs a Llama or Gemma 3 target (its features come from our "
                                 "runner)")
        if processing.constraint is not None:
            raise InvalidRequest(f"method '{method}' does not take a prefix constraint; use 'draft' or 'ngram'")
        target.keep_features()
        self.target, self.processing, self.stop_policy = target, processing, stop_policy
        self.embed = target_model.model.embed_tokens  # Gemma's scales by sqrt(d), as in training
        fc = getattr(head, "base", head).fc.weight.detach().float()  # PosS shares its base head's fc
        dim = fc.shape[0]
        self.token_fc, self.feature_fc = fc[:, :dim].contiguous(), fc[:, dim:].contiguous()
        self.norm_eps = None  # FastMTP's input norms: their weights folded into fc's columns, the unit RMS in _pairs
        if hasattr(head, "input_norms"):
            embed_weight, feature_weight, self.norm_eps = head.input_norms()
            self.token_fc, self.feature_fc = self.token_fc * embed_weight, self.feature_fc * feature_weight
        self.vocab_kinds, self.kind = vocab_kinds or {}, None
        self.vocab_ids = None if vocab_ids is None else torch.as_tensor(vocab_ids, dtype=torch.long)
        self.output_rows = output_rows if self.vocab_ids is not None and output_rows < len(self.vocab_ids) else 0
        self.target_model = target_model
        self.out = None if self.output_rows else output_layer(target_model, self.vocab_ids)
        self.softcap = getattr(target_model.config, "final_logit_softcapping", None)
        # one engine (own KV cache) per specialist: engines[0] reads the true pairs, engines[j] drafts token j + 1
        self.engines = [TransformersTarget(head.layer(j), capacity=capacity or target.capacity, decode_kernel=True)
                        for j in range(getattr(head, "count", 1))]
        self.cached: list[list[list[int]]] = []  # per engine, per row: x_0..x_m, whose pairs 1..m its cache holds
        self._own: dict[int, tuple] = {}  # row -> (context, features) computed here, outside a run (`_features`)
        self.forward_calls = 0
        self._step_contexts: dict[int, list[int]] = {}  # this step's per-row contexts and true pairs (`_true_pairs`)
        self._step_pairs: dict[int, tuple[int, torch.Tensor]] = {}
        self.confidence: torch.Tensor | None = None  # [rows, drafted] top-1 of the temperature-1 law (TETRIS)

    def _pairs(self, tokens: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        """fc([embed(tokens); features]): tokens [...], features [..., d] -> [..., d]."""
        embeddings, features = self.embed(tokens).float(), features.float()
        if self.norm_eps is not None:
            embeddings, features = unit_rms(embeddings, self.norm_eps), unit_rms(features, self.norm_eps)
        return F.linear(embeddings, self.token_fc) + F.linear(features, self.feature_fc)

    def _logits(self, features: torch.Tensor) -> torch.Tensor:
        logits = self.out(features).float()  # [rows, kept]
        return torch.tanh(logits / self.softcap) * self.softcap if self.softcap else logits

    def _reset(self, batch: int) -> None:
        for engine in self.engines:
            engine.prefill([torch.zeros(1, dtype=torch.long)] * batch)  # empty caches
        self.cached = [[[] for _ in range(batch)] for _ in self.engines]

    def _catch_up(self, ctx: DecodeContext, index: int = 0, drafted: torch.Tensor | None = None) -> torch.Tensor:
        """Roll each row's cache of specialist `index` back to its longest prefix still committed, feed the true
        pairs t up to the pending token's (pair t, t >= 1: token x_t with the target's feature f_{t-1}, at position
        t, as in training), then this step's `drafted` pairs [rows, k, d] (positions L.., a deeper specialist's
        first use in a step), all in one forward, and return its output at the last pair [rows, d]: the predicted
        feature of the pending token, or of the last drafted one (zero for a one-token context without drafted
        pairs, which has no pair: its draft law is then uniform)."""
        rows, engine = ctx.rows.tolist(), self.engines[index]
        feeds = self._roll_back(ctx, index)
        extra = 0 if drafted is None else drafted.shape[1]
        inputs, positions, counts = self._true_inputs(ctx, feeds, extra)
        width = inputs.shape[1] - extra
        if width + extra == 0:
            return torch.zeros(len(rows), self.token_fc.shape[0])
        if extra:
            inputs[:, width:] = drafted
            positions[:, width:] = ctx.next_positions[:, None] + torch.arange(extra)
        valid = torch.cat([torch.arange(width) < counts[:, None], torch.ones(len(rows), extra, dtype=torch.bool)], 1)
        mask = None
        if not bool(valid.all()):
            causal = torch.ones(width + extra, width + extra, dtype=torch.bool).tril()
            mask = (causal & valid[:, None, :]) | torch.eye(width + extra, dtype=torch.bool)  # padding sees itself
        hidden = engine.score(inputs, positions, ctx.rows, mask)  # [rows, width + extra, d]
        self.forward_calls += 1
        engine.commit(valid, ctx.rows)  # drafted pairs too: a deeper level attends to them (dropped after)
        if extra:
            return hidden[:, -1]
        last = hidden[torch.arange(len(rows)), (counts - 1).clamp(min=0)]
        return torch.where((counts > 0)[:, None], last, torch.zeros_like(last))

    def _roll_back(self, ctx: DecodeContext, index: int, keep: int = 0) -> list[tuple[int, int]]:
        """Per row, (start, end) of the true pairs to feed specialist `index` this step: from its longest cached
        prefix still committed (but at least the last `keep` pairs again) up to the pending token's; its cache is
        rolled back to the pairs before `start`."""
        feeds = []
        for i, row in enumerate(ctx.rows.tolist()):
            context = self._step_contexts.setdefault(i, ctx.tokens[i].tolist())
            start = max(min(common_prefix(self.cached[index][row], context), len(context) - keep), 1)
            self.engines[index].cache.lengths[row] = start - 1  # pair t sits at slot t - 1
            feeds.append((start, len(context)))
            self.cached[index][row] = context
        return feeds

    def _true_inputs(self, ctx: DecodeContext, feeds: list[tuple[int, int]], extra: int = 0):
        """The pairs of `feeds` left-aligned per row, with `extra` free slots after the widest: inputs [rows, width +
        extra, d], positions [rows, width + extra] (padding at the row's next position, never kept) and the counts of
        true pairs [rows]."""
        counts = torch.tensor([end - start for start, end in feeds])  # [rows] true pairs to feed, >= 0
        width = int(counts.max())
        inputs = torch.zeros(len(feeds), width + extra, self.token_fc.shape[0])
        positions = torch.zeros(len(feeds), width + extra, dtype=torch.long)
        for i, (start, end) in enumerate(feeds):
            inputs[i, :end - start] = self._true_pairs(ctx, i, int(ctx.rows[i]), start, end)
            positions[i, :end - start] = torch.arange(start, end)
            positions[i, end - start:width] = end
        return inputs, positions, counts

    def _true_pairs(self, ctx: DecodeContext, i: int, row: int, start: int, end: int) -> torch.Tensor:
        """[end - start, d] row i's true pairs start..end-1, computed once per step and shared by the specialists
        (they read the same committed tokens and target features)."""
        first, vectors = self._step_pairs.get(i, (end, None))
        if start < first:
            t = torch.arange(start, first)
            fresh = self._pairs(ctx.tokens[i][t], self._features(row, ctx.tokens[i])[t - 1])
            first, vectors = start, fresh if vectors is None else torch.cat([fresh, vectors])
            self._step_pairs[i] = (first, vectors)
        return vectors[start - first:end - first] if vectors is not None else torch.zeros(0, self.token_fc.shape[0])

    def _features(self, row: int, context: torch.Tensor) -> torch.Tensor:
        """[>= L - 1, d] the target's features of the committed context but the pending token: its feature store
        while the target serves this row. A proposal outside a run (auto's calibration times one on a prompt the
        target never prefilled) gets them from one forward of the target's own, kept for that context."""
        target = self.target
        if target.cache is not None and row < len(target.cache.lengths) and target.features is not None \
                and int(target.cache.lengths[row]) == len(context) - 1:
            return target.features[row]
        key = tuple(context[:-1].tolist())
        if not key:  # one token: no pair reads a feature
            return torch.zeros(0, self.token_fc.shape[0])
        if self._own.get(row, (None,))[0] != key:
            with torch.no_grad():
                hidden = self.target_model.model(input_ids=context[None, :-1].long()).last_hidden_state[0]
            self._own[row] = (key, hidden.float())
        return self._own[row][1]

    def _request_rows(self, ctx: DecodeContext) -> None:
        """The per-request output rows (`output_rows`): the most frequent kept tokens and the context's."""
        context = torch.cat([t.long() for t in ctx.tokens])
        ranked = self.vocab_ids
        if self.vocab_kinds:
            from specgen.modalities.drafters.mtp import choose_kind

            self.kind = choose_kind(self.vocab_kinds, context, self.output_rows)
            ranked = self.vocab_kinds[self.kind]
        self.vocab_ids = torch.unique(torch.cat([ranked[:self.output_rows], context]))  # sorted target ids
        self.out = output_layer(self.target_model, self.vocab_ids, keep=False)

    def begin(self, ctx: DecodeContext) -> torch.Tensor:
        """A step's start: the request's output rows (first step), caches for every row, the first specialist
        caught up. Returns [rows, d] the pending token's predicted feature (its law: `_logits`)."""
        self._start_step(ctx)
        return self._catch_up(ctx)

    def _start_step(self, ctx: DecodeContext) -> None:
        """The request's output rows (first step), caches for every row, this step's per-row contexts and pairs."""
        rows = ctx.rows
        if self.out is None:
            self._request_rows(ctx)
        if not self.cached or len(self.cached[0]) <= int(rows.max()):
            self._reset(max(int(rows.max()) + 1, len(self.cached[0]) if self.cached else 0))
        self._step_contexts, self._step_pairs = {}, {}  # per row of this step, shared by the specialists

    def propose(self, ctx: DecodeContext, budget: int) -> Draft:
        rows = ctx.rows
        features = self.begin(ctx)  # [rows, d]: the pending token's predicted feature
        positions = ctx.next_positions  # [rows] where the first drafted token goes
        true_lengths = {0: self.engines[0].cache.lengths[rows].clone()}  # per specialist used in this step
        drafted, laws, confidence, pairs = [], [], [], []
        stops = ChainStops(self.stop_policy, len(rows), budget)  # rows that stop keep drafting; they are cut after
        uniforms = None if self.processing.greedy else draft_uniforms(ctx.seed, ctx.sample_ids, positions, budget)
        try:
            for d in range(budget):
                logits = self._logits(features)
                plain = logits.softmax(-1)  # the temperature-1 law: the stop rules' input and the confidence
                if stops.all_stop(plain, d):
                    break
                law = self.processing(logits)  # [rows, kept]
                confidence.append(plain.max(-1).values)
                if self.processing.greedy:
                    index = law.argmax(-1)
                else:
                    index = sample_categorical(law, uniforms[:, d])
                token = index if self.vocab_ids is None else self.vocab_ids[index]
                drafted.append(token)
                laws.append(law)
                if d + 1 == budget:
                    break
                # the drafted token's pair, on the predicted feature, one slot deeper; kept for the next level
                pairs.append(self._pairs(token, features))  # [rows, d]
                index = min(d + 1, len(self.engines) - 1)  # the specialist of drafted token d + 2
                engine = self.engines[index]
                if index not in true_lengths:  # its first use in this step: its true pairs and this step's drafted
                    features = self._catch_up(ctx, index, torch.stack(pairs, 1))
                    true_lengths[index] = engine.cache.lengths[rows] - len(pairs)
                    continue
                features = engine.score(pairs[-1][:, None], (positions + d)[:, None], rows)[:, 0]
                self.forward_calls += 1
                engine.cache.lengths[rows] += 1
        finally:
            for index, lengths in true_lengths.items():
                self.engines[index].cache.lengths[rows] = lengths  # only true pairs persist
        self.confidence = torch.stack(confidence, 1)
        ragged = stops.ragged(len(drafted))
        return Draft(torch.stack(drafted, 1), torch.stack(laws, 1), num_drafted=ragged, vocab_ids=self.vocab_ids)

    def observe(self, verdict) -> None:
        pass  # the target's feature store rolled back with its cache; the next catch-up compares tokens

    def run_summary(self) -> dict:
        return {"head_forwards": self.forward_calls,
                "output_rows": None if self.vocab_ids is None else len(self.vocab_ids),
                **({"vocabulary": self.kind} if self.kind else {})}


def build_drafter(generator, knobs: dict, processing: Processing, policy, engine, loaded=None) -> EagleDrafter:
    """The pipeline's `eagle` drafter for a text generator (its target model, folder and engine); `loaded`, a
    (head, kept ids) pair, drafts with another head over the same chain (`poss`'s specialists)."""
    head, vocab_ids = loaded or load_head(find_head(generator.model_path))
    return EagleDrafter(generator.model, engine, head, processing, vocab_ids=vocab_ids,
                        output_rows=knobs.get("output_rows", 0),
                        stop_policy=policy if hasattr(policy, "stop") else None)
