"""early-exit (modalities/text/early_exit.py) on a tiny random Llama: with exits and stops off it is plain decoding
token for token (alone and in a ragged batch); a token that exits at layer ℓ is exit head ℓ's argmax over the
model's own states; the skipped layers' keys and values are the ones computed from the exit state (state copying:
a run without them writes other tokens); a stop ends the completion with the end-of-text token; the method is lossy,
never among auto's candidates, refused without trained modules; a two-step training run exports modules that serve."""

import pytest
import torch

from chain_checks import queued_and_alone
from tiny_models import save_tiny
from specgen.errors import ModelNotFound
from specgen.modalities.pipeline import servable
from specgen.modalities.text import early_exit
from specgen.modalities.text.early_exit import CONTINUE, EXIT, MODULES_FILE, STOP, ExitModules
from specgen.modalities.text.generator import TextGenerator, load_causal_lm
from specgen.modalities.text.training.distill.windows import model_sha256
from specgen.samplers.registry import get_method

PROMPT = "abc abc abc (x"
LAYERS = 3
OFF = {"exit_threshold": 1.0, "stop_threshold": 1.0}
ON = {"exit_threshold": 0.9, "stop_threshold": 0.9}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("early_exit") / "target"
    save_tiny(folder, 0, layers=LAYERS, hidden=32, wide=True)
    model = load_causal_lm(str(folder))
    modules = random_modules(model, folder)
    modules.save(folder / "early_exit" / MODULES_FILE, {"note": "random"})
    return folder, model, modules


@pytest.fixture(scope="module")
def generator(tiny):
    return TextGenerator(str(tiny[0]))


def random_modules(model, folder, seed: int = 0) -> ExitModules:
    torch.manual_seed(seed)
    modules = ExitModules.from_target(model, controller_size=8, target_sha256=model_sha256(folder))
    with torch.no_grad():
        for linear in modules.maps:
            linear.weight.normal_(0, 0.3)
        for controller in modules.controllers:  # laws far from uniform, each token's its own
            controller[0].weight.normal_(0, 1.0)
            controller[-1].weight.normal_(0, 1.0)
    return modules.eval().requires_grad_(False)


def forced(modules: ExitModules, action: int, layer: int) -> ExitModules:
    """A copy whose controllers continue everywhere except `action` (with certainty) after `layer`."""
    import copy

    modules = copy.deepcopy(modules)
    with torch.no_grad():
        for index, controller in enumerate(modules.controllers, start=1):
            out = controller[-1]
            out.weight.zero_()
            out.bias.copy_(torch.full((3,), -30.0))
            out.bias[action if index == layer else CONTINUE] = 30.0
    return modules


@pytest.fixture
def serve_modules(monkeypatch):
    """Serve `modules` instead of the saved file for the requests that follow."""
    def use(modules):
        monkeypatch.setattr(early_exit, "load_modules", lambda path: modules)
    return use


def reference_exit_tokens(model, modules, prompt_ids, layer: int, count: int) -> list[int]:
    """Greedy tokens when every token exits after `layer`, the reference way: the states after the first `layer`
    layers depend only on the layers before it, which every token runs, so transformers' forward over the whole
    context gives them; exit head `layer` over the last one."""
    context = list(prompt_ids)
    for _ in range(count):
        with torch.no_grad():
            states = model.model(input_ids=torch.tensor([context]), output_hidden_states=True).hidden_states
            context.append(int(model.lm_head(modules.exit_hidden(layer, states[layer][0, -1])).argmax()))
    return context[len(prompt_ids):]


def test_with_exits_and_stops_off_it_is_plain_decoding(generator):
    plain = generator.generate(PROMPT, method="ar", max_new_tokens=24)
    run = generator.generate(PROMPT, method="early-exit", max_new_tokens=24, **OFF)
    assert run.tokens == plain.tokens and len(run.tokens) == 24
    summary = run.stats["early_exit"]
    assert summary["mean_layers"] == LAYERS and summary["stops"] == 0 and summary["layers_skipped"] == 0
    assert run.stats["lossless"] is False


