"""Kangaroo (Liu et al., arXiv 2404.18911): lossless self-speculation from the target's own first layers.

The self-draft is the target's embedding and first ℓ decoder layers (the exit layer), a small trained adapter (one
attention-only decoder layer and a norm) and the target's own output layer (lm_head); it stops drafting where its
top-1 probability falls below a threshold (`ConfidenceLength`, the `kangaroo` length schedule). There is no second
model: the drafter reads the target's weight tensors themselves (`LlamaRunner` over the same storage), and only the
adapter's ~0.6M parameters are its own.

    token ─► embed ─► the target's layers 0..ℓ-1 ─► adapter: h + Attn(RMSNorm(h)), RMSNorm ─► lm_head ─► law

How it runs. The drafter is a `ModelDrafter` whose engine's runner is the target's `LlamaRunner` cut after layer ℓ
with the adapter appended as one more layer, so it keeps its own position-indexed KV cache for ℓ + 1 layers and
rolls back to the committed prefix exactly as a draft model does (`ModelDrafter._catch_up`). The adapter has no MLP:
as a runner layer its MLP has width 0, which the compiled decode step (`kernels.decode_step`) skips and torch's ops
turn into an exact 0.0 added to the residual (docs/self_speculation.md).

Verification. The target scores the pending token and the drafts in one window, as for any drafter; the rule
(`ChainRejection`, greedy matching at temperature 0) makes the output the target's. The draft already ran the
target's first ℓ layers for the pending token and every drafted token but the last, at the slots verification
scores them and with the same compiled arithmetic; with `shallow_pass reuse` verification takes those slots' keys
and values in layers < ℓ and their stream after layer ℓ from the draft (`shallow_pass.ShallowPassTarget`, bit for
bit what it would compute; where that cannot be vouched for it verifies in full). The default recomputes them: on
this CPU a layer costs about the same over a window as over one slot, and reuse measured no faster
(docs/self_speculation.md). Exactness never depends on the draft's own law: `draft_probs` is the law each drafted
token was drawn from.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from specgen.errors import InvalidRequest, ModelNotFound
from specgen.modalities.drafters.model import ModelDrafter
from specgen.modalities.drafters.trained_files import (load_described, load_once, read_record, save_described,
                                                        target_sha256)
from specgen.modalities.runtime import llama_runner
from specgen.samplers.processing import Processing
from specgen.samplers.types import DecodeContext, Draft

ADAPTER_GLOB = "adapter-exit*.safetensors"


@dataclass(frozen=True)
class AdapterConfig:
    exit_layer: int  # ℓ: the draft reads the hidden state after the target's first ℓ layers
    hidden_size: int
    heads: int
    kv_heads: int
    head_dim: int
    eps: float
    mlp_size: int = 0  # 0: attention-only (the paper's adapter); > 0: a full decoder layer of that MLP width
    target_sha256: str = ""  # the target folder's weights the adapter was trained on (`model_sha256`)

    @classmethod
    def for_target(cls, model, exit_layer: int, *, mlp: bool = False, target_sha256: str = "") -> "AdapterConfig":
        config = model.config
        layers = config.num_hidden_layers
        if not 1 <= exit_layer < layers:
            raise InvalidRequest(f"exit_layer must be between 1 and {layers - 1} for a {layers}-layer target, "
                                 f"got {exit_layer}")
        heads = config.num_attention_heads
        return cls(exit_layer, config.hidden_size, heads, config.num_key_value_heads,
                   getattr(config, "head_dim", None) or config.hidden_size // heads, float(config.rms_norm_eps),
                   config.intermediate_size if mlp else 0, target_sha256)


class KangarooAdapter(torch.nn.Module):
    """One attention-only decoder layer (pre-norm, residual) and an output norm over the exit layer's hidden state.
    Started from the target's layer ℓ (its attention, and its MLP for the `mlp_size` variant) and final norm, so an
    untrained adapter is the target's next layer without its MLP."""

    def __init__(self, config: AdapterConfig):
        super().__init__()
        self.config = config
        d, q_size, kv_size = config.hidden_size, config.heads * config.head_dim, config.kv_heads * config.head_dim
        self.norm_in = torch.nn.Parameter(torch.ones(d))
        self.q_proj = torch.nn.Linear(d, q_size, bias=False)
        self.k_proj = torch.nn.Linear(d, kv_size, bias=False)
        self.v_proj = torch.nn.Linear(d, kv_size, bias=False)
        self.o_proj = torch.nn.Linear(q_size, d, bias=False)
        if config.mlp_size:
            self.norm_post = torch.nn.Parameter(torch.ones(d))
            self.gate_proj = torch.nn.Linear(d, config.mlp_size, bias=False)
            self.up_proj = torch.nn.Linear(d, config.mlp_size, bias=False)
            self.down_proj = torch.nn.Linear(config.mlp_size, d, bias=False)
        self.norm_out = torch.nn.Parameter(torch.ones(d))

    @classmethod
    def from_target(cls, model, config: AdapterConfig) -> "KangarooAdapter":
        adapter = cls(config)
        layer = model.model.layers[config.exit_layer]
        with torch.no_grad():
            adapter.norm_in.copy_(layer.input_layernorm.weight)
            for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
                getattr(adapter, name).weight.copy_(getattr(layer.self_attn, name).weight)
            if config.mlp_size:
                adapter.norm_post.copy_(layer.post_attention_layernorm.weight)
                for name in ("gate_proj", "up_proj", "down_proj"):
                    getattr(adapter, name).weight.copy_(getattr(layer.mlp, name).weight)
            adapter.norm_out.copy_(model.model.norm.weight)
        return adapter.float()

    def forward(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """hidden [b, t, d] (the exit layer's output at t consecutive positions from 0), cos/sin [b, t, head_dim]
        (the target's rotary embedding) -> the normed state lm_head reads [b, t, d]. Causal, for training and the
        tests' reference law; serving runs the same arithmetic as a runner layer (`as_runner_layer`)."""
        c = self.config
        b, t, _ = hidden.shape
        x = F.rms_norm(hidden, (c.hidden_size,), self.norm_in, c.eps)
        q = self.q_proj(x).view(b, t, c.heads, c.head_dim)
        k = self.k_proj(x).view(b, t, c.kv_heads, c.head_dim)
        v = self.v_proj(x).view(b, t, c.kv_heads, c.head_dim).transpose(1, 2)
        cos, sin = cos[:, :, None], sin[:, :, None]  # over the heads
        q = (q * cos + llama_runner.rotate_half(q) * sin).transpose(1, 2)  # [b, heads, t, head_dim]
        k = (k * cos + llama_runner.rotate_half(k) * sin).transpose(1, 2)
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=c.head_dim ** -0.5,
                                                  enable_gqa=c.heads != c.kv_heads)
        hidden = hidden + self.o_proj(attended.transpose(1, 2).reshape(b, t, c.heads * c.head_dim))
        if c.mlp_size:
            x = F.rms_norm(hidden, (c.hidden_size,), self.norm_post, c.eps)
            hidden = hidden + self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        return F.rms_norm(hidden, (c.hidden_size,), self.norm_out, c.eps)

    def as_runner_layer(self) -> dict:
        """The adapter as a `LlamaRunner` layer (fused q/k/v; an MLP of width 0 when it has none: the compiled step
        skips it, and in torch's ops an empty product adds exactly 0.0 to the residual)."""
        c, d = self.config, self.config.hidden_size
        weights = {name: getattr(self, name).weight.detach().float() for name in ("q_proj", "k_proj", "v_proj",
                                                                                  "o_proj")}
        if c.mlp_size:
            gate_up = torch.cat([self.gate_proj.weight, self.up_proj.weight]).detach().float()
            down, norm_post = self.down_proj.weight.detach().float(), self.norm_post.detach().float()
        else:
            gate_up, down, norm_post = torch.zeros(0, d), torch.zeros(d, 0), torch.ones(d)
        return {"norm_in": (self.norm_in.detach().float(), c.eps), "norm_post": (norm_post, c.eps),
                "scaling": c.head_dim ** -0.5,
                "qkv": torch.cat([weights["q_proj"], weights["k_proj"], weights["v_proj"]]).contiguous(),
                "out": weights["o_proj"].contiguous(), "gate_up": gate_up.contiguous(), "down": down.contiguous()}

    # ---- files: one self-describing safetensors file per exit layer ------------------------------------------

    def save(self, path: Path, record: dict | None = None) -> Path:
        """fp16 weights with the config (and `record`, e.g. held-out acceptance) in the safetensors metadata."""
        return save_described(path, self, self.config, record)

    @classmethod
    def load(cls, path: Path) -> "KangarooAdapter":
        return load_described(path, lambda config: cls(AdapterConfig(**config)))


