"""The shipped code-model pair: one byte-level BPE tokenizer and two plain `LlamaForCausalLM` configs.

Both are standard transformers models so Hugging Face assisted generation can run the same pair.
"""

from __future__ import annotations

from pathlib import Path

ASSETS_CODE = Path(__file__).resolve().parents[2] / "assets" / "code"
BOS, EOS, PAD = "<bos>", "<eos>", "<pad>"
VOCAB_SIZE = 4096  # with tied embeddings the 2 x 128 draft stays under 1.0 M parameters

# role -> LlamaConfig fields. The target's untied head adds capacity at the same per-token cost of the
# head itself; the draft ties them because at d = 128 the embedding is half of its parameters.
ARCHITECTURES = {
    "target": dict(hidden_size=384, intermediate_size=1024, num_hidden_layers=6, num_attention_heads=6,
                   num_key_value_heads=6, tie_word_embeddings=False),
    "draft": dict(hidden_size=128, intermediate_size=384, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=4, tie_word_embeddings=True),
}


def train_tokenizer(texts: list[str], vocab_size: int = VOCAB_SIZE):
    """A byte-level BPE over `texts` wrapped as a `PreTrainedTokenizerFast` (any byte string round-trips)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    # No prefix space and no trimming: decode(encode(s)) must give back s byte for byte.
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[PAD, BOS, EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    # the models train on `<bos> text <eos>`: encoding a prompt adds the BOS they were trained after, as
    # transformers' generate expects of a tokenizer (the token caches encode without special tokens)
    tok.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", pair=f"{BOS} $A {BOS}:1 $B:1",
                                                       special_tokens=[(BOS, tok.token_to_id(BOS))])
    return wrap_tokenizer(tok)


def wrap_tokenizer(tok):
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD,
                                   clean_up_tokenization_spaces=False, model_max_length=1024)


def load_tokenizer(path: str | Path):
    """The tokenizer saved in folder `path` (or a `tokenizer.json` file) with bos/eos/pad set."""
    from transformers import PreTrainedTokenizerFast

    path = Path(path)
    file = path if path.suffix == ".json" else path / "tokenizer.json"
    return PreTrainedTokenizerFast(tokenizer_file=str(file), bos_token=BOS, eos_token=EOS, pad_token=PAD,
                                   clean_up_tokenization_spaces=False, model_max_length=1024)


def model_config(role: str, tokenizer, **overrides):
    """The role's LlamaConfig for `tokenizer`; `overrides` replace its fields (e.g. a wider draft)."""
    from transformers import LlamaConfig

    if role not in ARCHITECTURES:
        raise ValueError(f"role must be one of {sorted(ARCHITECTURES)}, not {role!r}")
    fields = {"max_position_embeddings": 1024, **ARCHITECTURES[role], **overrides}
    return LlamaConfig(vocab_size=len(tokenizer), rms_norm_eps=1e-5,
                       rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                       bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                       pad_token_id=tokenizer.pad_token_id, **fields)


def draft_shape(width: int, layers: int, context: int = 1024) -> dict:
    """LlamaConfig fields of a tied-embedding draft `width` wide and `layers` deep (heads of 64, MLP 3x)."""
    if width < 64 or width % 64 or layers < 1:
        raise ValueError(f"a draft shape needs a width that is a multiple of 64 and >= 1 layer, got {width}x{layers}")
    heads = width // 64
    return dict(hidden_size=width, intermediate_size=3 * width, num_hidden_layers=layers, num_attention_heads=heads,
                num_key_value_heads=heads, tie_word_embeddings=True, max_position_embeddings=context)


def build_model(role: str, tokenizer, **overrides):
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM(model_config(role, tokenizer, **overrides))
