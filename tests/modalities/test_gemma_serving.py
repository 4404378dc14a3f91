"""Gemma 3 serving: row-invariant int8 layers and the batch-invariant runner (a token scored in a window or a
tree gets the logits plain decoding gives it, bit for bit; dense layers fail the same test), the served
folder, the `gemma` alias, the default model and the missing extra. Tiny random models throughout; the real
conversion runs only with SPECGEN_GEMMA_TESTS=1 and the gemma extra."""

import json
import os

import pytest
import torch

from specgen.errors import MissingExtra
from specgen.modalities.runtime.gemma_runner import GemmaRunner
from specgen.modalities.runtime.int8_linear import Int8Linear, quantize_model
from specgen.modalities.text import gemma
from specgen.modalities.text.ngram import PromptLookupDrafter
from specgen.modalities.runtime.transformers_adapter import TransformersTarget
from specgen.samplers.acceptance import GreedyMatch
from specgen.samplers.loop import generate
from specgen.samplers.length_policies import FixedLength
from specgen.samplers.processing import Processing
from tiny_models import save_tiny, save_tiny_gemma_served, score_tree, tiny_gemma3

ROW = torch.tensor([0])


def test_int8_linear_rows_do_not_depend_on_the_number_of_rows_and_fuse_exactly():
    torch.manual_seed(0)
    first, second = torch.nn.Linear(96, 40, bias=False), torch.nn.Linear(96, 24, bias=False)
    layer, other = Int8Linear.from_linear(first), Int8Linear.from_linear(second)
    x = torch.randn(9, 96)
    # within int8/bf16 rounding of the float layer
    assert torch.allclose(layer(x), first(x), atol=0.05 * first(x).abs().max().item())
    alone = [layer(x[i:i + 1]) for i in range(9)]
    for rows in range(1, 10):
        assert torch.equal(layer(x[:rows]), torch.cat(alone[:rows]))
    fused = Int8Linear.concat([layer, other])(x)
    assert torch.equal(fused, torch.cat([layer(x), other(x)], -1))


def test_int8_linear_is_quantized_once_per_layer_and_weight_version():
    linear = torch.nn.Linear(32, 16, bias=False)
    layer = Int8Linear.from_linear(linear)
    assert Int8Linear.from_linear(linear) is layer  # a second runner over the same draft reuses its rows
    with torch.no_grad():
        linear.weight.mul_(2.0)  # changed in place: quantized again
    again = Int8Linear.from_linear(linear)
    assert again is not layer and torch.equal(again.scales, 2.0 * layer.scales)


def plain_logits(model, sequence, start):
    """Logits of positions start..len-2, each scored alone after the previous ones (plain decoding)."""
    target = TransformersTarget(model)
    target.prefill([sequence[:start + 1]])
    out = []
    for position in range(start, len(sequence) - 1):
        out.append(target.score(sequence[position:position + 1][None], torch.tensor([[position]]), ROW)[0, 0])
        target.commit(torch.ones(1, 1, dtype=torch.bool), ROW)
    return out


def window_mismatches(model, windows=(2, 3, 4, 5, 8)) -> int:
    """Score the sequence in windows (keeping 2 slots each time, rolling back the rest) and count the slots
    whose logits differ in any bit from plain decoding's."""
    sequence = torch.randint(0, model.config.vocab_size, (40,), generator=torch.Generator().manual_seed(1))
    start = 4
    plain = plain_logits(model, sequence, start)
    mismatches = 0
    for window in windows:
        target = TransformersTarget(model)
        target.prefill([sequence[:start + 1]])
        position = start
        while position < len(sequence) - 1:
            n = min(window, len(sequence) - 1 - position)
            logits = target.score(sequence[position:position + n][None], torch.arange(position, position + n)[None], ROW)
            mismatches += sum(not torch.equal(logits[0, i], plain[position - start + i]) for i in range(n))
            keep = min(2, n)
            target.commit(torch.arange(n)[None] < keep, ROW)
            position += keep
    return mismatches


def test_rolled_rotary_equals_rotate_half_bit_for_bit():
    """The runner rotates with x.roll(half) and a sine whose first half is negated: the same bits as
    transformers' x * cos + rotate_half(x) * sin."""
    from specgen.modalities.runtime.gemma_runner import _rolled_sin
    from specgen.modalities.runtime.llama_runner import rotate_half

    generator = torch.Generator().manual_seed(4)
    q, cos, sin = (torch.randn(*shape, generator=generator) for shape in ((2, 4, 5, 64), (2, 1, 5, 64), (2, 1, 5, 64)))
    rolled_cos, rolled_sin = _rolled_sin(cos, sin)
    assert torch.equal(q * cos + rotate_half(q) * sin, q * rolled_cos + q.roll(32, -1) * rolled_sin)


