"""TextGenerator, prompt lookup and `specgen generate text` on a tiny random model saved to a temp folder
(tests never use the shipped checkpoints)."""

import json

import pytest
import torch

from tiny_models import save_tiny
from specgen.app.cli import main
from specgen.errors import InvalidRequest, ModelNotFound, VocabularyMismatch
from specgen.modalities.text.generator import TextGenerator
from specgen.modalities.text.ngram import LookupSlots, NgramIndex, PromptLookupDrafter, lookup
from specgen.samplers.types import DecodeContext




@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return save_tiny(root / "target", 0), save_tiny(root / "draft", 1, layers=1, hidden=16)


def test_lookup_drafts_the_most_frequent_follower_of_the_longest_match():
    assert lookup([1, 2, 3, 9, 1, 2, 3, 7, 1, 2, 3], 3, 2) == [7, 1]  # a tie: the latest occurrence
    assert lookup([1, 2, 5, 1, 2, 5, 1, 2, 6, 1, 2], 2, 1) == [5]  # (1, 2) was followed by 5 twice, 6 once
    assert lookup([4, 1, 2, 5, 3, 2, 6, 1, 2], 2, 1) == [5]  # the 2-gram (1, 2) outranks the 1-gram (2)
    assert lookup([5, 6, 7, 6], 3, 3, 1) == [7, 6, 7]  # the first slot falls back to a 1-gram
    assert lookup([5, 6, 7, 6], 3, 3, 2) == [7, 6, 7]  # (6, 7) matches, then (6, 7, 6) with the drafts
    assert lookup([5, 6, 7, 6], 3, 3, 3) == [7]  # later slots need a 3-gram: (7, 6, 7) never occurred
    assert lookup([1, 2, 3], 3, 4) == []


def test_ngram_index_rolls_back_to_the_list_it_is_asked_about():
    """One index asked about lists that grow, shrink (rejected drafts) and change gives what a fresh one does."""
    rng = torch.Generator().manual_seed(0)
    index, tokens = NgramIndex(3), []
    for _ in range(400):
        cut = int(torch.randint(0, len(tokens) + 1, (1,), generator=rng))
        grow = torch.randint(0, 4, (int(torch.randint(0, 6, (1,), generator=rng)),), generator=rng).tolist()
        tokens = tokens[:cut] + grow if len(tokens) < 60 else grow
        for min_ngram in (1, 2):
            assert index.follower(tokens, min_ngram) == NgramIndex(3).follower(tokens, min_ngram)
        assert index.tokens == tokens


def test_prompt_lookup_drafter_is_ragged():
    ctx = DecodeContext([torch.tensor([1, 2, 1]), torch.tensor([4, 5, 6])], torch.arange(2), torch.arange(2))
    draft = PromptLookupDrafter(2).propose(ctx, 3)
    assert draft.draft_probs is None and draft.drafted().tolist() == [3, 0]
    assert draft.tokens[0].tolist() == [2, 1, 2]  # each slot looks up again with the drafted tokens appended


def test_lookup_agreement_is_the_proposal_compared_up_to_its_first_mismatch():
    """`agreement` (what auto's shadowed lookup records) equals proposing the whole draft and comparing it with the
    tokens that followed, on random repetitive contexts and continuations, with one index kept across the calls."""
    rng = torch.Generator().manual_seed(0)
    lazy, eager = PromptLookupDrafter(4, 2), PromptLookupDrafter(4, 2)
    seen = set()
    for _ in range(300):
        rows = [torch.randint(0, 3, (int(torch.randint(2, 30, (1,), generator=rng)),), generator=rng) for _ in range(2)]
        truths = [torch.randint(0, 3, (int(torch.randint(1, 8, (1,), generator=rng)),), generator=rng).tolist()
                  for _ in rows]
        ctx = DecodeContext(rows, torch.arange(2), torch.arange(2))
        budget = int(torch.randint(1, 10, (1,), generator=rng))
        draft = eager.propose(ctx, budget)
        agreed = lazy.agreement(ctx, truths, budget)
        for (tested, matched), guess, count, truth in zip(agreed, draft.tokens, draft.drafted(), truths):
            drafted = guess[:int(count)].tolist()[:len(truth)]
            drafted = drafted[:next((i + 1 for i, (a, b) in enumerate(zip(drafted, truth)) if a != b), len(drafted))]
            assert tested == len(drafted) and matched == sum(a == b for a, b in zip(drafted, truth))
            seen.add((tested > matched, tested > 0))
    assert seen == {(False, False), (False, True), (True, True)}  # no match, all matched, a mismatch


