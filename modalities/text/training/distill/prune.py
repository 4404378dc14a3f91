"""Pruned self-drafts: the target minus its block of n decoder layers that changes the residual stream least.

Thangarasa et al., "Self-Data Distillation for Recovering Quality in Pruned Large Language Models" (MLSys 2025,
arXiv 2410.09982) prune the target this way and fine-tune the result (here: the project's draft trainer); the
layer choice is Gromov et al., "The Unreasonable Ineffectiveness of the Deeper Layers" (arXiv 2403.17887):

    d(l, l + n) = (1 / pi) * arccos( h_l . h_{l+n} / (|h_l| |h_{l+n}|) ),   in [0, 1],

with h_l the residual stream entering layer l, at the last token of each calibration window, averaged over
windows; the block removed is l* .. l* + n - 1 with l* = argmin_l d(l, l + n).

Which states: transformers 5.x Llama (`capture_outputs` hooks) returns `hidden_states` as a tuple of L + 1 tensors
[B, T, H]: entry l < L is the input of layer l (entry 0 the embeddings), but entry L is replaced by
`last_hidden_state`, i.e. AFTER the final RMSNorm (transformers 4.x did the same). The "input of layer L" that
the last block needs is the last layer's pre-norm output, so we take it from a forward pre-hook on the final norm.
"""

from __future__ import annotations

import copy
import re
from itertools import chain

import torch

from specgen.errors import InvalidRequest


def _decoder_layers(model) -> tuple[str, torch.nn.ModuleList]:
    """(qualified name, ModuleList) of the decoder layers, e.g. ("model.layers", ...) for `LlamaForCausalLM`."""
    layers = getattr(model.get_decoder(), "layers", None)
    if not isinstance(layers, torch.nn.ModuleList):
        raise InvalidRequest(f"{type(model).__name__} has no decoder `layers` ModuleList to prune")
    name = next(n for n, m in model.named_modules() if m is layers)
    return name, layers


def _check_block(num_layers: int, block: int) -> None:
    if not 1 <= block < num_layers:
        raise InvalidRequest(f"a block must have 1 .. {num_layers - 1} layers of {num_layers}, not {block}")


@torch.no_grad()
def angular_distances(model, windows: torch.LongTensor, block: int, batch_size: int = 16) -> torch.Tensor:
    """[L - block + 1] float64: entry l is d(l, l + block) averaged over the windows' last tokens.

    `windows` is [N, T] token ids, full windows (no padding). The model is run in eval mode (its mode is restored).
    """
    decoder = model.get_decoder()
    _, layers = _decoder_layers(model)
    num_layers = len(layers)
    _check_block(num_layers, block)
    if windows.ndim != 2 or windows.shape[0] == 0 or windows.shape[1] == 0:
        raise InvalidRequest(f"windows must be a non-empty [N, T] tensor of token ids, not {tuple(windows.shape)}")
    captured = []  # the final norm's input: [B, T, H] pre-norm output of the last layer
    hook = decoder.norm.register_forward_pre_hook(lambda module, args: captured.append(args[0]))
    was_training = model.training
    model.eval()
    total = torch.zeros(num_layers - block + 1, dtype=torch.float64)
    try:
        device = next(model.parameters()).device
        for i in range(0, len(windows), batch_size):
            captured.clear()
            ids = windows[i:i + batch_size].to(device)  # [B, T]
            out = decoder(input_ids=ids, output_hidden_states=True, use_cache=False)  # no LM head needed
            states = [*out.hidden_states[:num_layers], captured[-1]]  # L + 1 of [B, T, H]; last one pre-norm
            h = torch.stack([s[:, -1] for s in states]).double()  # [L + 1, B, H] at the last token
            h = h / h.norm(dim=-1, keepdim=True)
            cos = (h[:-block] * h[block:]).sum(-1).clamp(-1.0, 1.0)  # [L - block + 1, B]
            total += (torch.arccos(cos) / torch.pi).sum(-1).cpu()
    finally:
        hook.remove()
        model.train(was_training)
    return total / len(windows)


def least_distance_block(distances: torch.Tensor) -> int:
    """l* = argmin_l d(l, l + n): the first layer of the block to drop (the earliest on a tie)."""
    return int(torch.as_tensor(distances).argmin())


def drop_layers(model, start: int, count: int):
    """A new model of `model`'s class without decoder layers start .. start + count - 1; `model` is untouched.

    Built from a copy of the config: num_hidden_layers reduced, and every top-level list of length L (such as
    `layer_types`; token ids and `architectures` excepted) taken to be per layer and trimmed the same way. So
    the kept layers are renumbered 0 .. L' - 1 (attention `layer_idx`, KV cache slots). Every parameter and
    buffer (RoPE's non-persistent `inv_freq` included) is copied from the original with its dtype, device and
    requires_grad; tied weights stay tied.
    """
    prefix, layers = _decoder_layers(model)
    num_layers = len(layers)
    if not 1 <= count < num_layers:
        raise InvalidRequest(f"can drop 1 .. {num_layers - 1} of {num_layers} layers, not {count}")
    if not 0 <= start <= num_layers - count:
        raise InvalidRequest(f"a block of {count} layers must start in 0 .. {num_layers - count}, not {start}")
    config = copy.deepcopy(model.config)
    for key, value in list(vars(config).items()):  # e.g. layer_types (None on Llama, a list on Qwen2/Gemma)
        if (isinstance(value, (list, tuple)) and len(value) == num_layers
                and not key.endswith(("token_id", "token_ids", "architectures"))):  # lists that are not per layer
            setattr(config, key, type(value)(v for i, v in enumerate(value) if not start <= i < start + count))
    config.num_hidden_layers = num_layers - count
    new = type(model)(config)  # randomly initialised (which also ties the weights the config ties), then overwritten
    layer_name = re.compile(rf"^{re.escape(prefix)}\.(\d+)\.")

    def old_name(name: str) -> str:  # new layer j is old layer j (j < start) or j + count
        return layer_name.sub(lambda m: f"{prefix}.{int(m[1]) + count * (int(m[1]) >= start)}.", name)

    old = dict(chain(model.named_parameters(remove_duplicate=False), model.named_buffers(remove_duplicate=False)))
    copies = {}  # id(source) -> its copy: a tied pair gets one copy, assigned to one shared Parameter
    with torch.no_grad():
        for name, tensor in chain(new.named_parameters(remove_duplicate=False),
                                  new.named_buffers(remove_duplicate=False)):
            source = old[old_name(name)]
            if id(source) not in copies:
                copies[id(source)] = source.detach().clone()
            tensor.data = copies[id(source)]
            if isinstance(tensor, torch.nn.Parameter):
                tensor.requires_grad_(source.requires_grad)
    new.generation_config = copy.deepcopy(model.generation_config)
    return new.train(model.training)


def prune_report(model, windows: torch.LongTensor, block: int) -> dict:
    """The numbers for the model card: every block's distance, the chosen start and the "last n" baseline."""
    distances = angular_distances(model, windows, block)
    start = least_distance_block(distances)
    last = len(distances) - 1  # the block of the last n layers starts at L - n
    return {"method": "angular distance at the last token (Gromov et al. 2403.17887; Thangarasa et al. 2410.09982)",
            "block": block, "num_layers": len(distances) + block - 1,
            "windows": int(windows.shape[0]), "window_tokens": int(windows.shape[1]),
            "distances": [float(d) for d in distances],
            "start": start, "layers_removed": list(range(start, start + block)), "distance": float(distances[start]),
            "last_block_start": last, "last_block_distance": float(distances[last])}
