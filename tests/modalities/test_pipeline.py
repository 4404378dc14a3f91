"""Every generator builds its requests through the one pipeline (`modalities/pipeline.py: build_pipeline`), which
picks the rule by the registry's key and the request's processing."""

import pytest
import torch
from test_janus import PROMPT, janus  # noqa: F401  (the tiny random Janus fixture)
from tiny_models import save_tiny, save_tiny_image_model, save_tiny_speech_models

from specgen.modalities import pipeline as pipeline_module
from specgen.modalities.image.generator import ImageGenerator
from specgen.modalities.image.janus import JanusImageGenerator
from specgen.modalities.speech.generator import SpeechGenerator
from specgen.modalities.text.generator import TextGenerator
from specgen.samplers.acceptance import TreeRejection, make_rule
from specgen.samplers.processing import Processing
from specgen.samplers.trees import GreedyTreeMatch


@pytest.fixture
def built(monkeypatch):
    """Each pipeline built, as (generator class, method, drafter class, rule class)."""
    calls = []
    original = pipeline_module.build_pipeline

    def spy(generator, method, prompts, **options):
        made = original(generator, method, prompts, **options)
        calls.append((type(generator).__name__, made.method, type(made.drafter).__name__, type(made.rule).__name__))
        return made

    monkeypatch.setattr(pipeline_module, "build_pipeline", spy)
    return calls


def test_text_requests_go_through_the_pipeline(built, tmp_path):
    generator = TextGenerator(str(save_tiny(tmp_path / "target", 0)), str(save_tiny(tmp_path / "draft", 1, layers=1,
                                                                                        hidden=16)))
    generator.generate("abc (x", method="draft", max_new_tokens=8)
    list(generator.stream("abc (x", method="sequoia", max_new_tokens=8))
    list(generator.serve(["abc", "(x"], rows=2, method="ngram", max_new_tokens=4))
    assert built == [("TextGenerator", "draft", "ModelDrafter", "GreedyMatch"),
                     ("TextGenerator", "sequoia", "TreeDrafter", "GreedyTreeMatch"),  # temperature 0: greedy tree
                     ("TextGenerator", "ngram", "PromptLookupDrafter", "GreedyMatch")]


def test_image_requests_go_through_the_pipeline(built, tmp_path):
    generator = ImageGenerator(*save_tiny_image_model(tmp_path, num_codes=16, grid=4))
    result = generator.generate("red K on blue", method="mc-sjd", window=4)
    list(generator.stream("red K on blue", method="ar"))
    assert built == [("ImageGenerator", "mc-sjd", "JacobiDrafter", "ChainRejection"),
                     ("ImageGenerator", "ar", "NoneType", "ChainRejection")]
    assert "changed_per_step" in result.stats  # the drafter's own report reaches the summary
    assert not hasattr(generator, "last_drafter")  # nothing of a request stays on the generator


def test_speech_requests_go_through_the_pipeline(built, tmp_path):
    generator = SpeechGenerator(*save_tiny_speech_models(tmp_path, num_tokens=64))
    generator.generate("hi", method="pcg", max_new_tokens=6, decode=False)
    list(generator.stream("hi", method="ssd", max_new_tokens=6))
    assert built == [("SpeechGenerator", "pcg", "ModelDrafter", "GroupRejection"),
                     ("SpeechGenerator", "ssd", "ModelDrafter", "ToleranceRejection")]


def test_janus_requests_go_through_the_pipeline(built, janus):  # noqa: F811
    generator = JanusImageGenerator(model=janus)
    result = generator.generate(PROMPT, method="sjd", window=4, max_new_tokens=6)
    assert built == [("JanusImageGenerator", "sjd", "JacobiDrafter", "ChainRejection")]
    assert len(result.tokens[0]) == 6 and result.stats["lossless"]


def test_tree_rule_is_greedy_matching_at_temperature_zero():
    assert isinstance(make_rule("tree", Processing(temperature=0.0)), GreedyTreeMatch)
    sampled = make_rule("tree", Processing(temperature=1.0), siblings="deterministic")
    assert isinstance(sampled, TreeRejection) and sampled.siblings == "deterministic"


def test_a_generator_without_the_drafter_says_so():
    class Plain(pipeline_module.Generator):
        modality = "speech"

        def engine(self, capacity):
            return None

    with pytest.raises(Exception, match="unknown drafter"):
        pipeline_module.build_pipeline(Plain(), "sd", [torch.tensor([1])], max_new_tokens=4, sampling={}, params={})


def test_tetris_is_a_knob_of_chain_methods(built, tmp_path):
    """`verify_capacity` wraps the chain drafter in TETRIS: the rows share that many verified drafts per step, and
    greedy samples still equal plain decoding."""
    generator = TextGenerator(str(save_tiny(tmp_path / "target", 0)), str(save_tiny(tmp_path / "draft", 1, layers=1,
                                                                                        hidden=16)))
    plain = generator.generate("abc (x", method="ar", max_new_tokens=12, num_samples=3)
    for method, estimate in (("draft", "confidence"), ("ngram", "history")):
        tetris = generator.generate("abc (x", method=method, max_new_tokens=12, num_samples=3, verify_capacity=4,
                                    capacity_estimate=estimate)
        assert [s["tokens"] for s in tetris.samples] == [s["tokens"] for s in plain.samples]
        assert tetris.stats["drafted"] <= 4 * tetris.stats["steps"]
    assert [call[2] for call in built[1:]] == ["TetrisDrafter", "TetrisDrafter"]


def test_a_request_is_refused_before_any_work(tmp_path, monkeypatch):
    """A bad method, knob or sample count fails before the prompt is encoded or anything is built."""
    generator = ImageGenerator(*save_tiny_image_model(tmp_path, num_codes=16, grid=4))
    monkeypatch.setattr(pipeline_module, "build_pipeline", lambda *a, **k: pytest.fail("the pipeline was built"))
    for options, words in (({"method": "medusa"}, "unknown image method"), ({"method": "mc-sjd", "window": 1}, "window"),
                           ({"method": "ar", "num_samples": 0}, "num_samples")):
        with pytest.raises(Exception, match=words):
            generator.generate("not a known word", **options)  # the prompt is bad too: the request is refused first
