"""`specgen bench text` end to end on tiny random models saved to a temp folder (never the shipped
checkpoints), plus its statistics and exactness helpers."""

import contextlib
import io
import json

import pytest
import torch

from tiny_models import save_tiny
from specgen.app.bench import text as bench_text
from specgen.app.bench.prompts import Prompt
from specgen.app.bench.runner import rotated
from specgen.app.bench.stats import bootstrap_median_ci
from specgen.app.bench.text_report import summarise
from specgen.app.bench.text_runner import PEERS, TIE_MARGIN, Outcome, Variant, first_divergence, plan_variants
from specgen.app.cli import main
from specgen.modalities.text.generator import TextGenerator
from specgen.samplers.registry import method_names
from specgen.samplers.stats import SpecStats

STATS_KEYS = {"method", "lossless", "steps", "drafted", "accepted", "committed", "tau", "acceptance_rate",
              "alpha_hat", "per_position_acceptance", "wall_s", "tokens_per_s", "predicted_speedup_ideal",
              "predicted_speedup_measured", "speedup_vs_ar", "identical_to_ar"}
PROMPTS = [  # repeated context, so prompt lookup gets something to copy
    {"id": "loop", "category": "code", "prompt": "for i in x:\n for i in x:\n for i"},
    {"id": "call", "category": "rag", "prompt": "f(a) g(b) f(a) g(b) f("},
]




@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return save_tiny(root / "target", 0, wide=True), save_tiny(root / "draft", 1, layers=1, hidden=16, wide=True)


@pytest.fixture(scope="module")
def prompts_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("prompts") / "text.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    return path


@pytest.fixture(scope="module")
def bench_run(pair, prompts_file, tmp_path_factory):
    """One full run through the CLI, shared by the structure tests: (exit code, stdout, stderr, out dir)."""
    out_dir = tmp_path_factory.mktemp("bench")
    threads = torch.get_num_threads()
    stdout, stderr = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            code = main(["bench", "text", "--prompts", str(prompts_file), "--model", pair[0], "--draft", pair[1],
                         "--max-new-tokens", "12", "--repeats", "1", "--json", "--out-dir", str(out_dir)])
    finally:
        torch.set_num_threads(threads)
    return code, stdout.getvalue(), stderr.getvalue(), out_dir


def test_bench_prints_only_the_json_object(bench_run):
    code, out, _, _ = bench_run
    assert code == 0
    result = json.loads(out)  # fails on anything besides the one object
    assert set(result) == {"methods", "items", "env"}
    assert out.count("\n") == 1


def test_every_method_carries_the_design_stats(bench_run):
    result = json.loads(bench_run[1])
    methods = result["methods"]
    # every method the tiny target can serve (`kangaroo`, `del`, `eagle`, `poss`, `mtp`, `early-exit`, `ppd` and
    # `falcon` need weights trained for it)
    expected = {*method_names("text"), "hf", "hf-assisted[default]", "hf-assisted[k=5]",
                "hf-prompt-lookup[default]", "hf-prompt-lookup[k=5]"} - {"kangaroo", "del", "eagle", "poss", "mtp",
                                                                          "early-exit", "ppd", "falcon"}
    assert set(methods) == expected
    for name, stats in methods.items():
        assert STATS_KEYS <= set(stats), (name, STATS_KEYS - set(stats))
        assert stats["speedup_vs_ar"] > 0 and len(stats["speedup_vs_ar_ci95"]) == 2
    assert methods["ar"]["speedup_vs_ar"] == 1.0 and methods["ar"]["tau"] == 1.0
    assert methods["draft"]["tau"] >= 1.0 and methods["draft"]["alpha_hat"] is not None
    # exactly one setting of each two-setting peer is marked faster, and ours are compared with it
    for peer, ours in (("hf-assisted", "draft"), ("hf-prompt-lookup", "ngram")):
        faster = [n for n, m in methods.items() if m["method"] == peer and m.get("faster")]
        assert len(faster) == 1
        assert methods[ours]["vs_peer"]["peer"] == faster[0]
        assert methods[ours]["vs_peer"]["speedup"] > 0


def test_items_cover_every_method_and_prompt(bench_run):
    result = json.loads(bench_run[1])
    items = result["items"]
    names = set(result["methods"])
    assert {(i["name"], i["prompt_id"]) for i in items} == {(n, p["id"]) for n in names for p in PROMPTS}
    for item in items:
        assert STATS_KEYS <= set(item)
        assert item["new_tokens"] == 12 and item["wall_s"] > 0 and item["tokens_per_s"] > 0
    # rotated order: over the two rounds, the first method differs
    firsts = {i["prompt_id"]: i["name"] for i in items if i["order"] == 0}
    assert len(set(firsts.values())) == 2


def test_lossless_methods_and_greedy_peers_equal_plain_decoding(bench_run):
    result = json.loads(bench_run[1])
    for item in result["items"]:
        assert item["lossless"]
        assert item["identical_to_ar"], (item["name"], item["prompt_id"], item["first_divergence"],
                                         item["divergence_margin"])
        assert item["first_divergence"] is None
    for stats in result["methods"].values():
        assert stats["identical_to_ar"] and stats["identical_items"] == len(PROMPTS)