def adapter_path(folder: Path, exit_layer: int) -> Path:
    return Path(folder) / f"adapter-exit{exit_layer}.safetensors"


# ---- finding the adapter of a target -----------------------------------------------------------------------------


def adapter_folders(model_path: str) -> list[Path]:
    """Where a target's adapters may be: `<model>/kangaroo/` and, for a pair folder such as assets/code/{target,
    draft}, the sibling `kangaroo/` (the shipped code target's adapters are in assets/code/kangaroo)."""
    model = Path(model_path)
    return [model / "kangaroo", model.parent / "kangaroo"]


def load_adapter(path: Path) -> "KangarooAdapter":
    """`KangarooAdapter.load`, kept while the file is unchanged (callers never modify it)."""
    return load_once(path, KangarooAdapter.load)


def find_adapters(model_path: str, method: str = "kangaroo") -> dict[int, Path]:
    """Every adapter file trained for the target at `model_path` (on these very weights), by exit layer.
    ModelNotFound, naming where they are looked up and how to train one, where there is none."""
    if not Path(model_path).is_dir():
        raise ModelNotFound(f"method {method!r} needs a trained adapter for the target; {model_path!r} is not a "
                            "model folder (train one: specgen train adapter --method kangaroo)")
    sha = target_sha256(model_path)
    found: dict[int, Path] = {}
    for folder in adapter_folders(model_path):
        for path in sorted(folder.glob(ADAPTER_GLOB)) if folder.is_dir() else ():
            meta = read_record(path)
            if meta["config"].get("target_sha256") == sha:
                found.setdefault(int(meta["config"]["exit_layer"]), path)
    if not found:
        raise ModelNotFound(f"method {method!r} needs a Kangaroo adapter trained for the target {model_path} (none "
                            f"in {' or '.join(str(f) for f in adapter_folders(model_path))}); train one with "
                            "`specgen train adapter --method kangaroo --model PATH`")
    return dict(sorted(found.items()))


