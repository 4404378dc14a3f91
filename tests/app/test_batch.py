"""`specgen batch`: up-front validation, per-item errors, resume after a kill, the summary, the engines; on a tiny
random model pair saved to a temp folder (tests never use the shipped checkpoints)."""

from __future__ import annotations

import importlib.util
import json

from pathlib import Path

import pytest

from tiny_models import save_tiny, save_tiny_image_model, save_tiny_speech_models
from specgen.app import batch as batch_module
from specgen.app.cli import main
from specgen.modalities.text.generator import TextGenerator




@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return save_tiny(root / "target", 0), save_tiny(root / "draft", 1, layers=1, hidden=16)


@pytest.fixture(scope="module")
def image_pair(tmp_path_factory):
    return tuple(map(str, save_tiny_image_model(tmp_path_factory.mktemp("image"), num_codes=16, grid=4)))


@pytest.fixture(scope="module")
def video_model(tmp_path_factory):
    return str(save_tiny_image_model(tmp_path_factory.mktemp("video"), num_codes=16, grid=4, frames=2)[0])


@pytest.fixture(scope="module")
def speech_paths(tmp_path_factory):
    return tuple(map(str, save_tiny_speech_models(tmp_path_factory.mktemp("speech"), num_tokens=64)))


@pytest.fixture(scope="module")
def generator(pair):
    return TextGenerator(*pair)


ITEMS = [
    {"id": "greedy", "modality": "text", "prompt": "abc abc (x", "params": {"max_new_tokens": 12}},
    {"id": 2, "modality": "text", "prompt": "ab ab ab", "method": "ngram",
     "params": {"max_new_tokens": 10, "num_draft_tokens": 3}},
    {"id": "speech", "modality": "speech", "text": "hello", "method": "sd",
     "params": {"temperature": 0.0, "max_new_tokens": 20}},
    {"id": "video", "modality": "video", "class": "3", "method": "mc-sjd",  # window is a Jacobi knob; default: auto
     "params": {"window": 40, "temperature": 0.0}},
    {"id": "too-long", "modality": "text", "prompt": "ab", "params": {"max_new_tokens": 500}},
    {"id": "sampled", "modality": "text", "prompt": "ab", "seed": 3, "method": "draft",
     "params": {"temperature": 1.0, "top_p": 0.9, "num_samples": 2, "max_new_tokens": 8}},
    {"id": "plain", "modality": "text", "prompt": "x = (", "method": "ar", "params": {"max_new_tokens": 6}},
    {"id": "image", "modality": "image", "class": 3, "method": "mc-sjd", "seed": 2,
     "params": {"window": 6, "temperature": 0.0}},
    {"id": "bad/image", "modality": "image", "prompt": "purple Q"},
]


def write_jsonl(path, items):
    path.write_text("".join(json.dumps(item) + "\n" for item in items))
    return path


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def run_cli(argv, capsys):
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def full_run(pair, image_pair, video_model, speech_paths, tmp_path_factory):
    """One uninterrupted run through the command line (the reference for the resume tests)."""
    folder = tmp_path_factory.mktemp("full")
    source = write_jsonl(folder / "in.jsonl", ITEMS)
    summary = batch_module.run_batch(source, folder / "out.jsonl", model=pair[0], draft=pair[1], progress=False,
                                     image_model=image_pair[0], image_vq=image_pair[1], speech_paths=speech_paths,
                                     video_model=video_model)
    return source, read_jsonl(folder / "out.jsonl"), summary


