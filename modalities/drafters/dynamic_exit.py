"""DEL (Entezari Zarch et al. 2025, arXiv 2504.05598): self-speculation whose exit layer and draft length are chosen
every step from the acceptance each exit layer *would* have had, read off the target's own verification.

The self-drafts are Kangaroo's (modalities/drafters/kangaroo.py): the target's first ℓ layers, the adapter trained
for exit layer ℓ and the target's output layer; every exit layer with an adapter trained for the target is a
candidate. Each step:

    the target verified the last window ──► its residual stream after ℓ layers at every committed token (kept by
        the target at no extra forward: `TransformersTarget.keep_layer_features`)
    ──► shadow tokens: each other candidate's adapter (its own KV cache over the committed tokens) and output layer
        give the token exit ℓ would have drafted there; matches with the committed next token update α̂_ℓ (the
        drafting exit's α̂ comes from its own verified drafts)
    ──► choose (ℓ, d) maximising tokens per second  E(α̂_ℓ, d) / (d · t_ℓ + T(d + 1))
    ──► exit ℓ's self-draft drafts d tokens; the full target verifies them (exact rejection sampling)

E(α, d) = (1 − α^(d+1)) / (1 − α) is the expected tokens per step; t_ℓ the measured seconds per draft forward at ℓ
(a candidate not run yet: a measured one's scaled by ℓ + HEAD_LAYERS layer equivalents); T(n) the target's
forward over n slots, measured once per process, plus the loop's own per-step time read off this run. The paper's
Token-per-Layer, E / (d·ℓ + L), counts loaded layers as the cost on a GPU; on this CPU neither side is
proportional to its layers (the compiled step multiplies a window's slots in pairs, so T rises in steps; the
output layer and the adapter cost half a layer), so the same ratio is taken in measured seconds (our choice).
α̂_ℓ is an exponentially weighted match rate over the generated tokens (half-life about 34 tokens), started from
the adapter's held-out greedy agreement; the exit layer changes only for a predicted gain of 10 % or more (a new
exit catches its cache up first), and of the draft lengths within 2 % of the best the shortest is taken.

DEL's third part, the dynamic draft exit (`draft_exit calibrated`: stop a row's chain where the chance that its
drafted tokens are all accepted, from the exit's measured match rate per draft confidence, no longer pays for
another token) is a knob, off by default: on the code target it lost to the chosen length (docs/self_speculation.md).

Exactness never depends on any of this: the choice only picks which drafter proposes and how many tokens, each
drafted token is reported with the law it was drawn from, and the target's chain rule decides.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from specgen.errors import InvalidRequest
from specgen.kernels import decode_step
from specgen.modalities.drafters.kangaroo import (KangarooDrafter, find_adapters, load_adapter, read_record,
                                                  self_draft_runner)
from specgen.modalities.drafters.model import common_prefix
from specgen.modalities.runtime.transformers_adapter import TransformersTarget, measure_window_s
from specgen.samplers.processing import Processing
from specgen.samplers.stats import expected_tokens_per_step
from specgen.samplers.types import DecodeContext, Draft, Verdict

DECAY = 0.98  # per generated token: the weight of older shadow matches in α̂ (half-life ~34 tokens)
PRIOR_WEIGHT = 8.0  # tokens' worth of the adapter's held-out agreement in α̂ before any match is seen
SWITCH_GAIN = 1.1  # a new exit layer must promise this much more throughput (switching costs a catch-up forward)
# the adapter (attention only) and the output layer together, in decoder layers' worth of a draft forward's time
# (the code target: 0.73 ms at ℓ = 1 and 1.40 ms at ℓ = 2 put them near half a layer)
HEAD_LAYERS = 0.5
NEAR_BEST = 0.98  # a draft length predicted within this share of the best rate counts as the best
SHADOW_EVERY = 4  # steps between shadow updates (each feeds every token committed since the last)
SHADOW_POSITIONS = 4  # per row and update, the latest committed positions whose shadow tokens are compared
BINS = 10  # confidence bins of the dynamic draft exit's calibration
CALIBRATION_PRIOR = 4.0  # positions' worth of the exit's α̂ in each bin's match rate


@dataclass(frozen=True)
class ExitChoice:
    """One step's decision: the exit layer, the draft length, and the predicted throughput behind it."""

    exit_layer: int
    length: int
    tokens_per_s: float