def test_windows_score_bitwise_as_plain_decoding_when_served_int8():
    model = quantize_model(tiny_gemma3())
    assert isinstance(TransformersTarget(model).runner, GemmaRunner)
    assert window_mismatches(model) == 0  # sliding window 8 is crossed many times over 40 tokens


def test_layer_ranges_and_input_vectors_give_a_whole_forwards_bits():
    """The runner's per-layer entry (what a self-draft or an early exit cuts the target at): chained layer ranges, and
    the scaled embeddings scored as input vectors, give the logits of one whole forward bit for bit."""
    model = quantize_model(tiny_gemma3(2))
    tokens = torch.randint(0, model.config.vocab_size, (1, 12), generator=torch.Generator().manual_seed(3))
    positions = torch.arange(12)[None]
    whole = TransformersTarget(model)
    whole.prefill([tokens[0, :1]])
    runner, layers, masks = whole.runner, len(whole.runner.layers), []
    forward = runner.forward
    runner.forward = lambda *args, **kwargs: masks.append(args[3]) or forward(*args, **kwargs)  # the masks it gets
    expected = whole.score(tokens[:, 1:], positions[:, 1:], ROW)  # 11 slots: the sliding window (8) is crossed
    for cuts in ((0, 1, layers), (0, layers // 2, layers - 1, layers)):
        target = TransformersTarget(model)
        target.prefill([tokens[0, :1]])
        target.cache.begin(ROW, 11)
        hidden = runner.embed(tokens[:, 1:])
        for first, last in zip(cuts, cuts[1:]):
            hidden = runner.forward_hidden(hidden, positions[:, 1:], target.cache, masks[0],
                                           layers=range(first, last))
        assert torch.equal(runner.output(hidden), expected)
    vectors = TransformersTarget(model)
    vectors.prefill([tokens[0, :1]])
    hidden = vectors.score(runner.embed(tokens[:, 1:]), positions[:, 1:], ROW)
    assert torch.equal(runner.output(hidden), expected)


def test_dense_layers_fail_the_same_invariance_test():
    """Negative control: the same runner over dense fp32 layers changes logits with the window size."""
    assert window_mismatches(tiny_gemma3()) > 0


def test_tree_nodes_and_ragged_rows_score_bitwise_as_alone():
    model = quantize_model(tiny_gemma3(1))
    vocab = model.config.vocab_size
    prompt = torch.randint(0, vocab, (14,), generator=torch.Generator().manual_seed(2))
    _, _, logits, contexts = score_tree(model, prompt)
    for node, context in enumerate(contexts):
        sequence = torch.tensor(context + [0])
        assert torch.equal(logits[0, node], plain_logits(model, sequence, len(sequence) - 2)[0]), node
    # a ragged batch: each row equals that row run alone
    prompts = [prompt[:5], prompt, prompt[:9]]
    batch = TransformersTarget(model)
    batch.prefill(prompts)
    window = torch.stack([torch.tensor([int(p[-1]), 3, 4, 6]) for p in prompts])
    positions = torch.tensor([len(p) - 1 for p in prompts])[:, None] + torch.arange(4)
    scored = batch.score(window, positions, torch.arange(3))
    for r, p in enumerate(prompts):
        alone = TransformersTarget(model)
        alone.prefill([p])
        assert torch.equal(scored[r], alone.score(window[r:r + 1], positions[r:r + 1], ROW)[0]), r


def test_prompt_lookup_on_the_served_model_equals_plain_greedy():
    model = quantize_model(tiny_gemma3(2))
    greedy = Processing(temperature=0)
    prompts = [torch.tensor([0, 3, 4, 5, 3, 4, 5, 3, 4]), torch.tensor([0, 7, 8, 7, 8, 7])]
    plain = generate(TransformersTarget(model), None, GreedyMatch(), prompts, processing=greedy, max_new_tokens=48)
    spec = generate(TransformersTarget(model), PromptLookupDrafter(2), GreedyMatch(), prompts, processing=greedy,
                    max_new_tokens=48, policy=FixedLength(3))
    assert spec.tokens == plain.tokens and spec.stats["accepted"] > 0


def test_a_queue_served_on_the_gemma_runner_equals_each_prompt_alone():
    """Continuous batching on Gemma's runner (sliding-window layers): rows refilled with new prompts by
    `prefill_rows` give every request the tokens plain greedy decoding gives it alone."""
    from specgen.samplers.loop import speculative_generate

    model = quantize_model(tiny_gemma3(2))
    greedy = Processing(temperature=0)
    rng = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, model.config.vocab_size, (n,), generator=rng) for n in (3, 17, 9, 30, 5)]
    prompts[1][8:] = prompts[1][:9].clone()  # a repeat for prompt lookup to copy
    served: dict[int, list[int]] = {}
    for event in speculative_generate(TransformersTarget(model), PromptLookupDrafter(2), GreedyMatch(), prompts[:2],
                                      processing=greedy, max_new_tokens=24, policy=FixedLength(3),
                                      queue=iter(list(enumerate(prompts))[2:])):
        served.setdefault(event.sample, []).extend(event.tokens)
    for index, prompt in enumerate(prompts):
        alone = generate(TransformersTarget(model), None, GreedyMatch(), [prompt], processing=greedy,
                         max_new_tokens=24)
        assert served[index] == alone.tokens[0], index
    assert model.config.sliding_window < 30 + 24  # the longest request crosses the sliding window