def test_ragged_batch_rows_decode_as_alone(generator):
    prompts = ["abc abc abc (x", "x"]
    pipeline, encoded = generator._request(prompts[0], "early-exit", 1, 12, None, dict(OFF))
    alone = [generator.generate(p, method="ar", max_new_tokens=12).tokens for p in prompts]
    batch = pipeline.generate([generator.encode(p) for p in prompts])
    assert batch.tokens == alone


def test_queued_rows_get_what_each_gets_alone_with_exits_and_stops(generator):
    """Continuous batching (serve, batch --rows): rows exiting at different layers beside each other, refilled from a
    queue; each request's tokens are the ones it gets alone (a decided row's later layers come from its own state)."""
    params = {"exit_threshold": 0.8, "stop_threshold": 0.99999, "decision_layers": ""}
    served, _ = queued_and_alone(generator, "early-exit", params)
    prompts = ["abc abc abc (x", "x", "ab (ab ab (ab", "abc", "(x) (x) (x)"]
    alone = [generator.generate(p, method="early-exit", max_new_tokens=16, **params) for p in prompts]
    assert served == {i: run.tokens for i, run in enumerate(alone)}
    exits = {layer for run in alone for layer in run.stats["early_exit"]["exits_by_layer"]}
    assert exits == {"1", "2", str(LAYERS)}  # rows at different depths
    assert sum(run.stats["early_exit"]["stops"] for run in alone) >= 1


@pytest.mark.parametrize("layer", [1, 2])
def test_an_exit_gives_the_exit_heads_token_over_the_models_states(generator, tiny, serve_modules, layer):
    folder, model, modules = tiny
    serve_modules(forced(modules, EXIT, layer))
    run = generator.generate(PROMPT, method="early-exit", max_new_tokens=10, **ON)
    assert run.tokens == reference_exit_tokens(model, modules, generator.encode(PROMPT).tolist(), layer, 10)
    assert run.stats["early_exit"]["exits_by_layer"] == {str(layer): 10}
    assert run.stats["early_exit"]["layers_skipped"] == LAYERS - layer


