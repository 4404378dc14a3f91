"""Two-step smoke test of the code-model trainer, the stdlib corpus rules and the shipped tokenizer."""

from __future__ import annotations

import json
import math

import pytest

from specgen.modalities.text.models import ASSETS_CODE, load_tokenizer
from specgen.modalities.text.training.code_models import CodeModelConfig, main, train_text_model
from specgen.modalities.text.training.stdlib_corpus import load_corpus

TINY = dict(batch_size=2, seq_len=16, seed=3, threads=1, log_every=1, max_files=6, val_windows=4)


def test_corpus_is_stdlib_code_without_tests_or_third_party():
    corpus = load_corpus()
    names = corpus.train + corpus.val
    assert names and list(names) != [] and len(set(names)) == len(names)
    assert len(corpus.val) >= 5 and set(corpus.train).isdisjoint(corpus.val)
    for name in names:
        parts = name.split("/")
        assert not {"site-packages", "dist-packages", "test", "tests", "idle_test"} & set(parts[:-1]), name
        assert not parts[-1].startswith(("test_", "_sysconfigdata")), name
    assert "os.py" in names and "json/decoder.py" in names and "encodings/cp1252.py" not in names
    assert load_corpus().sha256 == corpus.sha256  # deterministic


@pytest.mark.parametrize("role", ["draft", "target"])
def test_two_steps_checkpoint_and_resume(role, tmp_path):
    run, export = tmp_path / "run", tmp_path / "export"
    first = train_text_model(CodeModelConfig(role, run, steps=2, export_dir=export, **TINY))
    assert math.isfinite(first["final_train_loss"]) and math.isfinite(first["final_val_loss"])
    assert (run / "checkpoint.pt").exists() and (export / role / "model.safetensors").exists()
    assert (export / "tokenizer.json").exists()
    config = json.loads((export / role / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["dtype"] == "float16"

    with open(run / "metrics.jsonl", "a") as f:  # as if killed after logging step 3 but before its checkpoint
        f.write(json.dumps({"step": 3, "loss": 99.0}) + "\n")
    resumed = train_text_model(CodeModelConfig(role, run, steps=4, export_dir=export, **TINY))
    assert resumed["resumed_from_steps"] == [2]
    steps = [r["step"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if "loss" in r]
    assert steps == [1, 2, 3, 4]  # continued from step 2, not from 0, and the lost step 3 was redone

    if role == "draft":  # resuming lands on exactly the batches and weights of an uninterrupted run
        straight = tmp_path / "straight"
        train_text_model(CodeModelConfig(role, straight, steps=4, export_dir=None, **TINY))
        losses = [[r["loss"] for r in map(json.loads, (d / "metrics.jsonl").read_text().splitlines()) if "loss" in r]
                  for d in (run, straight)]
        assert losses[0] == losses[1]


def test_cli_finalize_card_writes_readme_and_manifest(tmp_path):
    export = tmp_path / "assets" / "code"
    train_text_model(CodeModelConfig("draft", tmp_path / "run", steps=1, export_dir=export, **TINY))
    assert main(["--finalize-card", "--export-dir", str(export)]) == 0
    assert "Draft" in (export / "README.md").read_text()
    manifest = json.loads((tmp_path / "assets" / "MANIFEST.json").read_text())
    paths = {e["path"] for e in manifest["files"]}
    assert {"code/tokenizer.json", "code/draft/model.safetensors", "code/README.md"} <= paths
    assert all(len(e["sha256"]) == 64 and e["commit"] for e in manifest["files"])
    with open(export / "README.md", "a") as f:  # a section added by hand survives regeneration, once
        f.write("\n## Acceptance (measured)\n\nalpha 0.7\n")
    main(["--finalize-card", "--export-dir", str(export)])
    assert (export / "README.md").read_text().count("## Acceptance (measured)\n\nalpha 0.7\n") == 1


@pytest.mark.skipif(not (ASSETS_CODE / "tokenizer.json").exists(), reason="no shipped code tokenizer")
def test_shipped_tokenizer_round_trips_code():
    tok = load_tokenizer(ASSETS_CODE)
    snippet = 'def f(x: int) -> str:\n\t"""Ünïcode — tabs\tand  spaces."""\r\n    return f"{x!r}"  # ok\n'
    ids = tok(snippet)["input_ids"]
    assert ids[0] == tok.bos_token_id  # a prompt starts as the training files did: `<bos> text <eos>`
    assert tok.decode(ids, skip_special_tokens=True) == snippet and len(ids) < len(snippet.encode())
    assert tok.decode(tok(snippet, add_special_tokens=False)["input_ids"]) == snippet
    assert (tok.bos_token, tok.eos_token, tok.pad_token) == ("<bos>", "<eos>", "<pad>")
    assert len({tok.bos_token_id, tok.eos_token_id, tok.pad_token_id}) == 3


def test_specgen_train_text_one_step_then_resumes(tmp_path, capsys):
    """The CLI path of the target's trainer: a step on a few corpus files, a checkpoint and an export; a rerun
    resumes. (`specgen train draft`, the distillation toolkit, is tested in test_distill.py.)"""
    import json

    from specgen.app.cli import main

    out = tmp_path / "run"
    assert main(["train", "text", "--steps", "1", "--out", str(out), "--max-files", "20"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["role"] == "target" and summary["steps"] == 1
    assert (out / "export" / "target" / "model.safetensors").exists()
    assert main(["train", "text", "--steps", "2", "--out", str(out), "--max-files", "20"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["steps"] == 2