def test_every_item_gets_one_line_and_failures_are_recorded(full_run, generator, image_pair, video_model):
    source, records, summary = full_run
    by_id = {r["id"]: r for r in records}
    assert [r["id"] for r in records] == [item["id"] for item in ITEMS]
    assert all(set(r) == {"id", "status", "result" if r["status"] == "ok" else "error", "stats"} for r in records)
    assert {i for i, r in by_id.items() if r["status"] == "error"} == {"too-long", "bad/image"}
    speech = by_id["speech"]["result"]
    assert speech["audio"] == str(source.parent / "out-audio" / "speech.wav") and len(speech["tokens"]) > 0
    assert "unknown word" in by_id["bad/image"]["error"]
    from PIL import Image

    from specgen.modalities.image.generator import ImageGenerator

    image = by_id["image"]["result"]
    assert image["image"] == str(source.parent / "out-images" / "image.png") and Image.open(image["image"]).size == (16, 16)
    greedy = ImageGenerator(*image_pair).generate("3", method="ar", temperature=0)
    assert image["tokens"] == greedy.tokens[0] and by_id["image"]["stats"]["method"] == "mc-sjd"
    video = by_id["video"]["result"]
    assert video["video"] == str(source.parent / "out-videos" / "video.gif") and Image.open(video["video"]).n_frames == 2
    greedy = ImageGenerator(video_model, image_pair[1]).generate("3", method="ar", temperature=0)
    assert video["tokens"] == greedy.tokens[0] and by_id["video"]["stats"]["steps"] < 32
    assert "max_new_tokens" in by_id["too-long"]["error"]
    alone = generator.generate("abc abc (x", method="auto", max_new_tokens=12)  # an item without a method: auto
    assert by_id["greedy"]["result"] == {"text": alone.text, "tokens": alone.tokens}
    assert by_id["greedy"]["stats"]["method"] == "auto"
    # auto decides by measured costs, so two runs may draft differently (same tokens); the same decisions, same τ
    if by_id["greedy"]["stats"]["auto"]["steps_by_method"] == alone.stats["auto"]["steps_by_method"]:
        assert by_id["greedy"]["stats"]["tau"] == alone.stats["tau"]
    assert by_id[2]["stats"]["method"] == "ngram" and by_id["plain"]["stats"]["tau"] == 1.0
    sampled = generator.generate("ab", method="draft", temperature=1.0, top_p=0.9, num_samples=2, seed=3,
                                 max_new_tokens=8)
    assert by_id["sampled"]["result"] == {"samples": sampled.samples}
    assert (summary["ok"], summary["error"], summary["skipped"]) == (7, 2, 0)
    assert summary["tokens"] == sum(r["stats"]["committed"] for r in records if r["status"] == "ok")
    assert summary["mean_tau"] > 0 and summary["tokens_per_s"] > 0


