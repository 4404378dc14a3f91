"""`specgen bench image` on a tiny random model: every method and window is measured, greedy exactness is
checked, and the report, plot and sample sheet are written."""

import argparse
import json

import pytest
from PIL import Image
from tiny_models import save_tiny_image_model

from specgen.app.bench.image import run_bench_image, write_outputs
from specgen.app.bench.prompts import load_prompts
from specgen.errors import InvalidRequest
from specgen.modalities.image.generator import ImageGenerator


@pytest.fixture(scope="module")
def generator(tmp_path_factory):
    model, vq = save_tiny_image_model(tmp_path_factory.mktemp("image"), num_codes=16, grid=4)
    return ImageGenerator(model, vq)


def test_bench_image_measures_every_method_and_window(generator, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"id": "k", "category": "glyph", "prompt": "red K on blue"}\n'
                       '{"id": "three", "category": "digit", "class": "digit 3"}\n')
    result = run_bench_image(prompts_path=prompts, methods=["mc-sjd", "sjd"], windows=(2, 4), generator=generator,
                             samples_out=tmp_path / "bench-image-x-samples.png")
    result["env"]["timestamp_utc"] = "x"
    rows = {(r["method"], r["window"]) for r in result["table"]}
    assert rows == {("ar", 1), ("mc-sjd", 2), ("mc-sjd", 4), ("sjd", 2), ("sjd", 4)}
    assert result["all_identical_to_ar"] and len(result["exactness"]) == 4
    # the bench contract shared by every modality: methods -> stats with speedup_vs_ar, items, env
    assert set(result["methods"]) == {"ar", "mc-sjd", "sjd"} and len(result["items"]) == 2 * 5
    mc = result["methods"]["mc-sjd"]
    assert mc["method"] == "mc-sjd" and mc["lossless"] is True and mc["window"] in (2, 4) and mc["identical_to_ar"]
    for key in ("steps", "tau", "acceptance_rate", "per_position_acceptance", "wall_s", "tokens_per_s",
                "predicted_speedup_measured", "speedup_vs_ar"):
        assert key in mc, key
    assert result["methods"]["ar"]["speedup_vs_ar"] == 1.0 and result["methods"]["ar"]["steps"] == 16
    assert set(result["categories"]) == {"glyph", "digit"} and result["categories"]["glyph"]["entropy"] > 0
    for row in result["table"]:
        assert row["steps"] <= 16 and row["predicted_speedup"] > 0
    paths = write_outputs(result, tmp_path).runs
    assert json.loads(paths["json"].read_text())["best"]["mc-sjd"]["window"] in (2, 4)
    text = paths["md"].read_text()
    assert "mc-sjd" in text and "Greedy exactness: 4 of 4" in text and "samples" in text
    assert Image.open(paths["png"]).size[0] > 400
    assert "image-latest.png" in (tmp_path / "image-latest.md").read_text()
    assert (tmp_path / "image-latest-samples.png").exists() and (tmp_path / "image-latest.json").exists()
    assert Image.open(tmp_path / "bench-image-x-samples.png").size == (2 * 16 * 2, 3 * 16 * 2)


def test_bad_prompt_files_are_rejected(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "category": "glyph"}\n')
    with pytest.raises(InvalidRequest, match="line 1"):
        load_prompts(bad, classes=True)