def find_adapter(model_path: str, exit_layer: int = 0) -> Path:
    """The adapter file for the target at `model_path` (trained on these very weights) at `exit_layer`; 0: the
    shallowest one trained. ModelNotFound or InvalidRequest, naming what exists, otherwise."""
    found = find_adapters(model_path)
    if exit_layer == 0:  # the shallowest: the cheapest draft (Kangaroo's exit layers are shallow by design)
        return found[min(found)]
    if exit_layer not in found:
        raise InvalidRequest(f"no Kangaroo adapter for exit_layer {exit_layer} of {model_path}; trained: "
                             f"{', '.join(map(str, sorted(found)))} (or 0 for the best)")
    return found[exit_layer]


# ---- serving -----------------------------------------------------------------------------------------------------


def self_draft_runner(target_model, adapter: KangarooAdapter) -> llama_runner.LlamaRunner:
    """The target's `LlamaRunner` (its prepared weight tensors, shared, not copied) cut after the exit layer, the
    adapter appended as one more layer and its norm as the final norm; lm_head stays the target's."""
    if not llama_runner.supports(target_model):
        raise InvalidRequest("method 'kangaroo' needs a Llama-architecture target (its layers are run one by one)")
    config = adapter.config
    runner = llama_runner.LlamaRunner(target_model)
    runner.layers = runner.layers[:config.exit_layer] + [adapter.as_runner_layer()]
    runner.final_norm = (adapter.norm_out.detach().float(), config.eps)
    runner.decode_kernel = True  # the draft's law is what this forward computes: any float32 arithmetic is exact
    return runner