def test_resume_after_a_kill_loses_nothing_and_repeats_nothing(full_run, pair, image_pair, video_model, speech_paths,
                                                               tmp_path, capsys):
    source, reference, _ = full_run
    out = tmp_path / "out.jsonl"
    lines = [json.dumps(r) for r in reference]
    # killed while writing the fourth line: three complete lines and part of the next one
    out.write_text("\n".join(lines[:3]) + "\n" + lines[3][: len(lines[3]) // 2])
    images = ["--image-model", image_pair[0], "--image-vq", image_pair[1], "--speech-model", speech_paths[0],
              "--speech-draft", speech_paths[1], "--speech-codec", speech_paths[2], "--video-model", video_model]
    code, stdout, err = run_cli(["batch", "--input", str(source), "--output", str(out), "--model", pair[0],
                                 "--draft", pair[1], "--json", *images], capsys)
    assert code == 0, err
    records = read_jsonl(out)
    assert sorted(map(str, (r["id"] for r in records))) == sorted(str(item["id"]) for item in ITEMS)
    def strip(record):  # timings differ between runs, and images are written beside each run's output
        record = {k: v for k, v in record.items() if k != "stats"}
        for media in ("image", "audio", "video"):
            if media in record.get("result", {}):
                record["result"] = {**record["result"], media: record["result"][media].rsplit("/", 1)[-1]}
        return record

    strip, expected = [strip(r) for r in records], [strip(r) for r in reference]
    assert strip[:3] == expected[:3]  # untouched
    assert sorted(strip, key=lambda r: str(r["id"])) == sorted(expected, key=lambda r: str(r["id"]))
    summary = json.loads(stdout)  # stdout holds only the JSON summary
    assert (summary["skipped"], summary["ran"]) == (3, len(ITEMS) - 3)
    assert "incomplete last line" in err or "skipping" in err
    assert "mean tau" in err and "tokens/s" in err  # the summary table
    # a second rerun has nothing left to do
    code, stdout, err = run_cli(["batch", "--input", str(source), "--output", str(out), "--model", pair[0],
                                 "--draft", pair[1], "--json", *images], capsys)
    assert code == 0 and json.loads(stdout)["ran"] == 0 and len(read_jsonl(out)) == len(ITEMS)


def test_every_line_is_on_disk_as_soon_as_it_is_written(generator, tmp_path, monkeypatch):
    source = write_jsonl(tmp_path / "in.jsonl", ITEMS[:2] + [ITEMS[5]])
    out = tmp_path / "out.jsonl"
    seen = []
    real = batch_module.run_item

    def spy(gen, request, *rest):  # before each item runs, every earlier result is already in the file
        seen.append(len(out.read_text().splitlines()))
        return real(gen, request, *rest)

    monkeypatch.setattr(batch_module, "run_item", spy)
    batch_module.run_batch(source, out, generator=generator, progress=False)
    assert seen == [0, 1, 2]


BAD_INPUTS = {
    "not json": ('{"id": "a", "modality": "text", "prompt": "x"}\n\n{"id": \n', ["line 3", "JSON"]),
    "not an object": ('{"id": "a", "modality": "text", "prompt": "x"}\n[1, 2]\n', ["line 2", "object"]),
    "unknown modality": ('{"id": "a", "modality": "audio", "prompt": "x"}\n', ["line 1", "audio"]),
    "missing modality": ('{"id": "a", "prompt": "x"}\n', ["line 1", "modality"]),
    "missing prompt": ('{"id": "a", "modality": "text", "prompt": "x"}\n{"id": "b", "modality": "text"}\n',
                       ["line 2", "prompt"]),
    "empty prompt": ('{"id": "a", "modality": "text", "prompt": "  "}\n', ["line 1", "prompt"]),
    "speech needs text": ('{"id": "a", "modality": "speech", "prompt": "x"}\n', ["line 1", "text"]),
    "missing id": ('{"modality": "text", "prompt": "x"}\n', ["line 1", "id"]),
    "duplicate id": ('{"id": "a", "modality": "text", "prompt": "x"}\n{"id": "b", "modality": "text", '
                     '"prompt": "y"}\n{"id": "a", "modality": "speech", "text": "z"}\n', ["line 3", "duplicate", "line 1"]),
    "unknown method": ('{"id": "a", "modality": "text", "prompt": "x", "method": "zz"}\n', ["line 1", "zz"]),
    "bad param": ('{"id": "a", "modality": "text", "prompt": "x", "params": {"top_p": 2}}\n', ["line 1", "top_p"]),
    "unknown param": ('{"id": "a", "modality": "text", "prompt": "x", "params": {"beams": 2}}\n',
                      ["line 1", "beams"]),
    "bad seed": ('{"id": "a", "modality": "text", "prompt": "x", "seed": -1}\n', ["line 1", "seed"]),
    "bad pcg theta": ('{"id": "a", "modality": "speech", "text": "x", "method": "pcg", "params": {"theta": 2}}\n',
                      ["line 1", "theta must be <= 1.0"]),
    "bad pcg residual": ('{"id": "a", "modality": "speech", "text": "x", "method": "pcg", '
                         '"params": {"residual": "best"}}\n', ["line 1", "residual must be one of"]),
    "beta for pcg": ('{"id": "a", "modality": "speech", "text": "x", "method": "pcg", "params": {"beta": 0.1}}\n',
                     ["line 1", "beta"]),
    "empty file": ("\n\n", ["no requests"]),
}


@pytest.mark.parametrize("content, words", list(BAD_INPUTS.values()), ids=list(BAD_INPUTS))
def test_invalid_input_exits_2_naming_the_line_before_any_work(content, words, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "in.jsonl").write_text(content)
    monkeypatch.setattr(batch_module, "run_item", lambda *a: pytest.fail("no item may run"))
    code, out, err = run_cli(["batch", "--input", "in.jsonl", "--output", "out.jsonl", "--model", "missing"],
                             capsys)
    assert code == 2 and out == "" and len(err.splitlines()) == 1 and err.startswith("error: ")
    for word in words:
        assert word in err
    assert not (tmp_path / "out.jsonl").exists()


def test_a_damaged_output_file_is_not_appended_to(generator, tmp_path):
    source = write_jsonl(tmp_path / "in.jsonl", ITEMS[:1])
    out = tmp_path / "out.jsonl"
    out.write_text('{"id": "x", "status": "ok"}\nnot json\n{"id": "y", "status": "ok"}\n')
    with pytest.raises(batch_module.InvalidRequest, match="line 2"):
        batch_module.run_batch(source, out, generator=generator, progress=False)


def test_a_missing_model_fails_before_anything_is_written(tmp_path, capsys):
    source = write_jsonl(tmp_path / "in.jsonl", ITEMS[:1])
    code, out, err = run_cli(["batch", "--input", str(source), "--output", str(tmp_path / "out.jsonl"),
                              "--model", str(tmp_path / "nowhere")], capsys)
    assert code == 2 and "does not exist" in err and not (tmp_path / "out.jsonl").exists()


def test_ray_engine_without_ray_is_a_missing_extra(tmp_path, capsys, monkeypatch):
    source = write_jsonl(tmp_path / "in.jsonl", ITEMS[:1])
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a))
    code, out, err = run_cli(["batch", "--input", str(source), "--output", str(tmp_path / "out.jsonl"),
                              "--engine", "ray"], capsys)
    assert code == 2 and out == "" and err.startswith("error: ") and "ray" in err.lower()
    assert not (tmp_path / "out.jsonl").exists()


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="Ray is not installed (optional engine)")
def test_ray_engine_gives_the_local_results(full_run, pair, image_pair, video_model, speech_paths, tmp_path):
    source, reference, _ = full_run
    out = tmp_path / "out.jsonl"
    batch_module.run_batch(source, out, engine="ray", model=pair[0], draft=pair[1], workers=2, progress=False,
                           image_model=image_pair[0], image_vq=image_pair[1], speech_paths=speech_paths,
                           video_model=video_model)
    def strip(records):  # stats hold timings; media files sit beside each run's output, so compare their names
        out = []
        for r in records:
            r = {k: v for k, v in r.items() if k != "stats"}
            if isinstance(r.get("result"), dict):
                r["result"] = {k: Path(v).name if k in ("image", "audio", "video", "frames") and isinstance(v, str) else v
                               for k, v in r["result"].items()}
            out.append(r)
        return sorted(out, key=lambda r: str(r["id"]))

    assert strip(read_jsonl(out)) == strip(reference)