def test_served_folder_round_trip_is_bitwise(tmp_path):
    folder = save_tiny_gemma_served(tmp_path / "served", seed=3)
    reference = quantize_model(tiny_gemma3(3))
    loaded = gemma.load_served(folder)
    assert isinstance(loaded.lm_head, Int8Linear) and loaded.model.embed_tokens._tied[0] is loaded.lm_head
    ids = torch.randint(0, reference.config.vocab_size, (1, 20), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, reference(ids).logits)
    # the packed folder is about a quarter of the float weights (int8 rows, one bf16 scale per row)
    float_bytes = sum(p.numel() * 4 for p in tiny_gemma3(3).parameters())
    assert (tmp_path / "served" / "served.safetensors").stat().st_size < 0.5 * float_bytes


def test_the_gemma_alias_serves_the_converted_folder(tmp_path, monkeypatch):
    from specgen.modalities.text.generator import TextGenerator

    monkeypatch.setenv("SPECGEN_HOME", str(tmp_path / "home"))
    save_tiny_gemma_served(gemma.served_dir(), seed=4)  # as if converted earlier: no extra needed now
    generator = TextGenerator("gemma")
    assert generator.model_path == str(gemma.served_dir())
    plain = generator.generate("abc abc abc", method="ar", max_new_tokens=24)
    spec = generator.generate("abc abc abc", method="ngram", max_new_tokens=24)
    assert spec.tokens == plain.tokens and len(plain.tokens) > 0


# A first use in each of two processes at once: the conversion (here a tiny model saved slowly, standing in for the
# real one, about a minute) runs in one; the other waits for it and serves its folder.
FIRST_USE = """
import sys, time
sys.path.insert(0, {tests!r})
from specgen.modalities.text import gemma
from tiny_models import save_tiny_gemma_served
gemma.extra_installed = lambda: True
def convert(destination, log=None):
    print("converting", flush=True)
    time.sleep(3)
    save_tiny_gemma_served(destination, seed=5)
gemma.convert = convert
print(gemma.resolve(), gemma.load_served(gemma.served_dir()).config.vocab_size)
"""


def test_two_first_uses_at_once_convert_once(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    env = {**os.environ, "SPECGEN_HOME": str(tmp_path / "home")}
    code = FIRST_USE.format(tests=str(Path(__file__).resolve().parents[1]))
    runs = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True) for _ in range(2)]
    outs = [run.communicate(timeout=300) for run in runs]
    assert all(run.returncode == 0 for run in runs), [err[-2000:] for _, err in outs]
    assert sum(out.count("converting") for out, _ in outs) == 1
    assert sum("waiting for it" in err for _, err in outs) == 1
    assert len({out.splitlines()[-1] for out, _ in outs}) == 1  # the same folder, loaded by both


