"""Row-invariant weight-only int8 layers: the batch-invariant serving mode for large CPU models.

Speculative verification scores several tokens in one forward; the outputs are exact only if a token's logits
do not depend on how many tokens are scored with it. Dense fp32 and bf16 matmuls break that on CPU (the BLAS
picks a different kernel, hence a different summation order, for 1 row than for 4), and dynamic int8
quantisation breaks it outright (one activation scale for the whole window). Weights stored as int8 rows with
one float32 scale per row go through `kernels.int8_rows`, a small AVX2 kernel of ours whose every output has
a fixed summation order whatever the number of rows (fp32 activations; one pass over the weights per 6 rows,
so verifying a window of 4-6 tokens costs little more than one). Where it cannot be built,
`torch._weight_int8pack_mm` with bf16 activations is used: also row-invariant (per-row kernel), but with
bf16 outputs and a pass over the weights per 4 rows. Either way every layer is row-invariant by construction.
"""

from __future__ import annotations

import weakref

import torch
from torch import nn

from specgen.kernels import int8_rows

FALLBACK_DTYPE = torch.bfloat16  # torch._weight_int8pack_mm's fast path; its fp16 and fp32 paths are scalar on CPU


def backend() -> str:
    """Which kernel the int8 layers run on this machine (recorded with benchmark results)."""
    if not int8_rows.available():
        return "weight_int8pack_mm-bf16"
    return "int8_rows-avx512-fp32" if int8_rows.wide() else "int8_rows-avx2-fp32"


# nn.Linear -> ((weight pointer, version), its Int8Linear); entries go with their layer
_QUANTIZED: "weakref.WeakKeyDictionary[nn.Linear, tuple]" = weakref.WeakKeyDictionary()


def quantize_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """weight [out, in] float -> (int8 [out, in], scales [out] float32), one symmetric scale per output row."""
    scales = weight.detach().float().abs().amax(1).clamp_min(1e-12) / 127
    quantized = torch.round(weight.detach().float() / scales[:, None]).clamp_(-127, 127).to(torch.int8)
    return quantized.contiguous(), scales


class Int8Linear(nn.Module):
    """y = x W^T with W stored as int8 rows times a float32 scale per row; y in x's dtype."""

    def __init__(self, qweight: torch.Tensor, scales: torch.Tensor):
        super().__init__()
        self.register_buffer("qweight", qweight)  # [out, in] int8
        self.register_buffer("scales", scales.float())  # [out]
        self.out_features, self.in_features = qweight.shape
        self._fallback_scales = None

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> "Int8Linear":
        """The layer's int8 rows, quantized once per layer and weight version: every request that drafts with the
        Gemma draft builds a runner with an int8 output layer, and quantizing its rows took 16 ms each time."""
        if linear.bias is not None:
            raise ValueError("Int8Linear has no bias")
        version = (linear.weight.data_ptr(), linear.weight._version)
        cached = _QUANTIZED.get(linear)
        if cached is None or cached[0] != version:
            cached = (version, cls(*quantize_rows(linear.weight)))
            _QUANTIZED[linear] = cached
        return cached[1]

    @classmethod
    def concat(cls, layers: list["Int8Linear"]) -> "Int8Linear":
        """One layer computing `layers` side by side (fused q/k/v or gate/up): rows are independent, so the
        fused output equals the separate outputs bit for bit."""
        return cls(torch.cat([layer.qweight for layer in layers]), torch.cat([layer.scales for layer in layers]))

    def dequantized(self, dtype=torch.float32) -> torch.Tensor:
        return self.qweight.to(dtype) * self.scales.to(dtype)[:, None]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type == "cpu" and self.in_features % 8 == 0 and int8_rows.available():
            out = int8_rows.int8_rows_mm(x.reshape(-1, self.in_features).float().contiguous(), self.qweight, self.scales)
        else:
            if self._fallback_scales is None or self._fallback_scales.device != x.device:
                self._fallback_scales = self.scales.to(FALLBACK_DTYPE)
            flat = x.reshape(-1, self.in_features).to(FALLBACK_DTYPE).contiguous()
            out = torch._weight_int8pack_mm(flat, self.qweight, self._fallback_scales)
        return out.reshape(*x.shape[:-1], self.out_features).to(x.dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 rows"


class Int8Embedding(nn.Module):
    """An input embedding that reads the rows of a tied int8 output layer (so the served model keeps one copy
    of its largest matrix), times `scale` (Gemma multiplies embeddings by sqrt(hidden_size))."""

    def __init__(self, output_layer: Int8Linear, scale: float = 1.0, dtype: torch.dtype = torch.float32):
        super().__init__()
        self._tied = [output_layer]  # a list, not a submodule: the weights are saved and counted once, as the output layer's
        self.scale, self.dtype = float(scale), dtype
        self.num_embeddings, self.embedding_dim = output_layer.qweight.shape

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        output_layer = self._tied[0]
        rows = output_layer.qweight[ids].to(self.dtype) * output_layer.scales[ids].to(self.dtype)[..., None]
        return rows * torch.tensor(self.scale, dtype=self.dtype)


def replace_linears(model: nn.Module, build) -> None:
    """Swap each nn.Linear of `model` for `build(qualified name, linear)`, in place."""
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            if isinstance(child, nn.Linear):
                setattr(module, child_name, build(f"{name}.{child_name}" if name else child_name, child))


def quantize_model(model: nn.Module) -> nn.Module:
    """Replace every bias-free nn.Linear of `model` by an Int8Linear, in place; with tied input and output
    embeddings the input embedding reads the int8 output layer. Returns the model."""
    replace_linears(model, lambda name, linear: linear if linear.bias is not None else Int8Linear.from_linear(linear))
    tie_input_embedding(model)
    return model


def tie_input_embedding(model: nn.Module) -> None:
    config = getattr(model, "config", None)
    output_layer = getattr(model, "lm_head", None)
    if not (getattr(config, "tie_word_embeddings", False) and isinstance(output_layer, Int8Linear)):
        return
    embed = model.get_input_embeddings()
    scale = float(getattr(embed, "scalar_embed_scale", getattr(embed, "scale", 1.0)))
    model.model.embed_tokens = Int8Embedding(output_layer, scale)
