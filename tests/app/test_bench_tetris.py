"""The TETRIS batch benchmark on a tiny random pair: every run verifies within the budget, greedy runs equal plain
decoding row for row, and the report is written."""

import pytest
from tiny_models import save_tiny

from specgen.app.bench.tetris import render_markdown, run_bench_tetris
from specgen.errors import InvalidRequest
from specgen.modalities.text.generator import TextGenerator


@pytest.fixture(scope="module")
def generator(tmp_path_factory):
    root = tmp_path_factory.mktemp("pair")
    return TextGenerator(save_tiny(root / "target", 0), save_tiny(root / "draft", 1, layers=1, hidden=16))


def test_tetris_and_fixed_spend_the_same_budget_and_stay_exact(generator, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "category": "x", "prompt": "abc abc (x"}\n'
                       '{"id": "b", "category": "x", "prompt": "ab ab ab ab"}\n')
    result = run_bench_tetris(generator, prompts_path=prompts, batch_size=4, capacity=8, max_draft=4,
                              max_new_tokens=12, repeats=1)
    table = result["table"]
    assert list(table) == ["ar", "fixed (γ = 2)", "tetris (≤ 4)"]
    for row in table.values():
        assert row["identical_to_ar"] is True and row["tokens_per_s"] > 0
        assert row["drafted"] <= 8 * row["steps"]  # never more than the budget per step
    assert table["ar"]["drafted"] == 0 and result["tetris_over_fixed"] > 0
    text = render_markdown(result)
    assert "TETRIS / fixed throughput" in text and "| ar |" in text


def test_prompt_lookup_with_history_estimates_and_a_measured_slot_cost(generator, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "category": "x", "prompt": "abc abc abc abc abc"}\n'
                       '{"id": "b", "category": "x", "prompt": "xy zw xy zw xy"}\n')
    result = run_bench_tetris(generator, prompts_path=prompts, batch_size=4, capacity=8, max_draft=6,
                              repeats=1, steps=6, drafter="ngram")
    env, table = result["env"], result["table"]
    assert env["drafter"] == "ngram" and env["estimate"] == "history" and env["slot_cost"] >= 0
    for row in table.values():
        assert row["identical_to_ar"] is True and row["drafted"] <= 8 * row["steps"]
    assert "tetris (≤ 6)" in table


def test_a_served_queue_keeps_every_request_and_stays_exact(generator, tmp_path):
    """Continuous batching (--requests): 7 requests through 3 rows, each to its full length, every run equal to
    plain decoding request for request."""
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "category": "x", "prompt": "abc abc abc"}\n'
                       '{"id": "b", "category": "x", "prompt": "xy zw"}\n'
                       '{"id": "c", "category": "x", "prompt": "hello hello"}\n')
    result = run_bench_tetris(generator, prompts_path=prompts, batch_size=3, capacity=6, max_draft=4,
                              max_new_tokens=10, repeats=1, drafter="ngram", requests=7)
    assert result["env"]["requests"] == 7
    for row in result["table"].values():
        assert row["identical_to_ar"] is True and row["drafted"] <= 6 * row["steps"]
    assert "served by continuous batching in 3 rows" in render_markdown(result)
    with pytest.raises(InvalidRequest, match="--requests"):
        run_bench_tetris(generator, prompts_path=prompts, batch_size=3, capacity=6, requests=2)


def test_bad_budgets_are_clear_errors(generator):
    with pytest.raises(InvalidRequest, match="multiple of the batch size"):
        run_bench_tetris(generator, batch_size=4, capacity=6)
    with pytest.raises(InvalidRequest, match="capacity >= batch_size"):
        run_bench_tetris(generator, batch_size=4, capacity=2)
    with pytest.raises(InvalidRequest, match="unknown drafter"):
        run_bench_tetris(generator, batch_size=4, capacity=8, drafter="oracle")
