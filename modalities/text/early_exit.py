"""Dynamic inference for code completion (Sun et al. 2024, "When neural code completion models size up the
situation", S25): method `early-exit`. Each token leaves the target at the first layer whose controller is sure a
shallow prediction is right, and the completion stops where the controller predicts that the full model would be
wrong. **Lossy by design**: a token emitted from an exit head may differ from full decoding's, and a stop ends the
completion early; the registry marks it lossy (docs/early_exit.md has the bound and the measured cost).

Per token, after each layer ℓ = 1..L (h_ℓ the residual stream; h_L the target's final-normed state):

    h_ℓ ─► controller_ℓ: Linear ─ GELU ─ Linear over RMSNorm(h_ℓ) ─► P(continue), P(exit), P(stop)
    P(stop) ≥ stop_threshold        → the stop token (end of text): the completion ends here
    P(exit) ≥ exit_threshold, ℓ < L → the token from exit head ℓ: lm_head(RMSNorm_ℓ(h_ℓ + A_ℓ h_ℓ + b_ℓ))
    otherwise                       → layer ℓ + 1 (after layer L: the target's own token)

Exit heads. Our choice: an affine map of the residual stream (zero at the start, so a head starts as the target's
final norm and lm_head read early) before a trained norm and the target's own lm_head; the paper fine-tunes a full
LM head per layer, but the code target's output layer is as large as a decoder layer, so one per exit would more
than double the weights read and shipped, while a map is 0.15 M parameters. The controller reads the hidden state
only (as the paper's): an exit head is computed only for a token that exits there.

State copying. Later tokens attend to every position in every layer, so a token that exits at ℓ still needs keys
and values in layers ℓ+1..L: they are computed from h_ℓ itself (the paper's state copying): each skipped layer's
input norm and key/value projections and rotary, about a sixth of that layer's weights. In a batch the rows run the
next layer while any row still does; a row already decided passes its frozen state through it (its keys and values
again come from h_ℓ; its outputs are dropped), so its tokens do not depend on the rows beside it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from specgen.errors import InvalidRequest, ModelNotFound
from specgen.kernels import decode_step
from specgen.modalities.drafters.trained_files import (described_for, load_described, load_once, read_record,
                                                        save_described)
from specgen.modalities.runtime import llama_runner

CONTINUE, EXIT, STOP = 0, 1, 2  # the controller's actions
MODULES_FILE = "early-exit.safetensors"


@dataclass(frozen=True)
class ExitConfig:
    layers: int  # L: exit heads after layers 1..L-1, controllers after 1..L
    hidden_size: int
    eps: float
    controller_size: int = 64
    target_sha256: str = ""  # the target folder's weights these were trained on (`model_sha256`)


class ExitModules(torch.nn.Module):
    """The exit heads (after layers 1..L-1) and the controllers (after layers 1..L) of one target."""

    def __init__(self, config: ExitConfig):
        super().__init__()
        self.config = config
        d, c = config.hidden_size, config.controller_size
        self.maps = torch.nn.ModuleList(torch.nn.Linear(d, d) for _ in range(config.layers - 1))
        self.norms = torch.nn.ParameterList(torch.nn.Parameter(torch.ones(d)) for _ in range(config.layers - 1))
        self.controllers = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(d, c), torch.nn.GELU(), torch.nn.Linear(c, 3))
            for _ in range(config.layers))

    @classmethod
    def from_target(cls, model, *, controller_size: int = 64, target_sha256: str = "") -> "ExitModules":
        """Heads that start as the target's final norm and lm_head read at each exit (the maps zero)."""
        config = model.config
        modules = cls(ExitConfig(config.num_hidden_layers, config.hidden_size, float(config.rms_norm_eps),
                                 controller_size, target_sha256))
        with torch.no_grad():
            for linear, norm in zip(modules.maps, modules.norms):
                linear.weight.zero_()
                linear.bias.zero_()
                norm.copy_(model.model.norm.weight.float())
        return modules

    def exit_hidden(self, layer: int, hidden: torch.Tensor) -> torch.Tensor:
        """[..., d] what lm_head reads for a token exiting after `layer` (1..L-1)."""
        mapped = hidden + self.maps[layer - 1](hidden)
        return F.rms_norm(mapped, (mapped.shape[-1],), self.norms[layer - 1], self.config.eps)

    def action_logits(self, layer: int, hidden: torch.Tensor) -> torch.Tensor:
        """[..., 3] continue / exit / stop logits after `layer` (1..L)."""
        return self.controllers[layer - 1](F.rms_norm(hidden, (hidden.shape[-1],), eps=self.config.eps))

    @torch.no_grad()
    def action_probs(self, layer: int, hidden: torch.Tensor) -> torch.Tensor:
        """[rows, 3] the controller's law over continue / exit / stop for float32 `hidden` [rows, d]: one compiled
        call where the decode step builds (`decode_step.classify_rows`), else `action_logits`' softmax."""
        if not decode_step.available():
            return self.action_logits(layer, hidden).softmax(-1)
        if getattr(self, "_controller_weights", None) is None:  # contiguous float32, once (the modules are frozen)
            self._controller_weights = [tuple(t.detach().float().contiguous() for t in (c[0].weight, c[0].bias,
                                                                                         c[2].weight, c[2].bias))
                                        for c in self.controllers]
        return decode_step.classify_rows(hidden, *self._controller_weights[layer - 1], self.config.eps)

    def save(self, path: Path, record: dict) -> Path:
        return save_described(path, self, self.config, record)

    @classmethod
    def load(cls, path: Path) -> "ExitModules":
        return load_described(path, lambda config: cls(ExitConfig(**config))).requires_grad_(False)