def choose_exit(alphas: dict[int, float], draft_token_s: dict[int, float], step_s, max_length: int,
                current: int | None = None) -> ExitChoice:
    """(ℓ, d) maximising E(α_ℓ, d) / (d · t_ℓ + T(d + 1)) over the candidates and d in 1..max_length (the shortest
    d within NEAR_BEST of it), where t_ℓ = draft_token_s[ℓ] and `step_s(n)` is T(n). The `current` exit layer is
    kept unless another promises SWITCH_GAIN times its best."""
    best: dict[int, ExitChoice] = {}
    for layer, alpha in alphas.items():
        alpha = min(max(alpha, 0.0), 0.999)
        rates = {d: expected_tokens_per_step(alpha, d) / (d * draft_token_s[layer] + step_s(d + 1))
                 for d in range(1, max_length + 1)}
        # the shortest d within NEAR_BEST of the best: at α̂ ≈ 0.9 the rate is nearly flat in d, and a shorter draft
        # loses less where α̂ overestimates the next tokens' acceptance
        top_rate = max(rates.values())
        length = min(d for d, rate in rates.items() if rate >= NEAR_BEST * top_rate)
        best[layer] = ExitChoice(layer, length, rates[length])
    top = max(best.values(), key=lambda c: (c.tokens_per_s, -c.exit_layer))
    if current in best and top.tokens_per_s < SWITCH_GAIN * best[current].tokens_per_s:
        return best[current]
    return top


@dataclass(frozen=True)
class ShadowResult:
    """What one shadow pass saw: per active row, the shadow tokens that matched the committed next token and the
    positions compared; per compared position, the exit's top-1 probability (temperature 1) and whether it matched
    (the calibration of the dynamic draft exit)."""

    hits: torch.Tensor  # [rows]
    seen: torch.Tensor  # [rows]
    confidence: torch.Tensor  # [compared]
    agreed: torch.Tensor  # [compared] bool


class ShadowExit:
    """Exit layer ℓ's self-draft over the target's verified hidden states: its adapter (a KV cache of its own over
    the committed tokens) and the target's output layer give the token the exit would have drafted after every
    committed token (the paper's shadow tokens), from what verification computed anyway."""

    def __init__(self, target_model, adapter, capacity: int | None):
        self.engine = TransformersTarget(target_model, capacity, decode_kernel=True)
        runner = self_draft_runner(target_model, adapter)
        runner.layers = runner.layers[-1:]  # the adapter alone: its input is the target's stream after ℓ layers
        self.engine.runner = runner
        self.fed: list[list[int]] = []  # per batch row: the context tokens whose positions the cache holds

    def matches(self, rows: list[int], contexts: list[list[int]], features: torch.Tensor,
                counted_from: list[int]) -> ShadowResult:
        """Feed each row's committed positions not fed yet (`features` [batch, room, d]: the target's stream after
        ℓ layers) and compare the shadow token after position p with context[p + 1], over the positions
        p + 1 >= counted_from[row] (generated tokens, not the prompt)."""
        if len(self.fed) <= max(rows):
            self.engine.prefill([torch.zeros(1, dtype=torch.long)] * (max(rows) + 1))  # empty caches
            self.fed = [[] for _ in range(max(rows) + 1)]
        starts, ends = [], []
        for row, context in zip(rows, contexts):
            keep = common_prefix(self.fed[row], context)
            self.engine.cache.lengths[row] = keep
            starts.append(keep)
            ends.append(len(context) - 1)  # every committed token but the pending one has features
        counts = torch.tensor(ends) - torch.tensor(starts)
        hits, seen = torch.zeros(len(rows)), torch.zeros(len(rows))
        result = ShadowResult(hits, seen, torch.zeros(0), torch.zeros(0, dtype=torch.bool))
        if int(counts.max()) == 0:
            return result
        width = int(counts.max())
        slots = torch.tensor(starts)[:, None] + torch.arange(width)  # [rows, width]
        index = torch.tensor(rows)
        window = features[index[:, None], slots.clamp(max=features.shape[1] - 1)]  # [rows, width, d]
        normed = self.engine.score(window.float(), slots, index)  # [rows, width, d]: the adapter's final norm
        valid = torch.arange(width) < counts[:, None]
        self.engine.commit(valid, index)
        nxt = torch.zeros(len(rows), width, dtype=torch.long)
        counted = torch.zeros(len(rows), width, dtype=torch.bool)
        for i, (row, context) in enumerate(zip(rows, contexts)):
            self.fed[row] = context[:ends[i]]
            for j in range(int(counts[i])):
                position = starts[i] + j
                nxt[i, j] = context[position + 1]
                counted[i, j] = position + 1 >= counted_from[row]
            counted[i, :max(int(counts[i]) - SHADOW_POSITIONS, 0)] = False  # the output layer is most of the cost
        if bool(counted.any()):
            logits = decode_step.linear_rows(normed[counted], self.engine.runner.lm_head) \
                if decode_step.usable(self.engine.runner, normed.dtype, None, int(counted.sum())) \
                else normed[counted] @ self.engine.runner.lm_head.T  # [counted, vocab]
            agreed = logits.argmax(-1) == nxt[counted]
            agree = torch.zeros(len(rows), width)
            agree[counted] = agreed.float()
            confidence = logits.float().softmax(-1).max(-1).values
            result = ShadowResult(agree.sum(-1), counted.sum(-1).float(), confidence, agreed)
        return result


