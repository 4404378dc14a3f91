"""TextGenerator, prompt lookup and `specgen generate text` on a tiny random model saved to a temp folder
(tests never use the shipped checkpoints)."""

import json

import pytest
import torch

from tiny_models import save_tiny
from specgen.app.cli import main
from specgen.errors import InvalidRequest, ModelNotFound, VocabularyMismatch
from specgen.modalities.text.generator import TextGenerator
from specgen.modalities.text.ngram import PromptLookupDrafter, lookup
from specgen.samplers.types import DecodeContext




@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return save_tiny(root / "target", 0), save_tiny(root / "draft", 1, layers=1, hidden=16)


def test_lookup_takes_the_latest_longest_match():
    assert lookup([1, 2, 3, 9, 1, 2, 3, 7, 1, 2, 3], 3, 2) == [7, 1]
    assert lookup([5, 6, 7, 6], 3, 3) == [7, 6]  # falls back to a 1-gram
    assert lookup([1, 2, 3], 3, 4) == []


def test_prompt_lookup_drafter_is_ragged():
    ctx = DecodeContext([torch.tensor([1, 2, 1]), torch.tensor([4, 5, 6])], torch.arange(2), torch.arange(2))
    draft = PromptLookupDrafter(2).propose(ctx, 3)
    assert draft.draft_probs is None and draft.drafted().tolist() == [2, 0]
    assert draft.tokens[0, :2].tolist() == [2, 1]


@pytest.mark.parametrize("method", ["draft", "ngram"])
def test_greedy_methods_equal_plain_decoding(pair, method):
    generator = TextGenerator(*pair)
    plain = generator.generate("abc abc abc (x", method="ar", max_new_tokens=40)
    spec = generator.generate("abc abc abc (x", method=method, max_new_tokens=40)
    assert spec.tokens == plain.tokens and spec.text == plain.text
    assert spec.stats["lossless"] and spec.stats["steps"] <= plain.stats["steps"]
    for key in ("tau", "alpha_hat", "per_position_acceptance", "predicted_speedup_ideal",
                "predicted_speedup_measured", "tokens_per_s", "acceptance_rate"):
        assert key in spec.stats


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
    assert len(result["tokens"]) == 16 and result["stats"]["method"] == "draft"
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