@dataclass(frozen=True)
class ShallowPass:
    """What a proposal's forwards left for verification (`shallow_pass.ShallowPassTarget`) besides the draft's cache:
    the stream after the target's first ℓ layers at the pending token and at each drafted token that was fed."""

    rows: torch.Tensor  # [rows] the proposal's batch rows
    starts: torch.Tensor  # [rows] the pending token's slot (its position)
    hidden: torch.Tensor  # [rows, fed + 1, d]


class KangarooDrafter(ModelDrafter):
    """The self-draft as a chain drafter: `ModelDrafter`'s cache, rollback and per-token stop rule over the
    self-draft runner. `stop_policy` is the confidence rule (`ConfidenceLength`): a token whose draft top-1
    probability is below the threshold is not drafted. `keep_shallow`: keep each proposal's `shallow` pass for a
    verification that reuses it."""

    def __init__(self, target_model, adapter: KangarooAdapter, processing: Processing, *, stop_policy=None,
                 capacity: int | None = None, keep_shallow: bool = False):
        super().__init__(target_model, processing, capacity=capacity, stop_policy=stop_policy)
        self.engine.runner = self_draft_runner(target_model, adapter)
        self.exit_layer = adapter.config.exit_layer
        if keep_shallow:  # the draft's forwards then stop after layer ℓ once to keep the stream there
            self.engine.runner.keep_layers = (self.exit_layer,)
        self.shallow: ShallowPass | None = None
        self._shallow_parts: list[torch.Tensor] | None = None

    def propose(self, ctx: DecodeContext, budget: int) -> Draft:
        self.shallow, parts = None, []
        self._shallow_parts = parts if self.engine.runner.keep_layers else None
        try:
            draft = super().propose(ctx, budget)
        finally:
            self._shallow_parts = None
        if parts:
            self.shallow = ShallowPass(ctx.rows.clone(), ctx.next_positions - 1, torch.cat(parts, 1))
        return draft

    def _feed(self, rows, backlog, feed, first, logits: bool = True):
        out = super()._feed(rows, backlog, feed, first, logits)
        if self._shallow_parts is not None and logits:  # a proposal's forward (not a long prompt's cache fill)
            hidden = self.engine.runner.layer_hidden[self.exit_layer]  # [rows, w, d]
            if backlog is not None:  # from the backlog's last token (the pending one) on
                index = backlog[1][:, None] - 1 + torch.arange(feed.shape[1] + 1)  # [rows, u + 1]
                hidden = hidden.gather(1, index[..., None].expand(-1, -1, hidden.shape[-1]))
            self._shallow_parts.append(hidden)
        return out

    def verifying_target(self, engine):
        """The target as the loop should score this drafter's chains: reusing the shallow pass where it is kept."""
        from specgen.modalities.drafters.shallow_pass import ShallowPassTarget

        return ShallowPassTarget(engine, self) if self.engine.runner.keep_layers else engine

    def run_summary(self) -> dict:
        return {"exit_layer": self.exit_layer, "draft_forwards": self.forward_calls}


def build_drafter(generator, knobs: dict, processing: Processing, policy) -> KangarooDrafter:
    """The pipeline's `kangaroo` drafter for a text generator (its target model and folder)."""
    path = find_adapter(generator.model_path, knobs.get("exit_layer", 0))
    return KangarooDrafter(generator.model, load_adapter(path), processing, stop_policy=policy,
                           keep_shallow=knobs.get("shallow_pass") == "reuse")
