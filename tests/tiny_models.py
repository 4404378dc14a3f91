"""Tiny random-init Llama checkpoints with a character tokenizer, saved to a folder: what every text test loads
(tests never use the shipped checkpoints)."""

import socket

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

CHARS = "abcdefghijklmnopqrstuvwxyz (){}:=\n"


def save_tiny(folder, seed, vocab_chars=CHARS, layers=2, hidden=32, wide=False) -> str:
    """wide=True: a wide initialisation keeps top-2 logit margins far above float rounding (so another attention
    path cannot flip a near-tie) and a zero <eos> logit lets runs go the full length."""
    fast = char_tokenizer(vocab_chars)
    torch.manual_seed(seed)
    extra = {"initializer_range": 0.2} if wide else {}
    config = LlamaConfig(vocab_size=len(fast), hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=96, bos_token_id=0, eos_token_id=1, **extra)
    model = LlamaForCausalLM(config)
    if wide:
        with torch.no_grad():
            model.lm_head.weight[1] = 0
    model.save_pretrained(folder)
    fast.save_pretrained(folder)
    return str(folder)


def char_tokenizer(vocab_chars=CHARS) -> PreTrainedTokenizerFast:
    """One token per character, <bos> = 0 and <eos> = 1."""
    vocab = {"<bos>": 0, "<eos>": 1, **{c: i + 2 for i, c in enumerate(vocab_chars)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<eos>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>")


def tiny_gemma3(seed=0, vocab=len(CHARS) + 2, hidden=64, head_dim=16, dtype=torch.float32):
    """A tiny random Gemma 3 text model: two sliding-window layers (window 8) and one global layer, tied
    embeddings, one key/value head, as the real 270M model."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(seed)
    config = Gemma3TextConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=3,
                              num_attention_heads=4, num_key_value_heads=1, head_dim=head_dim,
                              max_position_embeddings=256, sliding_window=8, bos_token_id=0, eos_token_id=1,
                              pad_token_id=1, layer_types=["sliding_attention", "sliding_attention", "full_attention"])
    return Gemma3ForCausalLM(config).to(dtype).eval()


def save_tiny_gemma_served(folder, seed=0) -> str:
    """A tiny Gemma 3 packed into the served int8 format (what `gemma` resolves to after conversion)."""
    from specgen.modalities.text.gemma import save_served

    save_served(tiny_gemma3(seed), char_tokenizer(), folder)
    return str(folder)


def score_tree(model, prompt):
    """Score a 7-node draft tree after `prompt` (node 0 is the pending last prompt token; node 4 is not adjacent
    to its parent 1). Returns (target, tree, logits [1, 7, vocab], contexts), contexts[node] being the prompt
    followed by the drafted tokens on the node's path: what plain decoding would have seen."""
    from specgen.modalities.runtime.transformers_adapter import TransformersTarget
    from specgen.samplers.types import DraftTree

    #        0  1  2  3  4  5  6
    parents = [-1, 0, 0, 1, 1, 2, 3]
    tokens = [int(prompt[-1]), 5, 7, 9, 11, 13, 15]
    tree = DraftTree.from_parents(tokens, parents)
    target = TransformersTarget(model)
    target.prefill([prompt])
    logits = target.score(tree.tokens, len(prompt) - 1 + tree.depths, torch.tensor([0]), tree.ancestor_mask)
    contexts = [prompt.tolist() + [tokens[i] for i in tree.ancestor_mask[0, node].nonzero().flatten().tolist()[1:]]
                for node in range(len(tokens))]
    return target, tree, logits, contexts


def save_tiny_pair(root, wide=False) -> tuple[str, str]:
    return save_tiny(root / "target", 0, wide=wide), save_tiny(root / "draft", 1, layers=1, hidden=16, wide=wide)


def save_tiny_image_model(root, *, num_codes, grid, seed=0, frames=1):
    """A tiny random image token model (target/ with vocab.json; a video model when frames > 1) and a tiny random
    VQ (vq/) under root."""
    from specgen.modalities.image.conditions import ImageVocab
    from specgen.modalities.image.vq import build_vq, save_vq

    words = ("red", "blue", "on", "K", "digit", "3") + (("moving", "right") if frames > 1 else ())
    vocab = ImageVocab(num_codes=num_codes, words=words, prefix_length=4 if frames == 1 else 6, grid=grid,
                       frames=frames)
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab.vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=max(64, vocab.sequence_length),
                         initializer_range=0.3, bos_token_id=vocab.bos, eos_token_id=None)
    LlamaForCausalLM(config).save_pretrained(root / "target")
    vocab.save(root / "target" / "vocab.json")
    vq = build_vq(block_out_channels=(8, 8, 8), norm_num_groups=8, latent_channels=4, vq_embed_dim=4,
                  num_vq_embeddings=num_codes, sample_size=4 * grid)
    save_vq(vq, root / "vq")
    return root / "target", root / "vq"


def save_tiny_image_head(root, target_folder, seed=7):
    """A random EAGLE-style head for a tiny image model (weights scaled up so it drafts more than noise)."""
    from specgen.modalities.image.eagle_head.head import EagleHead
    from specgen.modalities.image.models import load_image_lm

    torch.manual_seed(seed)
    head = EagleHead.for_target(load_image_lm(target_folder), intermediate_size=32)
    for p in head.parameters():
        p.data.mul_(3)
    return head.save(root / "head")


def save_tiny_speech_models(root, *, num_tokens, seed=0, layout="prefix"):
    """A random target, a random draft and a random codebook for a vocabulary of `num_tokens` acoustic tokens."""
    from specgen.modalities.speech.codec import AcousticCodec
    from specgen.modalities.speech.models import SpeechVocab

    vocab = SpeechVocab(num_tokens=num_tokens, voices=("slt", "awb"), chars="abcdefghijklmnopqrstuvwxyz ,.'?!-",
                        layout=layout)
    folders = {}
    for role, hidden, layers in (("target", 32, 2), ("draft", 16, 1)):
        torch.manual_seed(seed + (role == "draft"))
        config = LlamaConfig(vocab_size=vocab.vocab_size, hidden_size=hidden, intermediate_size=2 * hidden,
                             num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                             max_position_embeddings=128, initializer_range=0.3, bos_token_id=vocab.bos,
                             eos_token_id=vocab.eos)
        model = LlamaForCausalLM(config)
        with torch.no_grad():  # EOS logit 0: some samples stop early, most run to the cap
            model.lm_head.weight[vocab.eos] = 0
        model.save_pretrained(root / role)
        vocab.save(root / role / "vocab.json")
        folders[role] = root / role
    g = torch.Generator().manual_seed(seed)
    AcousticCodec(torch.randn(num_tokens, 80, generator=g) - 4).save(root / "codec")
    return folders["target"], folders["draft"], root / "codec"


SPOKEN = ("keep them in one big pile", "good night", "where is the door", "the sun is hot", "open the box",
          "we can go home now")


def save_tiny_speech_corpus(folder, *, num_tokens, voices=("slt", "awb"), utterances=12, frames=24, seed=0):
    """An encoded corpus (tokens.npz, the layout `train --role tokens` writes) of random token sequences with
    plain English sentences (every word in pocketsphinx's dictionary), voices in turn."""
    import numpy as np

    rng = np.random.default_rng(seed)
    lengths = rng.integers(frames, 2 * frames, size=utterances)
    folder.mkdir(parents=True, exist_ok=True)
    np.savez(folder / "tokens.npz", tokens=rng.integers(0, num_tokens, size=int(lengths.sum())).astype(np.uint16),
             offsets=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
             texts=np.array([SPOKEN[i % len(SPOKEN)] for i in range(utterances)]),
             voices=np.array([voices[i % len(voices)] for i in range(utterances)]),
             ids=np.array([f"u{i:03d}" for i in range(utterances)]))
    return folder


def save_say_corpus(folder):
    """16 random-token utterances of "say one/two/three/four now." (30-44 frames, voices slt and awb in turn) and a
    random 32-token codebook in folder/codec: a corpus small enough to align and train on in seconds.
    Returns (texts, frame counts)."""
    import numpy as np

    from specgen.modalities.speech.codec import AcousticCodec

    rng = np.random.default_rng(1)
    texts = [f"say {w} now." for w in ("one", "two", "three", "four")] * 4
    lengths = rng.integers(30, 45, size=len(texts))
    np.savez_compressed(folder / "tokens.npz", tokens=rng.integers(0, 32, size=int(lengths.sum())).astype(np.uint16),
                        offsets=np.concatenate([[0], np.cumsum(lengths)]), num_tokens=np.array(32),
                        texts=np.array(texts), voices=np.array(["slt", "awb"] * 8),
                        ids=np.array([str(i) for i in range(len(texts))]))
    AcousticCodec(torch.randn(32, 80, generator=torch.Generator().manual_seed(0))).save(folder / "codec")
    return texts, lengths


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(demo):
    """Launch a Gradio app on a free local port for a module's tests; yields its URL and closes it after."""
    _, url, _ = demo.launch(server_name="127.0.0.1", server_port=free_port(), prevent_thread_lock=True,
                            quiet=True, ssr_mode=False)
    try:
        yield url
    finally:
        demo.close()


class GuidedTransformers:
    """The guided logits of an image or clip token model, as `target_joint` wants them (float64 forward
    passes): uncond + scale * (cond - uncond) on the last position."""

    def __init__(self, model, vocab, prompt, scale):
        self.model, self.vocab, self.scale = model, vocab, scale
        self.prompt, self.uncond = vocab.prompt_ids(prompt).tolist(), vocab.uncond_ids().tolist()

    def forward(self, ids):
        with torch.no_grad():
            return self.model(input_ids=torch.tensor([ids])).logits[0, -1].double()

    def logits(self, context):
        generated = list(context)[len(self.prompt):]
        cond, uncond = self.forward(list(context)), self.forward(self.uncond + generated)
        return uncond + self.scale * (cond - uncond)


class HFTable:
    """A transformers model as `lm.logits(context)`, for the exact joint of an enumeration test."""

    def __init__(self, model):
        self.model = model

    @torch.no_grad()
    def logits(self, context):
        return self.model(input_ids=torch.tensor([list(context)])).logits[0, -1].double()
