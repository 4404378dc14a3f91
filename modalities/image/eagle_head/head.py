"""The head: one Llama decoder layer over fc([embedding of token t; target feature at t - 1]), trained to predict
the target's feature at t (its last hidden state, after the final norm); the target's own `lm_head` turns a
predicted feature into the draft's logits for token t + 1. At tree depth > 1 the head feeds on its own predicted
features (EAGLE-1). Sizes here keep the shipped head under 1 MB in fp16: one key/value head (GQA) and a narrow MLP.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from specgen.errors import ModelNotFound

FC_FILE = "fc.safetensors"
HEAD_FILE = "head.json"


def head_config(target_config, intermediate_size: int = 192, kv_heads: int = 1):
    from transformers import LlamaConfig

    return LlamaConfig(hidden_size=target_config.hidden_size, intermediate_size=intermediate_size,
                       num_hidden_layers=1, num_attention_heads=target_config.num_attention_heads,
                       num_key_value_heads=kv_heads, vocab_size=1,  # inputs come as vectors: no table of its own
                       max_position_embeddings=target_config.max_position_embeddings,
                       rms_norm_eps=target_config.rms_norm_eps, rope_parameters=target_config.rope_parameters,
                       bos_token_id=None, eos_token_id=None, pad_token_id=None, tie_word_embeddings=False)


class EagleHead(nn.Module):
    def __init__(self, config):
        from transformers import LlamaForCausalLM

        super().__init__()
        self.body = LlamaForCausalLM(config)  # its 1-row embedding and lm_head are never used
        self.fc = nn.Linear(2 * config.hidden_size, config.hidden_size, bias=False)

    @classmethod
    def for_target(cls, target_model, **sizes) -> "EagleHead":
        return cls(head_config(target_model.config, **sizes))

    def inputs(self, token_embeddings: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        # [rows, n, d] each -> [rows, n, d]
        return self.fc(torch.cat([token_embeddings, features.to(token_embeddings.dtype)], -1))

    def forward(self, token_embeddings, features, position_ids):
        """Training: a causal pass over whole sequences. Returns the predicted features [rows, n, d]."""
        hidden = self.inputs(token_embeddings, features)
        return self.body.model(inputs_embeds=hidden, position_ids=position_ids).last_hidden_state

    def save(self, folder: Path, add_files=None) -> Path:
        from safetensors.torch import save_file

        from specgen.modalities.training import export_fp16

        def extra(tmp: Path):
            save_file({"weight": self.fc.weight.detach().half().contiguous()}, str(tmp / FC_FILE))
            if add_files is not None:
                add_files(tmp)

        return export_fp16(self.body, folder, add_files=extra)

    @classmethod
    def load(cls, folder: str | Path, dtype=torch.float32) -> "EagleHead":
        from safetensors.torch import load_file
        from transformers import LlamaConfig

        folder = Path(folder)
        if not (folder / "config.json").exists() or not (folder / FC_FILE).exists():
            raise ModelNotFound(f"no draft head in {str(folder)!r} (expected config.json, model.safetensors and "
                                f"{FC_FILE}); train one with `specgen train image-head`")
        head = cls(LlamaConfig.from_pretrained(folder))
        from transformers import LlamaForCausalLM
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        head.body = LlamaForCausalLM.from_pretrained(folder, dtype=dtype, local_files_only=True)
        head.fc.weight.data = load_file(str(folder / FC_FILE))["weight"].to(dtype)
        return head.to(dtype).eval()


def head_info(folder: str | Path) -> dict:
    """The training summary saved beside a head (head.json), or {}."""
    path = Path(folder) / HEAD_FILE
    return json.loads(path.read_text()) if path.exists() else {}