def test_lookup_slots_need_a_repeated_ngram_of_the_minimum_length():
    slots = LookupSlots(3, 2)
    assert slots.next_token([1, 2, 3, 9, 1, 2]) == 3  # the 2-gram (1, 2) occurred before
    assert slots.next_token([5, 6, 7, 6]) is None  # only a 1-gram repeats
    assert LookupSlots(3, 1).next_token([5, 6, 7, 6]) == 7
    with pytest.raises(InvalidRequest, match="min_matching_ngram_size"):
        LookupSlots(2, 3)


def _one_hot(token: int, size: int) -> torch.Tensor:
    law = torch.zeros(size, dtype=torch.float64)
    law[token] = 1
    return law


def test_lookup_filled_slots_keep_chain_rejection_exact():
    """draft-lookup's law, enumerated on a toy model: a point mass on the looked-up token where the context ends
    in a repeated n-gram, the draft's law elsewhere. The output distribution equals the target's; reporting the
    draft's own law at the looked-up slots (the tokens copied, the law not updated) does not."""
    from specgen.samplers.acceptance import ChainRejection
    from specgen.samplers.oracle import chain_proposals, exact_output, max_abs_diff, target_joint
    from specgen.samplers.processing import Processing
    from specgen.samplers.toy import TableLM

    vocab, prompt, horizon, plain = 3, (1, 2, 1), 3, Processing(temperature=1.0)
    target = TableLM(vocab, order=2, seed=31)
    draft = target.mixed_with(TableLM(vocab, order=2, seed=32), 0.6)
    slots = LookupSlots(2, 1)
    model_law = lambda context: plain(draft.logits(context))  # noqa: E731
    looked_up = lambda context: (model_law(context) if slots.next_token(list(context)) is None  # noqa: E731
                                 else _one_hot(slots.next_token(list(context)), vocab))
    assert slots.next_token(list(prompt)) is not None and slots.next_token([0, 1, 2]) is None  # both kinds occur
    expected = target_joint(target, plain, prompt, horizon)
    for k in (1, 3):
        out = exact_output(target, plain, ChainRejection(), lambda prefix: chain_proposals(looked_up, prefix, k),
                           prompt, horizon)
        assert max_abs_diff(out, expected) < 1e-9
    wrong = exact_output(target, plain, ChainRejection(),
                         lambda prefix: chain_proposals(looked_up, prefix, 2, reported_law=model_law), prompt, horizon)
    assert max_abs_diff(wrong, expected) > 1e-3


@pytest.mark.parametrize("method", ["draft", "ngram", "draft-lookup"])
def test_greedy_methods_equal_plain_decoding(pair, method):
    generator = TextGenerator(*pair)
    plain = generator.generate("abc abc abc (x", method="ar", max_new_tokens=40)
    spec = generator.generate("abc abc abc (x", method=method, max_new_tokens=40)
    assert spec.tokens == plain.tokens and spec.text == plain.text
    assert spec.stats["lossless"] and spec.stats["steps"] <= plain.stats["steps"]
    for key in ("tau", "alpha_hat", "per_position_acceptance", "predicted_speedup_ideal",
                "predicted_speedup_measured", "tokens_per_s", "acceptance_rate"):
        assert key in spec.stats


@pytest.mark.parametrize("method", ["ar", "draft", "ngram", "dyspec"])
def test_served_prompts_equal_their_greedy_generate(pair, method):
    """TextGenerator.serve: 7 prompts through 3 rows by continuous batching, each result (in completion order)
    equal to `generate`'s; the per-request stats add up to the run."""
    generator = TextGenerator(*pair)
    prompts = ["abc abc abc (x", "ab", "hello hello", "x", "(a(b(c", "mississippi", "to be or not"]
    served = list(generator.serve(prompts, rows=3, method=method, max_new_tokens=16))
    assert sorted(index for index, _ in served) == list(range(len(prompts)))
    for index, result in served:
        alone = generator.generate(prompts[index], method=method, max_new_tokens=16)
        assert result.tokens == alone.tokens and result.text == alone.text
        stats = result.stats
        assert stats["committed"] == len(result.tokens) and stats["served_rows"] == 3
        assert stats["tau"] == pytest.approx(len(result.tokens) / stats["steps"])
        assert 0 < stats["wall_s"] and 0 < stats["latency_s"]
    if method != "ar":
        assert sum(r.stats["drafted"] for _, r in served) > 0
    with pytest.raises(InvalidRequest, match="rows must be"):
        list(generator.serve(prompts, rows=0))
    with pytest.raises(InvalidRequest, match="empty"):
        list(generator.serve(["ab", ""], method=method))


