"""Hugging Face Janus image generation under the shared core, on a tiny random config (float64): greedy AR and
Jacobi decoding equal `JanusForConditionalGeneration.generate(..., generation_mode="image")` token for token,
and sampled codes match the exact guided target (chi-square)."""

import pytest
import torch
from transformers import GenerationConfig, JanusConfig, JanusForConditionalGeneration

from specgen.errors import InvalidRequest
from specgen.modalities.image.janus import JanusImageGenerator, is_janus
from specgen.samplers.chisquare import goodness_of_fit
from specgen.samplers.oracle import target_joint
from specgen.samplers.processing import Processing

PROMPT = [2, 10, 11, 12, 3]  # BOS, three text tokens, BOI
GUIDANCE = 3.0


@pytest.fixture(scope="module")
def janus():
    torch.manual_seed(0)
    config = JanusConfig(  # the image path needs vq projection_dim == text hidden_size
        text_config={"model_type": "llama", "vocab_size": 99, "hidden_size": 32, "num_hidden_layers": 2,
                     "num_attention_heads": 4, "intermediate_size": 37, "max_position_embeddings": 512,
                     "pad_token_id": 1},
        vision_config={"image_size": 20, "patch_size": 5, "num_image_tokens": 16, "hidden_size": 32,
                       "projection_dim": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "mlp_ratio": 2},
        vq_config={"embed_dim": 12, "num_embeddings": 24, "latent_channels": 12, "in_channels": 3, "base_channels": 32,
                   "channel_multiplier": [1, 1], "projection_dim": 32, "image_token_embed_dim": 32, "num_patches": 4},
        image_token_id=0)
    model = JanusForConditionalGeneration(config).double().eval()
    torch.manual_seed(1)
    with torch.no_grad():  # a wide initialisation: varied codes instead of one repeated code
        for name, param in model.named_parameters():
            if param.dim() >= 2 and "vqmodel" not in name:
                torch.nn.init.normal_(param, std=0.3)
    model.generation_config = GenerationConfig(do_sample=False, guidance_scale=GUIDANCE, bos_token_id=2,
                                               pad_token_id=1, max_length=64, generation_kwargs={"boi_token_id": 3})
    return model


def test_greedy_equals_janus_generate(janus):
    ids = torch.tensor([PROMPT])
    expected = janus.generate(ids, attention_mask=torch.ones_like(ids), generation_mode="image",
                              generation_config=janus.generation_config)[0].tolist()
    assert len(set(expected)) > 4  # a varied image, so the comparison means something
    generator = JanusImageGenerator(model=janus)
    for method in ("ar", "sjd", "mc-sjd", "gumbel-sjd"):
        knobs = {} if method == "ar" else {"window": 6}
        result = generator.generate(PROMPT, method=method, temperature=0, guidance_scale=GUIDANCE, **knobs)
        assert result.tokens[0] == expected, method
    assert generator.decode(result.tokens).shape[0] == 1


class GuidedJanus:
    """Guided codebook logits after a context (prompt + codes, in the image LM's id space), for the oracle."""

    def __init__(self, generator):
        self.generator = generator
        self.prompt = generator.shifted(PROMPT).tolist()
        self.uncond = generator.uncond(generator.shifted(PROMPT)).tolist()

    def logits(self, context):
        codes = list(context)[len(self.prompt):]
        cond = self.generator.lm.full_logits(list(context))
        uncond = self.generator.lm.full_logits(self.uncond + codes)
        return uncond + GUIDANCE * (cond - uncond)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["sjd", "mc-sjd", "gumbel-sjd"])
def test_sampling_matches_the_guided_janus_target(janus, method):
    generator = JanusImageGenerator(model=janus)
    oracle = GuidedJanus(generator)
    expected = target_joint(oracle, Processing(top_k=3), oracle.prompt, 3)
    knobs = {} if method == "ar" else {"window": 4}
    result = generator.generate(PROMPT, method=method, top_k=3, guidance_scale=GUIDANCE, num_samples=2000, seed=4,
                                max_new_tokens=3, **knobs)
    fit = goodness_of_fit([tuple(t) for t in result.tokens], expected)
    assert fit.p_value > 1e-4, fit


def test_a_prompt_must_end_with_boi(janus):
    with pytest.raises(InvalidRequest, match="BOI"):
        JanusImageGenerator(model=janus).generate([2, 10, 11], method="ar")


def _save_processor(folder):
    """A character tokenizer with Janus's special tokens and a one-line chat template, saved as a JanusProcessor."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import JanusImageProcessor, JanusProcessor, PreTrainedTokenizerFast

    special = ["<unk>", "<pad>", "<bos>", "<begin_of_image>", "<end_of_image>", "<image_placeholder>"]  # ids 0-5
    vocab = {**{token: i for i, token in enumerate(special)},
             **{c: i + len(special) for i, c in enumerate("abcdefghijklmnopqrstuvwxyz :|<>")}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tok.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", pad_token="<pad>",
                                        extra_special_tokens={"image_token": "<image_placeholder>",
                                                              "boi_token": "<begin_of_image>",
                                                              "eoi_token": "<end_of_image>"})
    template = ("{% for m in messages %}<|{{ m['role'] }}|>: {% for c in m['content'] %}{{ c['text'] }}{% endfor %}"
                "{% endfor %}{% if add_generation_prompt %}<|assistant|>:{% endif %}")
    JanusProcessor(JanusImageProcessor(size={"height": 20, "width": 20}), tokenizer, chat_template=template,
                   num_image_tokens=16).save_pretrained(folder)


def test_a_janus_folder_takes_text_prompts(janus, tmp_path):
    janus.save_pretrained(tmp_path)
    _save_processor(tmp_path)
    assert is_janus(tmp_path) and not is_janus(tmp_path / "missing")
    generator = JanusImageGenerator(str(tmp_path), dtype=torch.float64)
    ids = generator.encode("a red cat")
    assert int(ids[-1]) == generator.boi  # the chat turn, then BOI
    expected = generator.lm.janus.generate(ids[None], attention_mask=torch.ones_like(ids[None]), generation_mode="image",
                                           generation_config=generator.lm.janus.generation_config)[0].tolist()
    result = generator.generate("a red cat", method="sjd", temperature=0, guidance_scale=GUIDANCE, window=6)
    assert result.tokens[0] == expected
    image, pixels = generator.images(result.tokens)[0], generator.decode(result.tokens)[0]  # [H, W, 3]
    assert image.size == (pixels.shape[1], pixels.shape[0]) and image.mode == "RGB"
    with pytest.raises(InvalidRequest, match="no processor"):
        JanusImageGenerator(model=janus).generate("a red cat", method="ar")


def test_generate_image_serves_a_janus_folder(janus, tmp_path, capsys):
    import json

    from PIL import Image

    from specgen.app.cli import main

    janus.save_pretrained(tmp_path / "janus")
    _save_processor(tmp_path / "janus")
    out = tmp_path / "cat.png"
    args = ["generate", "image", "--model", str(tmp_path / "janus"), "--prompt", "a red cat", "--temperature", "0",
            "--out", str(out), "--json"]
    assert main([*args, "--method", "sjd", "--window", "6"]) == 0
    record = json.loads(capsys.readouterr().out)
    expected = JanusImageGenerator(str(tmp_path / "janus")).generate("a red cat", method="ar", temperature=0)
    assert record["tokens"] == expected.tokens[0] and record["stats"]["method"] == "sjd"
    assert Image.open(out).mode == "RGB"
    assert main([*args, "--method", "eagle"]) == 2  # Janus has no draft head: one error line
    assert capsys.readouterr().err.strip().startswith("error: ")