def test_bench_lantern_reports_speed_quality_and_a_frontier(tmp_path, monkeypatch):
    """The head's methods on the shipped models: one prompt, one lambda, a given tree, 20 quality samples per
    set."""
    from specgen.app.bench.lantern import bench_lantern

    monkeypatch.setenv("SPECGEN_HOME", str(tmp_path / "home"))
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": "k", "prompt": "red K on blue", "category": "glyph"}) + "\n")
    args = argparse.Namespace(model=None, head=None, threads=1, prompts=prompts, lambdas=[5.0], deltas=[0.2],
                              shape=["chain-3"], quality_samples=20, quality_methods=["lantern++"], repeats=1,
                              out_dir=tmp_path / "out", argv=["bench"], quality=True)
    result = bench_lantern(args, ["lantern", "lantern++"])  # speed for both, quality for lantern++ only
    rows = {row["setting"]: row for row in result["speed"]["table"]}
    assert set(rows) == {"lantern (δ 0.2)", "lantern++ (λ 5)"}
    assert rows["lantern++ (λ 5)"]["tau"] > 1.5 and rows["lantern++ (λ 5)"]["relaxed_share"] > 0
    quality = result["quality"]
    assert quality["samples"] == 20 and quality["floor_ar_vs_ar"] > 0 and 0 <= quality["accuracy_ar"] <= 1
    assert set(quality["settings"]) == {"lantern++ (λ 5)"}
    report = (tmp_path / "out" / "image-lantern-latest.md").read_text()
    assert "FD − FD_AR" in report and "image-lantern-latest.png" in report
    judged = result["speed"]["judge"]  # --quality: the independent judge on every image of the speed runs
    assert set(judged) == {"ar", *rows} and all(row["samples"] == 1 for row in judged.values())
    assert "The independent judge" in report and "Δ OCR vs ar" in report
    assert "nan" not in report  # quality rows are named as the speed rows whatever the shape, so speedups join
    assert (tmp_path / "out" / "image-lantern-latest.png").stat().st_size > 1000
    assert (tmp_path / "out" / "image-lantern-latest-samples.png").exists() and "samples" in report
    cached = list((tmp_path / "home" / "bench-lantern").rglob("*.npy"))
    assert len(cached) == 3  # two AR sets and one setting, one prompt each: a rerun resumes from these


def test_a_shape_sweep_runs_every_setting_at_every_shape():
    """`--shape chain-2,chain-4`: each setting once per shape, named by it (so rows and quality sets stay apart);
    one shape names none (the record's caption gives it); a bad name is a usage error before any work."""
    from specgen.app.bench.lantern import label, method_settings
    from specgen.app.cli.options import shape_list

    swept = method_settings(["eagle", "lantern++"], [5.0], [0.1], shape_list("chain-2,chain-4,chain-2"))
    assert [label(m, k) for m, k in swept] == ["eagle (shape chain-2)", "lantern++ (λ 5, shape chain-2)",
                                               "eagle (shape chain-4)", "lantern++ (λ 5, shape chain-4)"]
    assert method_settings(["eagle"], [5.0], [0.1], ["chain-3"]) == [("eagle", {})]
    with pytest.raises(argparse.ArgumentTypeError, match="unknown tree shape 'bushy'"):
        shape_list("chain-2,bushy")


def test_the_head_bench_judges_every_image_against_ar():
    """`bench image --quality` with the head's methods: per setting the judge's shares and their difference from
    `ar`'s with an interval that excludes 0 only for a real difference."""
    from specgen.app.bench.lantern import judge_summary

    def scores(right: int, n: int = 10):
        return [{"group": "uppercase", "ocr_strict": k < right, "ocr_folded": k < right, "fg": True, "bg": k % 2 == 0}
                for k in range(n)]

    runs = [{"setting": "better", "quality": q} for q in scores(10)] + \
        [{"setting": "same", "quality": q} for q in scores(5)] + [{"setting": "photo", "quality": None}]
    summary = judge_summary(runs, scores(5) + [None])
    assert summary["ar"]["samples"] == 10 and summary["ar"]["ocr_folded"] == 0.5
    diff, low, high = summary["better"]["vs_ar"]["ocr_folded"]
    assert diff == 0.5 and 0 < low < diff < high
    diff, low, high = summary["same"]["vs_ar"]["ocr_folded"]
    assert diff == 0 and low < 0 < high
    assert summary["same"]["vs_ar"]["fg"][1] < 0 < summary["same"]["vs_ar"]["fg"][2]  # shares of 1 still get a width
    assert summary["photo"]["samples"] == 0 and summary["photo"]["vs_ar"] == {}


def test_a_bad_out_dir_fails_before_any_work(tmp_path, capsys):
    from specgen.app.cli import main

    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    assert main(["bench", "image", "--methods", "ar", "--out-dir", str(blocker)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and "not a folder" in err and len(err.strip().splitlines()) == 1