def test_env_records_the_setup(bench_run, pair):
    env = json.loads(bench_run[1])["env"]
    assert env["threads"] == 1 and env["max_new_tokens"] == 12 and env["repeats"] == 1
    for key in ("git_commit", "torch", "transformers", "python", "cpu_model", "load_before", "load_after",
                "load_flag"):
        assert key in env
    assert len(env["models"]["target"]["sha256"]) == 64
    assert env["models"]["draft"]["path"].endswith("draft")
    assert env["command"].startswith("specgen bench text --prompts ")


def test_result_files_are_written(bench_run):
    out = json.loads(bench_run[1])
    out_dir = bench_run[3]
    for kind in ("json", "md", "png"):
        assert len(list(out_dir.glob(f"bench-text-*.{kind}"))) == 1
        assert (out_dir / f"text-latest.{kind}").stat().st_size > 0
    assert json.loads((out_dir / "text-latest.json").read_text())["methods"].keys() == out["methods"].keys()
    markdown = (out_dir / "text-latest.md").read_text()
    assert out["env"]["command"] in markdown and "hf-prompt-lookup" in markdown
    # acceptance by drafted position: the pooled stats' row for `ngram` (repeated prompts: long chains), as printed
    table = markdown.split("## Acceptance by drafted position")[1].split("\n## ")[0]
    row = next(line for line in table.splitlines() if line.startswith("| `ngram` |"))
    positions = out["methods"]["ngram"]["per_position_acceptance"]
    assert len(positions) > 1 and row.split(" | ")[1:3] == [f"{v:.2f}" for v in positions[:2]]
    assert "`ar`" not in table and "hf-" not in table
    assert (out_dir / "text-latest.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # auto against the best of our other methods, per category, as printed
    categories = markdown.split("## Speedup by category")[1].split("\n## ")[0]
    share = next(line for line in categories.splitlines() if line.startswith("| `auto` ÷ the best other method |"))
    category = sorted(out["methods"]["auto"]["speedup_by_category"])[0]
    best = max(m["speedup_by_category"][category] for name, m in out["methods"].items()
               if name not in ("ar", "auto") and m["method"] not in PEERS)
    assert share.split(" | ")[1] == f"{out['methods']['auto']['speedup_by_category'][category] / best:.2f}"


# ---- bad input: exit 2, one `error:` line, nothing on stdout ------------------------------------------------------

def _one_error(argv, capsys):
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


def test_missing_prompts_file(tmp_path, capsys):
    line = _one_error(["bench", "text", "--prompts", str(tmp_path / "nope.jsonl"), "--json"], capsys)
    assert "nope.jsonl" in line


@pytest.mark.parametrize("content, words", [
    ('{"id": "a", "prompt": "x"}\n\n{"id": "b", "prompt": \n', ["line 3", "not valid JSON"]),
    ('{"id": "a", "prompt": "x"}\n["b"]\n', ["line 2", "JSON object"]),
    ('{"id": "a"}\n', ["line 1", "'prompt'"]),
    ('{"id": "a", "prompt": "x"}\n{"id": "a", "prompt": "y"}\n', ["line 2", "twice"]),
    ("\n\n", ["no prompts"]),
])
def test_malformed_prompts_name_the_line(content, words, tmp_path, capsys):
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    line = _one_error(["bench", "text", "--prompts", str(path), "--json", "--model", str(tmp_path / "none")], capsys)
    for word in words:
        assert word in line


def test_unknown_method(prompts_file, capsys):
    line = _one_error(["bench", "text", "--prompts", str(prompts_file), "--methods", "ar,turbo"], capsys)
    assert "turbo" in line and "hf-assisted" in line


def test_missing_model_and_bad_out_dir(prompts_file, tmp_path, capsys):
    line = _one_error(["bench", "text", "--prompts", str(prompts_file), "--model", str(tmp_path / "none"),
                       "--out-dir", str(tmp_path / "out")], capsys)
    assert "does not exist" in line
    (tmp_path / "file").write_text("")
    line = _one_error(["bench", "text", "--prompts", str(prompts_file), "--out-dir", str(tmp_path / "file")], capsys)
    assert "not a folder" in line


# ---- helpers ------------------------------------------------------------------------------------------------------

def test_plan_always_runs_ar_and_both_peer_settings():
    names = [v.name for v in plan_variants(["hf-assisted"], 4)]
    assert names == ["ar", "hf-assisted[default]", "hf-assisted[k=4]"]
    k_setting = plan_variants(["hf-assisted"], 4)[-1]
    assert k_setting.config == {"num_assistant_tokens": 4, "num_assistant_tokens_schedule": "constant"}


def test_rotation_puts_every_method_first_once():
    variants = plan_variants(None, 5)
    firsts = [rotated(variants, shift)[0][1].name for shift in range(len(variants))]
    assert sorted(firsts) == sorted(v.name for v in variants)
    assert all(len(rotated(variants, s)) == len(variants) for s in range(3))


def test_bootstrap_is_reproducible_and_brackets_the_median():
    values = [1.0, 1.2, 1.5, 2.0, 0.9, 1.1]
    median, low, high = bootstrap_median_ci(values)
    assert (median, low, high) == bootstrap_median_ci(values)
    assert low <= median <= high and min(values) <= low and high <= max(values)
    assert bootstrap_median_ci([3.0]) == (3.0, 3.0, 3.0)


def test_first_divergence_compares_the_common_length():
    assert first_divergence([1, 2, 3], [1, 2, 3]) == (None, 3)
    assert first_divergence([1, 2], [1, 2, 3]) == (None, 2)
    assert first_divergence([1, 5, 3], [1, 2, 3]) == (1, 3)


def test_a_divergence_reports_its_index_and_the_target_margin(pair):
    generator = TextGenerator(*pair)
    prompt = Prompt("p", "code", "abc abc")
    ids = generator.encode(prompt.prompt)
    plain = generator.generate(prompt.prompt, method="ar", max_new_tokens=6).tokens
    wrong = plain[:3] + [(plain[3] + 1) % generator.model.config.vocab_size] + plain[4:]

    def outcome(tokens):
        stats = SpecStats(steps=len(tokens), row_steps=len(tokens), committed=len(tokens), verify_s=0.01)
        return Outcome(tokens, 0.1, stats)

    variants = [Variant("ar", "ar"), Variant("hf", "hf")]
    pooled = {v.name: SpecStats() for v in variants}
    items = bench_text._round_items(generator, variants, prompt, ids, 0,
                                    {"ar": (0, outcome(plain)), "hf": (1, outcome(wrong))}, pooled)
    ar_item, hf_item = items
    assert ar_item["identical_to_ar"] and ar_item["text"] == generator.tokenizer.decode(plain)
    assert not hf_item["identical_to_ar"] and hf_item["first_divergence"] == 3
    assert hf_item["divergence_margin"] > TIE_MARGIN  # a real flip of the argmax: flagged as a bug
    methods = summarise(items, variants, pooled)
    assert methods["hf"]["identical_to_ar"] is False and methods["hf"]["divergence_above_tie_margin"]


def test_hugging_face_assists_with_a_reduced_vocabulary_draft_through_its_full_vocabulary_view(pair, tmp_path):
    """The view reads target ids and returns the draft's logits on its vocabulary and -inf elsewhere; assisted
    generation with it equals plain greedy decoding."""
    from transformers import AutoModelForCausalLM

    from specgen.modalities.text.training.distill.teacher import shrink_vocab
    from specgen.modalities.text.full_vocab import full_vocab_view

    target = AutoModelForCausalLM.from_pretrained(pair[0]).eval()
    full = AutoModelForCausalLM.from_pretrained(pair[1]).eval()
    vocab_ids = torch.arange(0, full.config.vocab_size, 2)  # every other token
    small = shrink_vocab(AutoModelForCausalLM.from_pretrained(pair[1]).eval(), vocab_ids)
    view = full_vocab_view(small, vocab_ids, target.config.vocab_size)
    ids = vocab_ids[torch.tensor([[1, 5, 3, 8, 2]])]
    with torch.no_grad():
        logits = view(input_ids=ids).logits
        torch.testing.assert_close(logits[..., vocab_ids], full(input_ids=ids).logits[..., vocab_ids])
    outside = torch.ones(target.config.vocab_size, dtype=torch.bool)
    outside[vocab_ids] = False
    assert torch.isneginf(logits[..., outside]).all() and small.config.vocab_size == len(vocab_ids) + 1
    prompt = torch.tensor([[1, 7, 9, 7, 9, 7]])
    plain = target.generate(prompt, max_new_tokens=16, do_sample=False)
    assisted = target.generate(prompt, max_new_tokens=16, do_sample=False, assistant_model=view)
    assert torch.equal(plain, assisted)


def test_by_default_a_run_goes_to_the_user_cache_and_its_latest_copy_to_benchmarks(pair, prompts_file, tmp_path,
                                                                                  monkeypatch, capsys):
    monkeypatch.setenv("SPECGEN_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("SPECGEN_BENCHMARKS", str(tmp_path / "benchmarks"))
    threads = torch.get_num_threads()
    try:
        code = main(["bench", "text", "--prompts", str(prompts_file), "--model", pair[0], "--methods", "ngram",
                     "--max-new-tokens", "6", "--repeats", "1", "--json"])
    finally:
        torch.set_num_threads(threads)
    capsys.readouterr()
    assert code == 0
    runs, latest = tmp_path / "home" / "runs", tmp_path / "benchmarks"
    assert {p.suffix for p in runs.glob("bench-text-*")} == {".json", ".md", ".png"}
    assert sorted(p.name for p in latest.iterdir()) == ["text-latest.json", "text-latest.md", "text-latest.png"]