def test_sampled_samples_are_reproducible_and_independent(pair):
    generator = TextGenerator(*pair)
    first = generator.generate("ab", method="draft", temperature=1.0, seed=3, num_samples=3, max_new_tokens=12)
    again = generator.generate("ab", method="draft", temperature=1.0, seed=3, num_samples=3, max_new_tokens=12)
    assert [s["tokens"] for s in first.samples] == [s["tokens"] for s in again.samples]
    assert len({tuple(s["tokens"]) for s in first.samples}) > 1


def test_bad_requests(pair, tmp_path):
    generator = TextGenerator(*pair)
    with pytest.raises(InvalidRequest):
        generator.generate("", method="ar")
    with pytest.raises(InvalidRequest):
        generator.generate("ab", method="ar", max_new_tokens=0)
    with pytest.raises(InvalidRequest):
        generator.generate("ab", method="ar", max_new_tokens=1000)  # beyond the 96-token context
    with pytest.raises(InvalidRequest):
        generator.generate("ab", method="ar", temperature=-1)
    with pytest.raises(InvalidRequest):
        generator.generate("ab", method="nope")
    with pytest.raises(ModelNotFound):
        TextGenerator(str(tmp_path / "missing"))
    other = save_tiny(tmp_path / "other", 2, vocab_chars="xyz")
    with pytest.raises(VocabularyMismatch, match="5 tokens.*36 tokens"):
        TextGenerator(pair[0], other).generate("ab", method="draft", max_new_tokens=4)


def test_cli_generate_text_json_and_trace(pair, tmp_path, capsys):
    trace = tmp_path / "trace.jsonl"
    code = main(["generate", "text", "--prompt", "abc abc", "--model", pair[0], "--draft", pair[1],
                 "--max-new-tokens", "16", "--json", "--trace", str(trace)])
    out = capsys.readouterr().out
    assert code == 0
    result = json.loads(out)  # stdout holds only the JSON object
    assert len(result["tokens"]) == 16 and result["stats"]["method"] == "auto"  # the default
    events = [json.loads(line) for line in trace.read_text().splitlines()]
    assert sum(len(e["tokens"]) for e in events) == 16
    assert {s for e in events for s in e["sources"]} <= {"accepted", "recovered", "bonus"}
    code = main(["generate", "text", "--prompt", "ab", "--model", pair[0], "--num-samples", "2",
                 "--temperature", "1", "--max-new-tokens", "5", "--json", "--method", "ar"])
    result = json.loads(capsys.readouterr().out)
    assert code == 0 and len(result["samples"]) == 2