def test_speech_items_pass_the_relaxed_methods_knobs(speech_paths, tmp_path):
    items = [{"id": "pcg", "modality": "speech", "text": "hello", "method": "pcg", "seed": 1,
              "params": {"theta": 0.2, "residual": "thinning", "max_new_tokens": 16}},
             {"id": "ssd", "modality": "speech", "text": "hello", "method": "ssd", "seed": 1,
              "params": {"beta": 0.3, "num_draft_tokens": 2, "max_new_tokens": 16}}]
    source = write_jsonl(tmp_path / "in.jsonl", items)
    summary = batch_module.run_batch(source, tmp_path / "out.jsonl", progress=False, speech_paths=speech_paths)
    by_id = {r["id"]: r for r in read_jsonl(tmp_path / "out.jsonl")}
    assert summary["ok"] == 2 and all(r["status"] == "ok" for r in by_id.values())
    from specgen.modalities.speech.generator import SpeechGenerator

    alone = SpeechGenerator(*speech_paths).generate("hello", method="pcg", seed=1, theta=0.2, residual="thinning",
                                                    max_new_tokens=16, decode=False)
    assert by_id["pcg"]["result"]["tokens"] == alone.tokens
    assert by_id["pcg"]["stats"]["acceptance_level"] == "group"
    assert by_id["ssd"]["stats"]["acceptance_level"] == "tolerance"


