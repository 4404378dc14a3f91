"""SpecMemo's memory model and budget (modalities/memory.py): the KV term equals what the position cache holds, the
plan cuts window before rows and refuses what cannot fit, and a budgeted request decodes the same tokens."""

import subprocess
import sys

import pytest
import torch

from specgen.modalities import memory
from specgen.modalities.memory import Footprint, MemoryBudgetError, ModelShape, footprint, plan
from specgen.modalities.runtime.transformers_adapter import TransformersTarget
from specgen.modalities.text.generator import TextGenerator, shipped_code_pair

PROMPTS = ["def main(", "import os\n\n", "class Parser:\n    def __init__(self", "for i in range("]


@pytest.fixture(scope="module")
def generator():
    return TextGenerator(*shipped_code_pair())


def test_kv_term_is_what_the_position_cache_allocates(generator):
    """The model's KV bytes for (rows, window, context) equal the summed storage of a target that scored them."""
    target = TransformersTarget(generator.model, capacity=1024)
    rows, window, context = 3, 5, 90
    target.prefill([torch.arange(context - window) % 50 + 3] * rows)
    tokens = torch.full((rows, window), 7)
    positions = torch.arange(context - window - 1, context - 1).expand(rows, window)
    target.score(tokens, positions, torch.arange(rows))
    held = sum(t.nbytes for t in (*target.cache.keys.values(), *target.cache.values.values()))
    shape = ModelShape.of(generator.model, 1024)
    assert footprint(shape, None, rows, window, context - window).kv_mb == pytest.approx(held / memory.MB)
    # a longer context doubles the slots: the model follows the cache's rounding, not the token count
    assert footprint(shape, None, rows, window, 300).kv_mb == pytest.approx(4 * held / memory.MB)


def _measure(rows: int, window: int) -> Footprint:
    return Footprint(rows, window, 100, kv_mb=4.0 * rows, logits_mb=1.0 * rows * window)


def test_plan_cuts_the_window_first_then_rows_then_the_window_again():
    # unconstrained: 8 rows x window 17 = 32 + 136 + slack
    whole = _measure(8, 17).total_mb
    assert plan(1000 + whole, 1000, 8, 17, _measure).reduced == ()
    cut = plan(1000 + _measure(8, 4).total_mb, 1000, 8, 17, _measure)
    assert (cut.rows, cut.window) == (8, 4) and cut.reduced == ("window 17 -> 4",)
    fewer = plan(1000 + _measure(2, 4).total_mb, 1000, 8, 17, _measure)
    assert (fewer.rows, fewer.window) == (2, 4)
    last = plan(1000 + _measure(1, 2).total_mb, 1000, 8, 17, _measure)
    assert (last.rows, last.window) == (1, 2)
    with pytest.raises(MemoryBudgetError, match="give at least"):
        plan(1000 + _measure(1, 2).total_mb - 0.5, 1000, 8, 17, _measure)
    # a method without a window knob keeps its window; only rows go
    fixed = plan(1000 + _measure(2, 17).total_mb, 1000, 8, 17, _measure, adjustable=False)
    assert (fixed.rows, fixed.window) == (2, 17)


def test_budgeted_requests_keep_their_tokens_and_report_the_plan(generator):
    plain = generator.generate(PROMPTS[0], method="sequoia", max_new_tokens=24)
    tight = generator.generate(PROMPTS[0], method="sequoia", max_new_tokens=24,
                               memory_budget_mb=memory.resident_mb() + memory.SLACK_MB + 4)
    assert tight.tokens == plain.tokens  # exact methods: a smaller window changes speed, not tokens
    assert tight.stats["memory"]["window"] < 17 and tight.stats["memory"]["reduced"]
    assert tight.stats["memory"]["predicted_peak_mb"] <= tight.stats["memory"]["budget_mb"]
    served = dict(generator.serve(PROMPTS, rows=4, method="draft", max_new_tokens=24,
                                  memory_budget_mb=memory.resident_mb() + memory.SLACK_MB + 2))
    alone = [generator.generate(p, method="draft", max_new_tokens=24).tokens for p in PROMPTS]
    assert [served[i].tokens for i in range(len(PROMPTS))] == alone
    assert served[0].stats["memory"]["rows"] < 4
    with pytest.raises(MemoryBudgetError):
        generator.generate(PROMPTS[0], method="draft", max_new_tokens=24, memory_budget_mb=10)


def test_cli_refuses_a_budget_below_the_loaded_models():
    target, draft = shipped_code_pair()
    out = subprocess.run([sys.executable, "-m", "specgen", "generate", "text", "--model", target, "--draft", draft,
                          "--method", "draft", "--prompt", "def f(", "--max-new-tokens", "8", "--memory-budget", "50"],
                         capture_output=True, text=True)
    assert out.returncode == 2
    lines = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "memory budget of 50 MB" in lines[0] and "give at least" in lines[0]


@pytest.mark.parametrize("command", [["generate", "text"], ["serve"], ["batch", "--input", __file__, "--output", "o"]])
def test_every_budget_flag_refuses_a_non_positive_budget(command, capsys):
    from specgen.app.cli import build_parser

    for value in ("0", "-3"):
        with pytest.raises(SystemExit) as stop:
            build_parser().parse_args([*command, "--memory-budget", value])
        assert stop.value.code == 2 and "memory_budget_mb must be a number > 0" in capsys.readouterr().err


def test_batch_runner_gives_text_items_the_budget(generator, tmp_path):
    import json

    from specgen.app.batch import run_batch

    lines = [{"id": i, "modality": "text", "prompt": p, "method": "draft", "params": {"max_new_tokens": 12}}
             for i, p in enumerate(PROMPTS[:2])]
    lines.append({"id": "own", "modality": "text", "prompt": "x = ", "method": "draft",
                  "params": {"max_new_tokens": 12, "memory_budget_mb": 20}})
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps(line) + "\n" for line in lines))
    out = tmp_path / "out.jsonl"
    summary = run_batch(source, out, generator=generator, rows=2, progress=False,
                        memory_budget_mb=memory.resident_mb() + 200)
    records = {r["id"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert summary["ok"] == 2 and summary["error"] == 1
    assert records[0]["stats"]["memory"]["reduced"] == [] and records[0]["stats"]["memory"]["rows"] == 2
    assert "memory budget of 20 MB" in records["own"]["error"]  # an item's own budget wins over the runner's


def test_the_server_cuts_rows_per_lane_to_the_budget(generator):
    from specgen.app.serve.server import ServeOptions, load_scheduler

    target, draft = shipped_code_pair()
    context_row = memory.footprint(ModelShape.of(generator.model), ModelShape.of(generator.draft_model), 1, 9,
                                   generator.context_size).total_mb
    budget = memory.resident_mb() + 2.5 * context_row  # about two full-context rows beside this process's models
    scheduler = load_scheduler(ServeOptions(model=target, draft=draft, method="draft", rows=8,
                                            memory_budget_mb=budget + 60))  # its own models load on top
    try:
        assert 1 <= scheduler.rows < 8
    finally:
        scheduler.close(grace_s=0)