class DynamicDraftExit:
    """DEL's dynamic draft exit, calibrated: before drafted token i a row stops where the chance that its tokens
    0..i are all accepted, π_i = Π a(c_j), is below `threshold`, the step's predicted tokens per second times the
    seconds one more drafted token costs (its draft forward and its verification slot): drafting on would lower the
    step's rate. a(c) is the exit layer's measured match rate at draft top-1 probability c (the shadow passes'
    calibration table, `rates` [BINS]); `floor`: also stop below that top-1 probability (Kangaroo's rule)."""

    def __init__(self, floor: float = 0.0):
        self.floor = floor
        self.rates = torch.ones(BINS)
        self.threshold = 0.0
        self.chance: torch.Tensor | None = None  # [rows] π so far

    def accept(self, law: torch.Tensor) -> torch.Tensor:
        confidence = law.max(-1).values
        return self.rates[(confidence * BINS).long().clamp(0, BINS - 1)]

    def stop(self, law: torch.Tensor, previous_law: torch.Tensor, index: int) -> torch.Tensor:
        if index == 1:
            self.chance = self.accept(previous_law)
        self.chance = self.chance * self.accept(law)
        stop = self.chance < self.threshold
        return stop | (law.max(-1).values < self.floor) if self.floor else stop


class DelDrafter:
    """The `del` drafter: one Kangaroo self-draft per trained exit layer (built when first chosen), one shadow per
    candidate, and the per-step choice of (ℓ, d). Rows of a batch share the step's exit layer and length (the
    mean α̂ over the active rows decides).

    The exit that drafts is measured by its own verification (its drafted tokens accepted or not, with their draft
    confidences: no extra work); the others by shadow passes every SHADOW_EVERY steps. At temperature 0 both count
    draft argmax == committed token; at temperature > 0 the drafting exit's count is the rejection rule's
    acceptance, the others' stays the argmax agreement (a proxy: the target's law at their positions is not kept)."""

    def __init__(self, target_model, engine, adapters: dict[int, object], priors: dict[int, float],
                 processing: Processing, verify_s: dict[int, float], *, floor: float = 0.0,
                 calibrated: bool = False):
        if not isinstance(engine, TransformersTarget):
            raise InvalidRequest("method 'del' needs a text target served by our runner")
        engine.keep_layer_features(adapters)
        self.target_model, self.engine, self.adapters = target_model, engine, adapters
        self.processing = processing
        # every exit's self-draft consults the draft exit before each token after the first: `calibrated`, DEL's
        # dynamic draft exit (off: only the `floor` confidence stop, the chain as long as the choice's d)
        self.calibrated = calibrated
        self.draft_exit = DynamicDraftExit(floor) if calibrated or floor else None
        self.layers = target_model.config.num_hidden_layers
        self.priors = priors
        self.verify_s = verify_s  # window -> seconds of the target's forward over it, 1..the longest draft + 1
        self.drafters: dict[int, KangarooDrafter] = {}
        self.shadows = {layer: ShadowExit(target_model, adapter, engine.capacity)
                        for layer, adapter in adapters.items()}
        self.hits: dict[int, torch.Tensor] = {layer: torch.zeros(0) for layer in adapters}  # [batch] decayed matches
        self.seen: dict[int, torch.Tensor] = {layer: torch.zeros(0) for layer in adapters}  # [batch] positions
        # exit layer -> decayed (matches, positions) per confidence bin: the dynamic draft exit's calibration
        self.calibration = {layer: (torch.zeros(BINS), torch.zeros(BINS)) for layer in adapters}
        self.counted_from: list[int] = []  # per batch row: the first generated position (the prompt's length)
        self.contexts: list[list[int]] = []
        self.shadowed = {layer: {} for layer in adapters}  # exit layer -> batch row -> context length at its update
        self.draft_time: dict[int, list[float]] = {}  # exit layer -> [seconds, draft forwards] of steady proposals
        self.step_by_window: dict[int, list[float]] = {}  # window -> [seconds outside drafting, steps]
        self.current: ExitChoice | None = None
        self._left_at: float | None = None  # when the last proposal returned
        self._last_rows: list[int] = []
        self._window = 1  # the last step's verified window (its longest drafted chain and the pending token)
        self._proposed = False  # whether the step being verified drafted from `current` (observe measures it)
        self.shadow_s = 0.0
        self.used: dict[int, int] = {}  # exit layer -> steps drafted from it
        self.lengths: list[float] = []
        self.switches = 0
        self.proposals = 0

    def propose(self, ctx: DecodeContext, budget: int) -> Draft:
        began = time.perf_counter()
        if self._left_at is not None and self.current is not None:  # the step since the last proposal
            entry = self.step_by_window.setdefault(self._window, [0.0, 0])
            entry[0] += began - self._left_at
            entry[1] += 1
        rows = ctx.rows.tolist()
        contexts = [t.tolist() for t in ctx.tokens]
        renewed = self._note_requests(rows, contexts)
        if self.proposals % SHADOW_EVERY == 0:
            self._shadow(rows, contexts)
        self.proposals += 1
        self.shadow_s += time.perf_counter() - began
        alphas = self._alphas(rows)
        choice = choose_exit(alphas, self._draft_costs(), self._step_s, max(budget, 1),
                             None if self.current is None else self.current.exit_layer)
        # a proposal's time tells a drafted token's cost only in a steady step: not where the drafter is new, was
        # idle (it catches up on every token committed since) or a row has a new request (its prompt is fed)
        steady = (self.current is not None and choice.exit_layer == self.current.exit_layer and not renewed
                  and rows == self._last_rows)
        if self.current is not None and choice.exit_layer != self.current.exit_layer:
            self.switches += 1
        self.current, self._last_rows = choice, rows
        drafter = self._drafter(choice.exit_layer)
        drafting = time.perf_counter()
        if self.calibrated:  # the draft exit decides where each row stops, up to the longest allowed
            self._set_draft_exit(choice, alphas[choice.exit_layer])
        draft = drafter.propose(ctx, max(budget, 1) if self.calibrated else choice.length)
        forwards = int(draft.tokens.shape[1])  # rows that stopped drafted along with the batch
        if steady:
            entry = self.draft_time.setdefault(choice.exit_layer, [0.0, 0])
            entry[0] += time.perf_counter() - drafting
            entry[1] += forwards
        self._window = int(draft.drafted().max()) + 1
        self.used[choice.exit_layer] = self.used.get(choice.exit_layer, 0) + 1
        self.lengths.append(float(draft.drafted().float().mean()))
        self._left_at, self._proposed = time.perf_counter(), True
        return draft

    def observe(self, verdict: Verdict) -> None:
        """The drafting exit's own measurement: its tested drafted tokens, accepted or not, with their confidences."""
        if not self._proposed:  # a step the loop ran without a proposal (the last token of a request)
            return
        self._proposed = False
        layer, rows = self.current.exit_layer, torch.tensor(self._last_rows)
        accepted = verdict.num_accepted.long()
        tested = accepted + verdict.num_rejections.long()
        confidence = self._drafter(layer).confidence  # [rows, drafted]
        slots = torch.arange(confidence.shape[1])
        in_test = slots < tested[:, None]
        self._count(layer, rows, accepted.float(), tested.float(), confidence[in_test],
                    (slots < accepted[:, None])[in_test], verdict.num_committed.float())

    # ---- the acceptance each exit would have had -------------------------------------------------------------

    def _note_requests(self, rows: list[int], contexts: list[list[int]]) -> bool:
        """Note new requests (their prompts are not counted; their rows' measurements restart); whether any."""
        batch = max(rows) + 1
        if len(self.counted_from) < batch:
            grow = batch - len(self.counted_from)
            self.counted_from += [0] * grow
            self.contexts += [[] for _ in range(grow)]
            for layer in self.adapters:
                self.hits[layer] = torch.cat([self.hits[layer], torch.zeros(grow)])
                self.seen[layer] = torch.cat([self.seen[layer], torch.zeros(grow)])
        renewed = False
        for row, context in zip(rows, contexts):
            old = self.contexts[row]
            if not old or old != context[:len(old)]:
                renewed = True
                self.counted_from[row] = len(context)
                for layer in self.adapters:
                    self.shadowed[layer][row] = len(context)
                    self.hits[layer][row] = self.seen[layer][row] = 0.0
            self.contexts[row] = context
        return renewed

    def _shadow(self, rows: list[int], contexts: list[list[int]]) -> None:
        """Shadow passes of the exits not drafting now, over the tokens committed since each one's last (several
        steps' in one forward: the per-call cost is most of a pass)."""
        index = torch.tensor(rows)
        for layer, shadow_exit in self.shadows.items():
            if self.current is not None and layer == self.current.exit_layer:
                continue
            seen = shadow_exit.matches(rows, contexts, self.engine.layer_features[layer], self.counted_from)
            new = torch.tensor([len(c) - self.shadowed[layer].get(row, len(c)) for row, c in zip(rows, contexts)],
                               dtype=torch.float)
            self._count(layer, index, seen.hits, seen.seen, seen.confidence, seen.agreed, new)
            self.shadowed[layer].update({row: len(c) for row, c in zip(rows, contexts)})

    def _count(self, layer: int, rows: torch.Tensor, hits: torch.Tensor, seen: torch.Tensor,
               confidence: torch.Tensor, agreed: torch.Tensor, new_tokens: torch.Tensor) -> None:
        """Add one measurement of exit `layer` ([rows] matches and positions, decayed by the [rows] tokens
        generated since; [k] confidences and matches for its calibration)."""
        decay = DECAY ** new_tokens
        self.hits[layer][rows] = self.hits[layer][rows] * decay + hits
        self.seen[layer][rows] = self.seen[layer][rows] * decay + seen
        bins = (confidence * BINS).long().clamp(0, BINS - 1)
        matched, compared = self.calibration[layer]
        keep = DECAY ** len(bins)
        self.calibration[layer] = (matched * keep + torch.bincount(bins, agreed.float(), minlength=BINS),
                                   compared * keep + torch.bincount(bins, minlength=BINS).float())

    def _alphas(self, rows: list[int]) -> dict[int, float]:
        """α̂ per exit layer: decayed matches over positions, started from the adapter's held-out agreement, the
        mean over the active rows."""
        index = torch.tensor(rows)
        return {layer: float(((self.hits[layer][index] + PRIOR_WEIGHT * self.priors[layer])
                              / (self.seen[layer][index] + PRIOR_WEIGHT)).mean()) for layer in self.adapters}

    def _set_draft_exit(self, choice: ExitChoice, alpha: float) -> None:
        """The dynamic draft exit for this step: the chosen exit's calibration (each bin shrunk towards its α̂) and
        the threshold, the plan's rate times one more drafted token's cost."""
        matched, compared = self.calibration[choice.exit_layer]
        self.draft_exit.rates = (matched + CALIBRATION_PRIOR * alpha) / (compared + CALIBRATION_PRIOR)
        extra_slot = self._step_s(choice.length + 2) - self._step_s(choice.length + 1)
        token_s = self._draft_costs()[choice.exit_layer] + extra_slot
        self.draft_exit.threshold = choice.tokens_per_s * token_s

    # ---- costs -----------------------------------------------------------------------------------------------

    def _step_s(self, window: int) -> float:
        """T(window): the seconds a step spends outside drafting: the target's measured forward over `window` slots
        (`verify_s`, measured once per process: on the compiled step it rises in steps, not a line, as the
        kernel tiles slots in pairs or fours) plus the loop's own per-step time, read off this run's steps."""
        measured = [(total / count) - self.verify_s[n] for n, (total, count) in self.step_by_window.items()
                    if count and n in self.verify_s]
        overhead = sum(measured) / len(measured) if measured else 0.0
        return self.verify_s[min(window, len(self.verify_s))] + max(overhead, 0.0)

    def _draft_costs(self) -> dict[int, float]:
        """Seconds per drafted token per candidate: its measured seconds per draft forward (a proposal of d tokens
        runs d forwards, the first also catching up on the tokens committed since; a line through the times of the
        few d seen was too noisy: a slope near 0 made every draft look free); a candidate not run yet: a measured
        one's scaled by layer equivalents (ℓ layers, and HEAD_LAYERS for the adapter and the output layer), and
        before any proposal that share of a one-slot target forward."""
        measured = {layer: seconds / forwards for layer, (seconds, forwards) in self.draft_time.items() if forwards}
        costs = {}
        for layer in self.shadows:
            if layer in measured:
                costs[layer] = measured[layer]
            elif measured:
                known, per_forward = next(iter(measured.items()))
                costs[layer] = per_forward * (layer + HEAD_LAYERS) / (known + HEAD_LAYERS)
            else:
                costs[layer] = self.verify_s[1] * (layer + HEAD_LAYERS) / (self.layers + 1)
        return costs

    def _drafter(self, layer: int) -> KangarooDrafter:
        if layer not in self.drafters:
            self.drafters[layer] = KangarooDrafter(self.target_model, self.adapters[layer], self.processing,
                                                   stop_policy=self.draft_exit, capacity=self.engine.capacity)
        return self.drafters[layer]

    def run_summary(self) -> dict:
        alphas = {layer: round(float((self.hits[layer].sum() + PRIOR_WEIGHT * self.priors[layer])
                                     / (self.seen[layer].sum() + PRIOR_WEIGHT)), 3) for layer in self.hits}
        return {"exit_layers_used": dict(sorted(self.used.items())), "exit_layer_switches": self.switches,
                "exit_alpha": alphas, "shadow_s": round(self.shadow_s, 4),
                "mean_drafted": round(sum(self.lengths) / len(self.lengths), 2) if self.lengths else 0.0,
                "draft_forwards": sum(d.forward_calls for d in self.drafters.values())}


