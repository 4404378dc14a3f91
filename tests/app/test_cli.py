"""The `specgen` command line: argument validation, the one-line error contract, fast torch-free help, selfcheck."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

from specgen.app.cli import main
from specgen.errors import VocabularyMismatch
from specgen.samplers.registry import method_names

COMMANDS = ("demo", "generate", "bench", "batch", "train", "selfcheck")
HEAVY = ("torch", "transformers", "gradio")


def run(argv, capsys):
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_error_line(code, out, err):
    assert code == 2
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1, f"expected one stderr line, got: {err!r}"
    assert lines[0].startswith("error: ")
    return lines[0]


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SPECGEN_THREADS", raising=False)
    (tmp_path / "in.jsonl").write_text('{"id": "a", "modality": "text", "prompt": "hi"}\n\n'
                                       '{"id": "b", "modality": "speech", "text": "hello"}\n')
    (tmp_path / "prompts.jsonl").write_text('{"id": "1", "category": "code", "prompt": "def f("}\n')
    (tmp_path / "bad.jsonl").write_text('{"id": "a"}\n\n{"id": \n')
    (tmp_path / "list.jsonl").write_text('{"id": "a"}\n[1, 2]\n')
    (tmp_path / "folder.png").mkdir()
    return tmp_path


BAD = {
    "no command": [],
    "unknown command": ["nope"],
    "threads zero": ["--threads", "0", "selfcheck"],
    "threads text": ["--threads", "many", "selfcheck"],
    "threads after command": ["selfcheck", "--threads", "-1"],
    "no modality": ["generate"],
    "unknown modality": ["generate", "audio", "--text", "x"],
    "empty prompt": ["generate", "text", "--prompt", "  "],
    "zero new tokens": ["generate", "text", "--prompt", "hi", "--max-new-tokens", "0"],
    "fractional new tokens": ["generate", "text", "--prompt", "hi", "--max-new-tokens", "2.5"],
    "negative temperature": ["generate", "text", "--prompt", "hi", "--temperature", "-0.1"],
    "nan temperature": ["generate", "text", "--prompt", "hi", "--temperature", "nan"],
    "top-p zero": ["generate", "text", "--prompt", "hi", "--top-p", "0"],
    "top-p above one": ["generate", "text", "--prompt", "hi", "--top-p", "1.01"],
    "zero samples": ["generate", "text", "--prompt", "hi", "--num-samples", "0"],
    "negative seed": ["generate", "text", "--prompt", "hi", "--seed", "-1"],
    "huge seed": ["generate", "text", "--prompt", "hi", "--seed", str(2**63)],
    "unknown method": ["generate", "text", "--prompt", "hi", "--method", "bogus"],
    "trace in missing folder": ["generate", "text", "--prompt", "hi", "--trace", "nowhere/t.jsonl"],
    "unknown flag": ["generate", "text", "--prompt", "hi", "--bogus"],
    "abbreviated flag": ["generate", "text", "--prompt", "hi", "--temp", "1"],
    "image wrong suffix": ["generate", "image", "--prompt", "cat", "--out", "x.jpg"],
    "image out is a folder": ["generate", "image", "--prompt", "cat", "--out", "folder.png"],
    "image without source": ["generate", "image", "--out", "x.png"],
    "image prompt and class": ["generate", "image", "--prompt", "cat", "--class", "3", "--out", "x.png"],
    "image without out": ["generate", "image", "--prompt", "cat"],
    "video wrong suffix": ["generate", "video", "--class", "3", "--out", "x.png"],
    "speech wrong suffix": ["generate", "speech", "--text", "hi", "--out", "x.gif"],
    "speech without text": ["generate", "speech", "--out", "x.wav"],
    "speech out in missing folder": ["generate", "speech", "--text", "hi", "--out", "nowhere/x.wav"],
    "bench unknown modality": ["bench", "audio"],
    "bench unknown method": ["bench", "text", "--methods", "ar,zzz"],
    "bench empty method": ["bench", "text", "--methods", "ar,,draft"],
    "bench repeated method": ["bench", "text", "--methods", "ar,ar"],
    "bench peer outside text": ["bench", "speech", "--methods", "hf"],
    "bench zero repeats": ["bench", "text", "--repeats", "0"],
    "bench zero new tokens": ["bench", "text", "--max-new-tokens", "0"],
    "bench missing prompts": ["bench", "text", "--prompts", "missing.jsonl"],
    "batch missing input": ["batch", "--input", "missing.jsonl", "--output", "out.jsonl"],
    "batch input is a folder": ["batch", "--input", ".", "--output", "out.jsonl"],
    "batch without output": ["batch", "--input", "in.jsonl"],
    "batch output is input": ["batch", "--input", "in.jsonl", "--output", "./in.jsonl"],
    "batch unknown engine": ["batch", "--input", "in.jsonl", "--output", "out.jsonl", "--engine", "spark"],
    "train unknown": ["train", "everything"],
    "train zero steps": ["train", "draft", "--steps", "0"],
    "demo port zero": ["demo", "--port", "0"],
    "demo port too big": ["demo", "--port", "65536"],
    "selfcheck bad seed": ["selfcheck", "--seed", "x"],
}


@pytest.mark.parametrize("argv", list(BAD.values()), ids=list(BAD))
def test_bad_arguments_give_one_error_line_and_exit_2(argv, in_tmp, capsys):
    assert_one_error_line(*run(argv, capsys))


@pytest.mark.parametrize("argv, words", [
    (["generate", "text", "--prompt", "hi", "--max-new-tokens", "0"], ["--max-new-tokens", ">= 1"]),
    (["generate", "text", "--prompt", "hi", "--top-p", "2"], ["--top-p", "(0, 1]"]),
    (["generate", "text", "--prompt", "hi", "--method", "bogus"], ["bogus", *method_names("text")]),
    (["generate", "video", "--class", "1", "--out", "x.gif", "--method", "lantern"], ["lantern", "gumbel-sjd"]),
    (["bench", "video", "--windows", "8,300"], ["--windows", "[2, 256]"]),
    (["generate", "image", "--prompt", "cat", "--out", "x.jpg"], [".png"]),
    (["bench", "text", "--methods", "ar,zzz"], ["zzz", "hf-prompt-lookup"]),
    (["batch", "--input", "bad.jsonl", "--output", "out.jsonl"], ["bad.jsonl", "line 3", "JSON"]),
    (["batch", "--input", "list.jsonl", "--output", "out.jsonl"], ["line 2", "object"]),
])
def test_error_messages_name_the_problem(argv, words, in_tmp, capsys):
    line = assert_one_error_line(*run(argv, capsys))
    for word in words:
        assert word in line


@pytest.mark.parametrize("value", ["0", "-2", "two"])
def test_bad_threads_environment_is_an_error(value, in_tmp, monkeypatch, capsys):
    monkeypatch.setenv("SPECGEN_THREADS", value)
    line = assert_one_error_line(*run(["demo"], capsys))
    assert "SPECGEN_THREADS" in line


@pytest.mark.parametrize("method", method_names("text"))
def test_every_registered_text_method_is_accepted(method, in_tmp, capsys):
    line = assert_one_error_line(*run(["generate", "text", "--prompt", "hi", "--method", method,
                                       "--model", str(in_tmp / "no-model")], capsys))
    assert "no-model" in line and "does not exist" in line  # got past argument validation to model loading


@pytest.mark.parametrize("argv", [[], ["demo"], ["generate"], ["generate", "text"], ["generate", "image"],
                                  ["generate", "video"], ["generate", "speech"], ["bench"], ["bench", "text"],
                                  ["batch"], ["train"], ["train", "draft"], ["selfcheck"]])
def test_help_exits_0_with_usage(argv, capsys):
    code, out, err = run([*argv, "--help"], capsys)
    assert code == 0 and err == ""
    assert out.startswith("usage: specgen")


def test_help_lists_commands_and_methods(capsys):
    _, out, _ = run(["--help"], capsys)
    for name in COMMANDS:
        assert name in out
    _, out, _ = run(["generate", "text", "--help"], capsys)
    for name in method_names("text"):
        assert name in out


REQUIRED = {"text": [], "image": ["--prompt", "cat", "--out", "x.png"], "video": ["--class", "3", "--out", "x.gif"],
            "speech": ["--text", "hi", "--out", "x.wav"]}


@pytest.mark.parametrize("modality", list(REQUIRED))
def test_every_request_option_and_method_knob_is_a_generate_flag(modality, in_tmp):
    """`generate` takes each request option (with its default) and each knob of every method of the modality."""
    from specgen.app.cli import build_parser
    from specgen.app.request_options import fields
    from specgen.samplers.registry import knob_owners

    parser = build_parser()
    base = ["generate", modality, *REQUIRED[modality]]
    for name, option in fields(modality).items():
        assert getattr(parser.parse_args(base), name) == option.default
        for flag in option.flags:
            assert getattr(parser.parse_args([*base, flag, "1"]), name) == option.parse("1")
    for knob in set(knob_owners(modality)) - set(fields(modality)):
        args = parser.parse_args([*base, "--" + knob.replace("_", "-"), "3"])
        assert getattr(args, "knob_" + knob) == "3"


def test_version(capsys):
    code, out, _ = run(["--version"], capsys)
    assert (code, out.strip()) == (0, "specgen 0.1.0")


# ---- selfcheck, against a stand-in module (the real one is tested below when present) ---------------------------

@pytest.fixture
def fake_selfcheck(monkeypatch):
    import torch

    calls = []
    module = types.ModuleType("specgen.samplers.selfcheck")
    module.result = {"ok": True, "seed": None, "checks": [
        {"name": "chain rejection", "ok": True, "tv_distance": 0.00123456, "samples": 20000},
        {"name": "draft tree", "ok": True, "max_abs_error": 0.0},
    ]}

    def run_selfcheck(seed=0):
        calls.append({"seed": seed, "threads": torch.get_num_threads()})
        if isinstance(module.result, Exception):
            raise module.result
        return {**module.result, "seed": seed}

    module.run_selfcheck = run_selfcheck
    monkeypatch.setitem(sys.modules, "specgen.samplers.selfcheck", module)
    monkeypatch.delenv("SPECGEN_THREADS", raising=False)
    threads = torch.get_num_threads()
    yield module, calls
    torch.set_num_threads(threads)


def test_selfcheck_json_prints_only_the_result(fake_selfcheck, capsys):
    module, calls = fake_selfcheck
    code, out, err = run(["selfcheck", "--seed", "7", "--json"], capsys)
    assert code == 0
    assert json.loads(out) == {**module.result, "seed": 7}
    assert calls == [{"seed": 7, "threads": 1}]


def test_selfcheck_table(fake_selfcheck, capsys):
    code, out, _ = run(["selfcheck"], capsys)
    assert code == 0
    assert "chain rejection" in out and "draft tree" in out
    assert "tv_distance=0.001235" in out and "samples=20000" in out
    assert "2 of 2 checks passed" in out and "FAIL" not in out


def test_selfcheck_failure_exits_1(fake_selfcheck, capsys):
    module, _ = fake_selfcheck
    module.result = {"ok": False, "checks": [{"name": "chain rejection", "ok": False, "tv_distance": 0.2},
                                             {"name": "draft tree", "ok": True}]}
    code, out, _ = run(["selfcheck"], capsys)
    assert code == 1
    assert "FAIL  chain rejection" in out and "1 of 2 checks passed" in out
    code, out, _ = run(["selfcheck", "--json"], capsys)
    assert code == 1 and json.loads(out)["ok"] is False


@pytest.mark.parametrize("argv, env, threads", [
    (["selfcheck"], None, 1),
    (["selfcheck"], "2", 2),
    (["--threads", "3", "selfcheck"], "2", 3),
    (["selfcheck", "--threads", "4"], None, 4),
])
def test_selfcheck_applies_threads(argv, env, threads, fake_selfcheck, monkeypatch, capsys):
    _, calls = fake_selfcheck
    if env is not None:
        monkeypatch.setenv("SPECGEN_THREADS", env)
    assert run(argv, capsys)[0] == 0
    assert calls[-1]["threads"] == threads


def test_specgen_errors_from_a_command_are_one_line(fake_selfcheck, capsys):
    module, _ = fake_selfcheck
    module.result = VocabularyMismatch("target has 100 tokens,\ndraft has 99")
    line = assert_one_error_line(*run(["selfcheck", "--json"], capsys))
    assert line == "error: target has 100 tokens, draft has 99"


def test_unexpected_errors_keep_their_traceback(fake_selfcheck):
    module, _ = fake_selfcheck
    module.result = RuntimeError("bug")
    with pytest.raises(RuntimeError, match="bug"):
        main(["selfcheck"])


def test_selfcheck_without_its_module_is_not_available(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "specgen.samplers.selfcheck", None)  # makes the import fail
    line = assert_one_error_line(*run(["selfcheck"], capsys))
    assert "'specgen selfcheck' is not available" in line


@pytest.mark.skipif(importlib.util.find_spec("specgen.samplers.selfcheck") is None,
                    reason="specgen.samplers.selfcheck is not in this version")
def test_real_selfcheck_passes(capsys):
    import torch

    threads = torch.get_num_threads()
    try:
        code, out, _ = run(["selfcheck", "--json"], capsys)
    finally:
        torch.set_num_threads(threads)
    result = json.loads(out)
    assert code == 0 and result["ok"] is True
    assert result["checks"] and all({"name", "ok"} <= set(check) for check in result["checks"])
    assert all(check["ok"] for check in result["checks"])


# ---- in fresh processes: speed, no heavy imports, entry points --------------------------------------------------

def _subprocess(args, **kwargs):
    start = time.perf_counter()
    proc = subprocess.run(args, capture_output=True, text=True, timeout=60, **kwargs)
    return proc, time.perf_counter() - start


@pytest.mark.timed
def test_console_script_help_is_fast():
    script = Path(sys.executable).with_name("specgen")
    assert script.exists(), "the `specgen` console script is not installed next to this Python"
    proc, wall = _subprocess([str(script), "--help"])
    assert proc.returncode == 0, proc.stderr
    for name in COMMANDS:
        assert f"    {name} " in proc.stdout
    assert wall < 2.0, f"`specgen --help` took {wall:.2f} s"


@pytest.mark.timed
def test_console_script_error_is_fast_and_one_line():
    proc, wall = _subprocess([str(Path(sys.executable).with_name("specgen")), "generate", "speech"])
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == "error: the following arguments are required: --text, --out\n"
    assert wall < 2.0


@pytest.mark.parametrize("argv, code", [
    (["--help"], 0),
    (["generate", "text", "--help"], 0),
    (["generate", "text", "--prompt", "hi", "--top-p", "0"], 2),
    (["generate", "image", "--prompt", "hi", "--out", "x.jpg"], 2),
    (["bench", "speech", "--methods", "ar,zzz"], 2),
])
def test_help_and_errors_import_no_torch(argv, code):
    script = ("import json, sys\n"
              "from specgen.app.cli import main\n"
              f"code = main({argv!r})\n"
              f"print(json.dumps([code, [m for m in {HEAVY!r} if m in sys.modules]]), file=sys.stderr)\n")
    proc, wall = _subprocess([sys.executable, "-c", script])
    assert json.loads(proc.stderr.splitlines()[-1]) == [code, []]
    assert wall < 2.0


@pytest.mark.parametrize("module", ["specgen", "specgen.app.cli"])
def test_python_dash_m(module):
    proc, _ = _subprocess([sys.executable, "-m", module, "--help"])
    assert proc.returncode == 0
    assert proc.stdout.startswith("usage: specgen") and "selfcheck" in proc.stdout
    proc, _ = _subprocess([sys.executable, "-m", module, "nope"])
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1