def test_a_conversion_parses_each_gguf_once(tmp_path, monkeypatch):
    """transformers builds a `GGUFReader` for the tokenizer, the config and the weights; a parse of Gemma's vocabulary
    takes 20-25 s, so while converting every caller gets the one reader of the file."""
    gguf = pytest.importorskip("gguf")
    path = tmp_path / "tiny.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_array("tokenizer.ggml.tokens", ["<s>", "a", "b"])
    writer.add_tensor("w", torch.arange(6, dtype=torch.float32).reshape(2, 3).numpy())
    for write in (writer.write_header_to_file, writer.write_kv_data_to_file, writer.write_tensors_to_file):
        write()
    writer.close()
    parses = []

    class Counting(gguf.GGUFReader):
        def __init__(self, *args, **kwargs):
            parses.append(args[0])
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(gguf, "GGUFReader", Counting)
    with gemma._one_reader_per_file():
        first, again = gguf.GGUFReader(path), gguf.GGUFReader(str(tmp_path / "." / "tiny.gguf"))
        assert first is again and len(parses) == 1
        assert [bytes(first.fields["tokenizer.ggml.tokens"].parts[i]).decode()
                for i in first.fields["tokenizer.ggml.tokens"].data] == ["<s>", "a", "b"]
        assert first.tensors[0].data.tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
    assert gguf.GGUFReader is Counting  # restored: later readers parse afresh
    assert gguf.GGUFReader(path) is not first and len(parses) == 2