def build_drafter(generator, knobs: dict, processing: Processing, policy, engine) -> DelDrafter:
    """The pipeline's `del` drafter for a text generator: every exit layer with an adapter trained for its target
    (or those `exit_layers` names)."""
    found = find_adapters(generator.model_path, "del")
    text = str(knobs.get("exit_layers", "") or "").replace(" ", "")
    try:
        wanted = [int(part) for part in text.split(",") if part]
    except ValueError:
        raise InvalidRequest(f"exit_layers must be comma-separated layer numbers, got {text!r}") from None
    missing = [layer for layer in wanted if layer not in found]
    if missing:
        raise InvalidRequest(f"method 'del': no Kangaroo adapter for exit layer(s) {missing} of "
                             f"{generator.model_path}; trained: {', '.join(map(str, found))}")
    paths = {layer: found[layer] for layer in (wanted or found)}
    priors = {layer: float(read_record(path)["record"].get("heldout", {}).get("greedy_agreement", 0.5))
              for layer, path in paths.items()}
    adapters = {layer: load_adapter(path) for layer, path in paths.items()}
    verify_s = verify_times(generator, knobs["num_draft_tokens"] + 1)
    return DelDrafter(generator.model, engine, adapters, priors, processing, verify_s,
                      floor=knobs.get("confidence", 0.0), calibrated=knobs.get("draft_exit", "off") == "calibrated")


_VERIFY_S: dict[tuple, dict[int, float]] = {}  # (model folder, longest window) -> window -> seconds, per process


def verify_times(generator, longest: int) -> dict[int, float]:
    """window -> median seconds of the target's forward over that many slots after the model's example prompt,
    1..longest: measured once per process and target (about 3 forwards a window)."""
    key = (generator.model_path, longest)
    if key not in _VERIFY_S:
        prompt = generator.encode(generator.example_prompt)
        _VERIFY_S[key] = {n: measure_window_s(generator.target(), prompt, n) for n in range(1, longest + 1)}
    return _VERIFY_S[key]
