"""The Speech tab's runner for the lossy methods (pcg, ssd), called directly on tiny random models: their knob
widgets reach the generator, the stats say what the acceptance means, and bad knob values are one UI error."""

from __future__ import annotations

import pytest
from tiny_models import save_tiny_speech_models

gr = pytest.importorskip("gradio")

from specgen.app.ui.speech import SpeechModels, _knob_widgets, make_speech_runner  # noqa: E402


@pytest.fixture(scope="module")
def runner(tmp_path_factory):
    from specgen.modalities.speech.generator import SpeechGenerator

    generator = SpeechGenerator(*save_tiny_speech_models(tmp_path_factory.mktemp("speech-ui"), num_tokens=64))
    return make_speech_runner(SpeechModels(generator))


@pytest.mark.parametrize("method, level", [("pcg", "groups of similar tokens"), ("ssd", "tolerance beta")])
def test_lossy_methods_run_and_explain_their_acceptance(runner, method, level):
    updates = list(runner("hello there", method, False, "slt", 0.8, 1, 0.2, 0.2, "thinning"))
    audio, markdown, _, stats = updates[-1]
    rate, samples = audio
    assert rate == 16000 and len(samples) > 0
    assert stats["lossless"] is False and "(lossy)" in markdown
    assert level in markdown and "exact token-level sampling" in markdown
    assert stats["acceptance_level"] == {"pcg": "group", "ssd": "tolerance"}[method]


def test_knobs_of_other_methods_are_not_sent(runner):
    # sd takes neither theta nor beta: the widgets' values are ignored, even out-of-range ones
    updates = list(runner("hello there", "sd", False, "slt", 0.0, 0, 5.0, -1.0, "best"))
    assert updates[-1][3]["method"] == "sd" and "acceptance_level" not in updates[-1][3]


@pytest.mark.parametrize("theta, residual, words", [(1.5, "explicit", "theta must be <= 1.0"),
                                                     (0.3, "best", "residual must be one of")])
def test_bad_knob_values_are_one_ui_error(runner, theta, residual, words):
    with pytest.raises(gr.Error, match=words):
        list(runner("hello there", "pcg", False, "slt", 0.8, 0, theta, 0.1, residual))


def test_knob_widgets_follow_the_registry():
    with gr.Blocks():
        widgets = _knob_widgets(gr, "pcg")
    assert list(widgets) == ["theta", "beta", "residual"]
    assert widgets["theta"].visible and not widgets["beta"].visible and widgets["residual"].visible
    assert widgets["theta"].value == 0.5 and widgets["beta"].value == 0.1 and widgets["residual"].value == "explicit"