def test_gemma_without_the_extra_is_one_clear_error(tmp_path, monkeypatch, capsys):
    from specgen.app.cli import main
    from specgen.modalities.text.generator import TextGenerator, default_models

    monkeypatch.setenv("SPECGEN_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(gemma, "extra_installed", lambda: False)
    with pytest.raises(MissingExtra, match=r"specgen\[gemma\]"):
        TextGenerator("gemma")
    assert main(["generate", "text", "--prompt", "hi", "--model", "gemma"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and "pip install 'specgen[gemma]'" in err[0]
    assert default_models()[0].endswith("target")  # the shipped code model is the default without the extra
    monkeypatch.setattr(gemma, "extra_installed", lambda: True)
    assert default_models()[0] == "gemma"


def test_gemma_derived_drafts_load_only_with_the_extra(tmp_path, monkeypatch, capsys):
    """Anything under assets/gemma/ needs the gemma extra (the Gemma Terms apply); with the extra the shipped
    draft is the default draft of the default target."""
    from specgen.app.cli import main
    from specgen.modalities.text.generator import TextGenerator, default_models

    monkeypatch.setenv("SPECGEN_ASSETS", str(tmp_path / "assets"))
    draft = tmp_path / "assets" / "gemma" / "draft"
    save_tiny_gemma_served(tmp_path / "served", seed=6)
    tiny_draft = save_tiny(draft, 1, layers=1, hidden=16)
    capsys.readouterr()  # the savers' progress bars
    monkeypatch.setattr(gemma, "extra_installed", lambda: False)
    with pytest.raises(MissingExtra, match=r"derived from Gemma 3 270M.*specgen\[gemma\]"):
        TextGenerator(str(tmp_path / "served"), tiny_draft).draft_model
    assert main(["generate", "text", "--prompt", "hi", "--model", str(tmp_path / "served"), "--draft", tiny_draft,
                 "--method", "draft"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and "gemma extra" in err[0]
    gemma.require_extra_for(tmp_path / "elsewhere")  # other folders need nothing
    monkeypatch.setattr(gemma, "extra_installed", lambda: True)
    assert default_models() == (gemma.ALIAS, str(draft))


@pytest.mark.skipif(os.environ.get("SPECGEN_GEMMA_TESTS") != "1" or not gemma.extra_installed(),
                    reason="converts the real Gemma 3 270M (gemma extra, about a minute): set SPECGEN_GEMMA_TESTS=1")
def test_real_gemma_converts_and_windows_are_bitwise_plain_decoding():
    model = gemma.load_served(gemma.resolve())
    assert window_mismatches(model, windows=(2, 4, 8)) == 0


@pytest.mark.skipif(os.environ.get("SPECGEN_GEMMA_TESTS") != "1" or not gemma.extra_installed()
                    or gemma.shipped_draft() is None,
                    reason="the real Gemma 3 270M with its shipped draft (gemma extra): set SPECGEN_GEMMA_TESTS=1")
def test_real_gemma_with_its_shipped_draft_decodes_exactly():
    """The shipped reduced-vocabulary draft on the real served Gemma: greedy speculative output equals plain
    decoding, drafts are accepted, and Hugging Face's assisted generation through its full-vocabulary view
    gives the same tokens."""
    from specgen.app.bench.prompts import Prompt
    from specgen.app.bench.text_runner import Runner, Variant
    from specgen.modalities.text.generator import TextGenerator

    generator = TextGenerator()
    assert generator.draft_path == str(gemma.shipped_draft())
    runner = Runner(generator)
    hf = Variant("hf-assisted[k=4]", "hf-assisted", "k=4",
                 {"num_assistant_tokens": 4, "num_assistant_tokens_schedule": "constant"})
    for prompt in ("def fibonacci(n):\n", "The quick brown fox"):
        plain = generator.generate(prompt, method="ar", max_new_tokens=40)
        spec = generator.generate(prompt, method="draft", max_new_tokens=40)
        assert spec.tokens == plain.tokens and spec.stats["accepted"] > 0
        peer = runner.run(hf, Prompt("p", "-", prompt), generator.encode(prompt), 40)
        assert peer.tokens == plain.tokens


def test_the_demo_header_says_why_this_text_model(monkeypatch):
    from specgen.app.ui.header import header_markdown
    from specgen.app.ui.text import TextModels

    monkeypatch.setattr(gemma, "extra_installed", lambda: False)
    assert "needs the gemma extra" in header_markdown(TextModels())
    assert "gemma extra" not in header_markdown(TextModels(model="some/path"))  # chosen by the user: no note
    monkeypatch.setattr(gemma, "extra_installed", lambda: True)
    header = header_markdown(TextModels())
    assert "`gemma`" in header and "Gemma Terms of Use" in header


def test_distilling_a_draft_for_the_gemma_target(tmp_path, monkeypatch):
    """`specgen train draft` resolves the alias to the served folder; without a shipped draft it asks for --init."""
    from dataclasses import replace

    from specgen.errors import InvalidRequest
    from specgen.modalities.text import generator as generator_module
    from specgen.modalities.text.training.distill.distiller import DistillConfig, train_draft

    monkeypatch.setenv("SPECGEN_HOME", str(tmp_path / "home"))
    save_tiny_gemma_served(gemma.served_dir(), seed=5)
    monkeypatch.setattr(generator_module, "default_models", lambda: (gemma.ALIAS, None))  # the extra, no draft yet
    cfg = DistillConfig(out=str(tmp_path / "run"), steps=2, batch_size=2, prompt_len=8, new_tokens=8, windows=8,
                        top_k=4, max_files=2, eval_windows=4, warmup=1)
    with pytest.raises(InvalidRequest, match="--init scratch"):
        train_draft(cfg, say=lambda text: None)
    summary = train_draft(replace(cfg, init="scratch", vocab_size=12), say=lambda text: None)
    assert summary["steps"] == 2 and 0 <= summary["heldout"]["alpha"] <= 1
    assert len(json.loads((tmp_path / "run" / "export" / "vocab_ids.json").read_text())) == 12


def test_the_demo_header_shows_the_first_time_conversion(monkeypatch):
    from specgen.app.ui.header import conversion_progress, header_markdown
    from specgen.app.ui.text import TextModels

    monkeypatch.setattr(gemma, "extra_installed", lambda: True)
    models = TextModels()
    models._converting("[2/4] reading the tokenizer (262,144 tokens; ~30 s)")
    header = header_markdown(models)
    assert "loading — first-time conversion `█░░░` step 2 of 4: reading the tokenizer" in header
    assert conversion_progress("Converting Gemma 3 270M once into /x").startswith("first-time conversion")
    models.error = "broken"
    assert "not loaded: broken" in header_markdown(models)


@pytest.mark.skipif(os.environ.get("SPECGEN_GEMMA_TESTS") != "1" or not gemma.extra_installed()
                    or gemma.shipped_draft() is None,
                    reason="the real Gemma 3 270M with its shipped draft (gemma extra): set SPECGEN_GEMMA_TESTS=1")
def test_real_gemma_serves_prompts_as_generated_one_by_one():
    """Continuous batching on the real served Gemma with its reduced-vocabulary draft and with prompt lookup:
    every prompt's tokens equal `generate`'s."""
    from specgen.modalities.text.generator import TextGenerator

    generator = TextGenerator()
    prompts = ["def fibonacci(n):\n", "The quick brown fox", "import os\nimport sys\n", "Q: What is 2 + 2?\nA:",
               "Once upon a time"]
    for method in ("draft", "ngram"):
        served = dict(generator.serve(prompts, rows=3, method=method, max_new_tokens=24))
        for index, prompt in enumerate(prompts):
            assert served[index].tokens == generator.generate(prompt, method=method, max_new_tokens=24).tokens