def test_cli_generate_text_errors(pair, tmp_path, capsys):
    assert main(["generate", "text", "--prompt", "ab", "--model", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:")
    assert main(["generate", "text", "--prompt", "ab", "--model", pair[0], "--method", "draft",
                 "--max-new-tokens", "8"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: method 'draft' needs a draft model (--draft PATH)"]
    assert main(["generate", "text", "--prompt", "ab", "--model", pair[0], "--max-new-tokens", "500"]) == 2
    assert "context 96" in capsys.readouterr().err


def test_a_prompt_longer_than_the_context_says_so(pair, capsys):
    assert main(["generate", "text", "--prompt", "ab" * 60, "--model", pair[0], "--method", "ar"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: the prompt is 120 tokens, longer than the model's context of 96 tokens by 25 "
                   "(one new token needs room too)"]


def test_the_prompt_gets_the_tokenizers_own_special_tokens(pair, tmp_path):
    # as transformers' generate: no BOS from a tokenizer that adds none, the BOS from one whose post-processor adds it
    from tokenizers import processors
    from transformers import PreTrainedTokenizerFast

    plain = TextGenerator(pair[0])
    assert plain.encode("ab").tolist() == plain.tokenizer("ab")["input_ids"] == [2, 3]
    with_bos = tmp_path / "with-bos"
    save_tiny(with_bos, 0)
    tok = PreTrainedTokenizerFast.from_pretrained(with_bos)
    tok.backend_tokenizer.post_processor = processors.TemplateProcessing(single="<bos> $A",
                                                                         special_tokens=[("<bos>", 0)])
    tok.save_pretrained(with_bos)
    assert TextGenerator(str(with_bos)).encode("ab").tolist() == [0, 2, 3]


def test_the_shipped_code_tokenizer_adds_the_bos_its_models_were_trained_after():
    from specgen.modalities.text.generator import load_tokenizer, shipped_code_pair

    tokenizer = load_tokenizer(shipped_code_pair()[0])
    assert tokenizer("def f(x):")["input_ids"][0] == tokenizer.bos_token_id
    assert tokenizer("def f(x):", add_special_tokens=False)["input_ids"][0] != tokenizer.bos_token_id


def test_generate_without_a_method_takes_the_models_default(pair):
    generator = TextGenerator(*pair)
    assert generator.default_method == "auto"  # with a draft model or without, auto chooses per request
    assert generator.generate("ab", max_new_tokens=4).stats["method"] == "auto"
    alone = TextGenerator(pair[0]).generate("ab", max_new_tokens=4).stats
    assert alone["method"] == "auto" and "draft" not in alone["auto"]["initial"]["predicted"]


def test_cli_compare_reports_plain_decoding_beside_the_method(pair, capsys):
    code = main(["generate", "text", "--prompt", "abc abc", "--model", pair[0], "--draft", pair[1],
                 "--max-new-tokens", "12", "--compare", "--json"])
    stats = json.loads(capsys.readouterr().out)["stats"]
    assert code == 0 and stats["identical_to_ar"] is True and stats["speedup_vs_ar"] > 0
    assert stats["ar_wall_s"] > 0 and stats["load_s"] > 0 and stats["wall_s"] > 0
    code = main(["generate", "text", "--prompt", "abc abc", "--model", pair[0], "--draft", pair[1],
                 "--max-new-tokens", "12", "--compare"])
    err = capsys.readouterr().err
    assert code == 0
    footer = next(line for line in err.splitlines() if line.startswith("[auto] "))
    assert "12 tokens in" in footer and "tokens/s decoding" in footer and "models loaded in" in footer
    assert "[ar] plain decoding of the same request" in err and "identical output" in err


def test_cli_without_a_prompt_uses_the_models_example(pair, capsys):
    assert main(["generate", "text", "--model", pair[0], "--method", "ar", "--max-new-tokens", "4", "--json"]) == 0
    captured = capsys.readouterr()
    assert len(json.loads(captured.out)["tokens"]) == 4
    assert "prompt (the model's example" in captured.err and "def fibonacci" in captured.err


def test_the_code_pair_serving_by_default_says_so_once(monkeypatch, caplog):
    from specgen.modalities.text import gemma, generator

    monkeypatch.setattr(gemma, "extra_installed", lambda: False)
    monkeypatch.setattr(generator, "_fallback_said", False)
    with caplog.at_level("WARNING", logger="specgen"):
        TextGenerator()
        TextGenerator()
    notes = [r.getMessage() for r in caplog.records if "Gemma 3 270M is not installed" in r.getMessage()]
    assert len(notes) == 1 and "pip install" in notes[0]


def test_every_text_method_knob_is_a_cli_flag(pair, capsys):
    from specgen.app.cli import TEXT_REQUEST_OPTIONS, build_parser
    from specgen.samplers import registry

    knobs = {k.name for m in registry.method_names("text") for k in registry.get_method("text", m).knobs}
    for knob in knobs - TEXT_REQUEST_OPTIONS:  # each parses as its own flag into the knob it names
        args = build_parser().parse_args(["generate", "text", "--" + knob.replace("_", "-"), "3"])
        assert getattr(args, "knob_" + knob) == "3"
    assert main(["generate", "text", "--prompt", "abc abc", "--model", pair[0], "--draft", pair[1], "--method", "draft",
                 "--num-draft-tokens", "2", "--max-new-tokens", "12", "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)["stats"]
    assert stats["drafted"] <= 2 * stats["steps"] and stats["committed"] == 12


@pytest.mark.parametrize("argv, message", [
    (["--method", "ngram", "--tree-budget", "8"],
     "error: --tree-budget applies to sequoia, dyspec, eagle2, stand, rest, dresd, consensus, not 'ngram'"),
    (["--method", "draft", "--num-draft-tokens", "0"], "error: num_draft_tokens must be >= 1, got 0"),
    (["--method", "draft", "--length-schedule", "often"], "error: length_schedule must be one of fixed, heuristic, svip, kangaroo, cost, got 'often'"),
])
def test_a_knob_the_method_lacks_or_a_bad_value_is_one_error_line(pair, argv, message, capsys):
    code = main(["generate", "text", "--prompt", "ab", "--model", pair[0], "--draft", pair[1], "--max-new-tokens", "4",
                 *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith(message)


def test_the_example_prompt_suits_the_model(pair, tmp_path):
    from tiny_models import save_tiny_gemma_served
    from specgen.modalities.text.generator import EXAMPLE_PROMPTS, example_prompt

    assert example_prompt(save_tiny_gemma_served(tmp_path / "gemma")) == EXAMPLE_PROMPTS["gemma"]  # prose
    assert example_prompt(pair[0]) == TextGenerator(pair[0]).example_prompt == EXAMPLE_PROMPTS["code"]