def test_skipped_layers_keep_keys_and_values_copied_from_the_exit_state(generator, tiny, serve_modules):
    folder, model, modules = tiny
    serve_modules(forced(modules, EXIT, 1))
    pipeline, prompts = generator._request(PROMPT, "early-exit", 1, 1, None, dict(ON))
    pipeline.generate(prompts)
    target = pipeline.target
    slot = len(prompts[0]) - 1  # the pending prompt token, decoded by the one step (exit after layer 1)
    with torch.no_grad():
        h1 = model.model(input_ids=prompts[0][None], output_hidden_states=True).hidden_states[1]  # [1, t, d]
        position = torch.tensor([[slot]])
        cos, sin = model.model.rotary_emb(h1, position)
        for index in range(1, LAYERS):
            attn = model.model.layers[index].self_attn
            x = model.model.layers[index].input_layernorm(h1[:, slot:slot + 1])
            keys = attn.k_proj(x).view(1, 1, -1, attn.head_dim).transpose(1, 2)
            values = attn.v_proj(x).view(1, 1, -1, attn.head_dim).transpose(1, 2)
            rotated = keys * cos[:, None] + torch.cat([-keys[..., attn.head_dim // 2:],
                                                       keys[..., :attn.head_dim // 2]], -1) * sin[:, None]
            cached_keys = target.cache.keys[index][:1, :, slot:slot + 1]
            torch.testing.assert_close(cached_keys, rotated, atol=1e-5, rtol=1e-4)
            torch.testing.assert_close(target.cache.values[index][:1, :, slot:slot + 1], values, atol=1e-5, rtol=1e-4)


def test_without_state_copying_later_tokens_change(generator, tiny, serve_modules, monkeypatch):
    """Negative control: the first token exits after layer 1, the next ones run every layer; dropping the copied
    keys and values of the skipped layers (leaving the slot empty) changes the full-depth tokens' logits."""
    folder, model, modules = tiny
    serve_modules(forced(modules, EXIT, 1))

    def run() -> list[torch.Tensor]:
        steps = []
        decode, logits = early_exit.EarlyExitTarget._decode, early_exit.EarlyExitTarget._logits

        def first_exits(self, *args):
            self.exit_threshold = 0.9 if not steps else 1.0
            return decode(self, *args)

        def kept(self, *args):
            steps.append(logits(self, *args))
            return steps[-1]

        with monkeypatch.context() as patch:
            patch.setattr(early_exit.EarlyExitTarget, "_decode", first_exits)
            patch.setattr(early_exit.EarlyExitTarget, "_logits", kept)
            generator.generate(PROMPT, method="early-exit", max_new_tokens=4, **ON)
        return steps

    copied = run()
    assert run()[1].equal(copied[1])  # the same run again: the same bits
    monkeypatch.setattr(early_exit.EarlyExitTarget, "_copy_states", lambda self, *args: None)
    assert (run()[1] - copied[1]).abs().max() > 1e-3


def test_a_stop_ends_the_completion_with_end_of_text(generator, tiny, serve_modules):
    serve_modules(forced(tiny[2], STOP, LAYERS))
    run = generator.generate(PROMPT, method="early-exit", max_new_tokens=10, **ON)
    assert run.tokens == [generator.tokenizer.eos_token_id] and run.text == ""
    assert run.stats["early_exit"]["stops"] == 1 and run.stats["early_exit"]["tokens"] == 0


def test_lossy_never_an_auto_candidate_and_refused_without_modules(tmp_path, generator):
    from specgen.modalities.auto import candidate_names

    spec = get_method("text", "early-exit")
    assert not spec.lossless and spec.target == "early-exit"
    assert "early-exit" not in candidate_names(generator, {})
    bare = tmp_path / "bare"
    save_tiny(bare, 1, layers=2)
    other = TextGenerator(str(bare))
    assert not servable(other, spec)
    with pytest.raises(ModelNotFound, match="train adapter --method early-exit"):
        other.generate(PROMPT, method="early-exit", max_new_tokens=4)


def test_two_training_steps_export_modules_that_serve_and_resume(tmp_path, tiny):
    from specgen.modalities.text.training.early_exit import EarlyExitConfig, train_early_exit

    folder = tiny[0]
    cfg = EarlyExitConfig(run_dir=str(tmp_path / "run"), out=str(tmp_path / "export"), target=str(folder), steps=2,
                          batch_size=32, windows=4, window=16, eval_windows=2, controller_size=8, max_files=2,
                          cache_dir=str(tmp_path / "cache"), warmup=1)
    summary = train_early_exit(cfg, say=lambda text: None)
    assert summary["steps"] == 2 and summary["calibration"]["exits"][0]["positions"] == 2 * 15
    assert "stop precision" in (tmp_path / "export" / "README.md").read_text()
    again = train_early_exit(cfg, say=lambda text: None)  # the finished checkpoint: nothing left to do
    assert again["steps"] == 2 and again["resumed_from"] == [2]
    modules = ExitModules.load(tmp_path / "export" / MODULES_FILE)
    assert modules.config.layers == LAYERS and modules.config.target_sha256 == model_sha256(folder)


def test_decision_layers_auto_reads_the_held_out_replay_and_bad_lists_are_refused():
    from specgen.errors import InvalidRequest
    from specgen.modalities.text.early_exit import decision_layers

    record = {"calibration": {"exits": [
        {"exit_threshold": 0.4, "exit_share": {"1": 0.12, "2": 0.05, "3": 0.03, "6": 0.8}},
        {"exit_threshold": 0.9, "exit_share": {"1": 0.01, "6": 0.99}}]}}
    assert decision_layers("auto", record, 0.45, 6) == (1, 2)  # 0.03 x 3 layers skipped < 0.1
    assert decision_layers("auto", record, 0.8, 6) == ()  # the nearest replay: exits there never pay
    assert decision_layers("auto", {}, 0.4, 6) is None  # no replay: every layer
    assert decision_layers("", record, 0.4, 6) is None and decision_layers("3, 1", record, 0.4, 6) == (1, 3)
    for bad in ("0", "7", "one"):
        with pytest.raises(InvalidRequest, match="decision_layers"):
            decision_layers(bad, record, 0.4, 6)