def test_rows_serve_greedy_text_items_together_with_the_one_by_one_results(pair, tmp_path, capsys):
    """`--rows 3`: greedy single-sample text items with the same method and knobs decode together; every item's
    tokens equal the one-by-one run's, a group whose knobs are bad falls back to per-item errors, and sampled or
    other-modality items still run alone."""
    prompts = ["abc abc (x", "ab ab ab", "x = (", "hello hello", "(a(b", "mississippi", "to be"]
    items = [{"id": f"d{i}", "modality": "text", "prompt": p, "method": "draft", "params": {"max_new_tokens": 10}}
             for i, p in enumerate(prompts)]
    items += [{"id": f"n{i}", "modality": "text", "prompt": p, "method": "ngram", "params": {"max_new_tokens": 8}}
              for i, p in enumerate(prompts[:4])]
    items += [{"id": "one-sample", "modality": "text", "prompt": "abab", "method": "draft",
               "params": {"max_new_tokens": 10, "num_samples": 1}},
              {"id": "long-in-group", "modality": "text", "prompt": "ab" * 45, "method": "draft",
               "params": {"max_new_tokens": 10}},
              {"id": "too-long", "modality": "text", "prompt": "ab", "params": {"max_new_tokens": 500}},
              {"id": "sampled", "modality": "text", "prompt": "ab", "seed": 3, "method": "draft",
               "params": {"temperature": 1.0, "max_new_tokens": 8}}]
    source = write_jsonl(tmp_path / "in.jsonl", items)
    code, _, _ = run_cli(["batch", "--input", str(source), "--output", str(tmp_path / "one.jsonl"), "--model",
                          pair[0], "--draft", pair[1]], capsys)
    assert code == 0
    code, _, err = run_cli(["batch", "--input", str(source), "--output", str(tmp_path / "rows.jsonl"), "--model",
                            pair[0], "--draft", pair[1], "--rows", "3"], capsys)
    assert code == 0
    one = {r["id"]: r for r in read_jsonl(tmp_path / "one.jsonl")}
    rows = {r["id"]: r for r in read_jsonl(tmp_path / "rows.jsonl")}
    assert set(rows) == set(one) and len(read_jsonl(tmp_path / "rows.jsonl")) == len(items)
    for key, record in one.items():
        assert rows[key]["status"] == record["status"], key
        if record["status"] == "ok":
            assert rows[key]["result"] == record["result"], key
    assert rows["too-long"]["status"] == "error" and "max_new_tokens" in rows["too-long"]["error"]
    assert rows["d0"]["stats"]["served_rows"] == 3 and "served_rows" not in rows["sampled"]["stats"]
    assert rows["one-sample"]["stats"]["served_rows"] == 3  # an explicit num_samples 1 is served too
    # a prompt too long for the 96-token model fails alone; the rest of its group is still served
    assert rows["long-in-group"]["status"] == "error" and rows["d1"]["stats"]["served_rows"] == 3
    code, _, err = run_cli(["batch", "--input", str(source), "--output", str(tmp_path / "x.jsonl"), "--rows", "0"],
                           capsys)
    assert code == 2 and err.startswith("error:")
    with pytest.raises(batch_module.InvalidRequest, match="--rows"):
        batch_module.run_batch(source, tmp_path / "y.jsonl", model=pair[0], rows=4, online_draft=2)


@pytest.mark.parametrize("params, flags", [({"top_p": 2}, ["--top-p", "2"]),
                                           ({"max_new_tokens": 0}, ["--max-new-tokens", "0"]),
                                           ({"temperature": -1}, ["--temperature", "-1"])])
def test_a_bad_option_reads_the_same_in_a_batch_line_and_on_the_command_line(params, flags, capsys):
    """One table of request options checks both, so the message is the same."""
    with pytest.raises(batch_module.InvalidRequest) as info:
        batch_module.parse_request({"id": 1, "modality": "text", "prompt": "x", "params": params}, 1)
    code, _, err = run_cli(["generate", "text", "--prompt", "x", *flags], capsys)
    assert code == 2 and err.strip().endswith(str(info.value))