# ---- finding and loading a target's exit modules ---------------------------------------------------------------


def module_folders(model_path: str) -> list[Path]:
    """`<model>/early_exit/` and, for a pair folder such as assets/code/target, the sibling `early_exit/`."""
    model = Path(model_path)
    return [model / "early_exit", model.parent / "early_exit"]


def find_modules(model_path: str) -> Path:
    """The exit-modules file trained on the weights at `model_path`; ModelNotFound naming how to train one."""
    path = described_for(model_path, module_folders(model_path), MODULES_FILE)
    if path is not None:
        return path
    raise ModelNotFound(f"method 'early-exit' needs exit heads and controllers trained for the target {model_path} "
                        f"(none in {' or '.join(str(f) for f in module_folders(model_path))}); train them with "
                        "`specgen train adapter --method early-exit --model PATH`")


def load_modules(path: Path) -> ExitModules:
    """`ExitModules.load`, kept while the file is unchanged (callers never modify it)."""
    return load_once(path, ExitModules.load)


# ---- serving -----------------------------------------------------------------------------------------------------


class EarlyExitTarget:
    """The target as the loop scores it under `early-exit`: one new token per row decoded layer by layer with the
    controllers' exits and stops; everything else (prefill, commit, cache, features) is the wrapped engine's."""

    def __init__(self, engine, modules: ExitModules, *, exit_threshold: float, stop_threshold: float,
                 stop_token: int | None, decision_layers: tuple[int, ...] | None = None):
        runner = getattr(engine, "runner", None)
        if not isinstance(runner, llama_runner.LlamaRunner) or len(runner.layers) != modules.config.layers:
            raise InvalidRequest("method 'early-exit' needs a Llama-architecture target with its own exit modules")
        if stop_token is None and stop_threshold < 1:
            raise InvalidRequest("method 'early-exit' stops with the end-of-text token, and this tokenizer has none "
                                 "(set stop_threshold=1 to never stop)")
        self.engine, self.runner, self.modules = engine, runner, modules
        self.exit_threshold, self.stop_threshold, self.stop_token = exit_threshold, stop_threshold, stop_token
        layers = modules.config.layers
        # where the controllers are asked (and the last layer, for stops); the stack runs in one call between them
        self.decision_layers = tuple(range(1, layers + 1)) if decision_layers is None else tuple(
            sorted({*decision_layers, layers}))
        self.exits = [0] * (modules.config.layers + 1)  # tokens emitted after layer ℓ (index ℓ)
        self.stops = 0

    def __getattr__(self, name):  # prefill, prefill_rows, commit, cache, model, vocab_size, ...
        return getattr(self.engine, name)

    def score(self, tokens: torch.Tensor, positions: torch.Tensor, rows: torch.Tensor,
              tree_mask: torch.Tensor | None = None, valid: torch.Tensor | None = None,
              logits_to_keep: int = 0) -> torch.Tensor:
        """Plain decoding's one-slot forward exits early; any other window (none under this method) is scored by
        the full target."""
        if tokens.shape[1] != 1 or tree_mask is not None or tokens.is_floating_point():
            return self.engine.score(tokens, positions, rows, tree_mask, valid, logits_to_keep)
        return self._decode(tokens, positions, rows)

    @torch.no_grad()
    def _decode(self, tokens: torch.Tensor, positions: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        runner, cache, layers = self.runner, self.engine.cache, self.modules.config.layers
        self.engine.forward_calls += 1
        cache.begin(rows, 1)
        if not decode_step.usable(runner, runner.embed.dtype, None, len(rows)) and cache.common_start is None:
            raise InvalidRequest("method 'early-exit' decodes rows of different lengths only with the compiled "
                                 "decode step (kernels/decode_step.py)")
        exits, stops = self.exit_threshold < 1, self.stop_threshold < 1
        hidden = F.embedding(tokens, runner.embed)  # [rows, 1, d]
        exit_at = [layers] * len(rows)  # the layer whose state gives each row's token
        stopped, decided = [False] * len(rows), [False] * len(rows)
        frozen, kept = None, None  # the decided rows' states; [rows, 1, 1] which rows they are
        checks = iter(self.decision_layers if exits or stops else (layers,))
        index, layer = 0, next(checks)
        while index < layers:
            # one call up to the next decision; one layer at a time once some rows of a batch are decided, so that
            # their keys and values in every later layer come from their frozen state
            end = index + 1 if kept is not None else layer
            hidden = runner.forward_hidden(hidden, positions, cache, None, layers=range(index, end))
            if kept is not None:  # decided rows keep their state (their keys and values came from it)
                hidden = torch.where(kept, frozen, hidden)
            index = end
            if index < layer:
                continue
            asked = stops or (exits and index < layers)
            now = self._decide(index, hidden, decided, exit_at, stopped) if asked else []
            layer = next(checks, layers)
            if now and len(now) == len(rows):
                frozen = hidden
            elif now:
                mask = torch.zeros(len(rows), 1, 1, dtype=torch.bool)
                mask[now] = True
                frozen = hidden if frozen is None else torch.where(mask, hidden, frozen)
                kept = mask if kept is None else kept | mask
            if index < layers and all(decided):
                self._copy_states(frozen, positions, cache, range(index, layers))
                hidden = frozen
                break
        return self._logits(hidden, exit_at, stopped)

    def _decide(self, layer: int, hidden: torch.Tensor, decided: list, exit_at: list, stopped: list) -> list[int]:
        """The controllers after `layer`: the undecided rows that exit or stop here (marked in the lists)."""
        last = layer == self.modules.config.layers
        exits, stops = self.exit_threshold < 1 and not last, self.stop_threshold < 1
        now = []
        for row, (_, p_exit, p_stop) in enumerate(self.modules.action_probs(layer, hidden[:, 0]).tolist()):
            stop = stops and p_stop >= self.stop_threshold
            if decided[row] or not (stop or (exits and p_exit >= self.exit_threshold)):
                continue
            stopped[row], decided[row], exit_at[row] = stop, True, layer
            now.append(row)
        return now

    def _logits(self, hidden: torch.Tensor, exit_at: list[int], stopped: list[bool]) -> torch.Tensor:
        """[rows, 1, vocab]: the target's head over the full stack's rows, each exit head over its rows, and a
        point mass on the stop token for stopped rows."""
        layers = self.modules.config.layers
        groups: dict[int, list[int]] = {}
        for row, (layer, stop) in enumerate(zip(exit_at, stopped)):
            groups.setdefault(-1 if stop else layer, []).append(row)
        if len(groups) == 1 and -1 not in groups:  # every row from one layer (always so for one row)
            (layer, _), = groups.items()
            self.exits[layer] += len(exit_at)
            return self.runner.output(hidden if layer == layers else self.modules.exit_hidden(layer, hidden))
        logits = hidden.new_zeros(len(exit_at), 1, self.runner.lm_head.shape[0])
        for layer, members in groups.items():
            if layer == -1:
                logits[members] = float("-inf")
                logits[members, :, self.stop_token] = 0.0
                self.stops += len(members)
                continue
            state = hidden[members]
            logits[members] = self.runner.output(state if layer == layers else self.modules.exit_hidden(layer, state))
            self.exits[layer] += len(members)
        return logits

    def _copy_states(self, frozen: torch.Tensor, positions: torch.Tensor, cache, layers: range) -> None:
        """State copying: the keys and values of `layers` for the decided rows, computed from their frozen state
        (one compiled call, `decode_step.copy_states`, where the runner uses the compiled step; these torch ops,
        its twin, otherwise)."""
        runner = self.runner
        if decode_step.usable(runner, frozen.dtype, None, frozen.shape[0] * frozen.shape[1]):
            return decode_step.copy_states(runner, frozen, positions, cache, layers)
        q_size, kv_size = runner.heads * runner.head_dim, runner.kv_heads * runner.head_dim
        cos, sin = runner.rotary(frozen, positions)
        cos, sin = cos[:, :, None], sin[:, :, None]  # [rows, 1, 1, head_dim]
        shape = (*frozen.shape[:2], runner.kv_heads, runner.head_dim)
        for index in layers:
            layer = runner.layers[index]
            x = llama_runner._rms_norm(frozen, *layer["norm_in"])
            keys, values = runner._linear(x, layer["qkv"][q_size:]).split(kv_size, dim=-1)
            keys = keys.view(shape)
            keys = keys * cos + llama_runner.rotate_half(keys) * sin
            cache.update(keys.transpose(1, 2), values.reshape(shape).transpose(1, 2), index)

    def run_summary(self) -> dict:
        tokens = sum(self.exits)
        layers = self.modules.config.layers
        mean = sum(layer * count for layer, count in enumerate(self.exits)) / tokens if tokens else float(layers)
        return {"early_exit": {"tokens": tokens, "stops": self.stops, "layers": layers,
                               "mean_layers": round(mean, 3), "layers_skipped": round(layers - mean, 3),
                               "exits_by_layer": {str(layer): count for layer, count in enumerate(self.exits)
                                                  if count},
                               "exit_threshold": self.exit_threshold, "stop_threshold": self.stop_threshold,
                               "decision_layers": list(self.decision_layers)}}


# "auto" asks the controllers only after layers where held-out exits saved this many layers per token (share x skipped)
MIN_SAVED_LAYERS = 0.1


def decision_layers(knob: str, record: dict, exit_threshold: float, layers: int) -> tuple[int, ...] | None:
    """The layers after which the controllers decide: the knob's comma-separated list; "auto": the layers ℓ < L where,
    in the modules' held-out replay at the calibrated exit threshold nearest `exit_threshold`, the share of tokens
    leaving times the L - ℓ layers each skips is at least MIN_SAVED_LAYERS (a decision costs a controller and a cut
    in the compiled stack: on a shallow target, asked where few tokens leave, it costs more than their exits save);
    every layer where the record has no replay; the last layer is always asked (stops). None: every layer."""
    if knob.strip() != "auto":
        try:
            chosen = sorted({int(part) for part in knob.split(",") if part.strip()})
        except ValueError:
            raise InvalidRequest(f"decision_layers must be 'auto' or comma-separated layers, got {knob!r}") from None
        if any(not 1 <= layer <= layers for layer in chosen):
            raise InvalidRequest(f"decision_layers must lie between 1 and {layers}, got {knob!r}")
        return tuple(chosen) or None
    replays = record.get("calibration", {}).get("exits", [])
    if not replays:
        return None
    nearest = min(replays, key=lambda entry: abs(entry["exit_threshold"] - exit_threshold))
    return tuple(int(layer) for layer, share in nearest.get("exit_share", {}).items()
                 if int(layer) < layers and share * (layers - int(layer)) >= MIN_SAVED_LAYERS)


def build_target(generator, knobs: dict, engine) -> EarlyExitTarget:
    """The pipeline's `early-exit` target for a text generator (its target folder and tokenizer)."""
    path = find_modules(generator.model_path)
    modules = load_modules(path)
    stop = generator.stop_tokens
    layers = decision_layers(knobs["decision_layers"], read_record(path)["record"], knobs["exit_threshold"],
                             modules.config.layers)
    return EarlyExitTarget(engine, modules, exit_threshold=knobs["exit_threshold"],
                           stop_threshold=knobs["stop_threshold"], stop_token=stop[0] if stop else None,
                           decision_layers=layers)
