"""Draft distillation: divergences against dense references, the compact teacher, AdaSPEC's filter, reduced
vocabularies (exact decoding with them), and the trainer's learning and exact resume."""

import json

import numpy as np
import pytest
import torch

from specgen.modalities.text.training.distill.divergences import (adaspec_keep, draft_buckets, teacher_top_k,
                                                         token_divergence)
from specgen.modalities.text.training.distill.teacher import frequent_vocab, restrict, shrink_vocab
from tests.tiny_models import save_tiny_pair


def _laws(seed=0, n=6, vocab=11):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, vocab, generator=g, dtype=torch.float64) * 2, torch.randn(n, vocab, generator=g,
                                                                                 dtype=torch.float64) * 2


def _dense(kind, target_logits, draft_logits, beta=0.5):
    p, q = target_logits.softmax(-1), draft_logits.softmax(-1)
    kl = lambda a, b: (a * (a.log() - b.log())).sum(-1)  # noqa: E731
    m = beta * p + (1 - beta) * q
    return {"fkl": kl(p, q), "rkl": kl(q, p), "jsd": beta * kl(p, m) + (1 - beta) * kl(q, m),
            "tvd": 0.5 * (p - q).abs().sum(-1)}[kind]


@pytest.mark.parametrize("kind", ["fkl", "rkl", "jsd", "tvd"])
def test_divergences_match_dense_formulas_when_k_covers_the_vocabulary(kind):
    target_logits, draft_logits = _laws()
    teacher = teacher_top_k(target_logits, k=11)
    assert torch.isinf(teacher.tail_logp).all()
    got = token_divergence(kind, teacher.buckets(), draft_buckets(draft_logits, teacher), beta=0.3)
    torch.testing.assert_close(got.double(), _dense(kind, target_logits, draft_logits, beta=0.3), rtol=1e-4, atol=1e-5)
    same = token_divergence(kind, teacher.buckets(), draft_buckets(target_logits, teacher))
    assert same.abs().max() < 1e-5


@pytest.mark.parametrize("kind", ["fkl", "rkl", "jsd", "tvd"])
def test_top_k_buckets_never_overstate_a_divergence(kind):
    """Merging tokens into a tail bucket can only lose information (data processing), with an exact tail mass."""
    target_logits, draft_logits = _laws(seed=3, n=32, vocab=50)
    teacher = teacher_top_k(target_logits, k=5)
    tail = torch.log1p(-teacher.top_logp.exp().sum(-1).double())
    torch.testing.assert_close(teacher.tail_logp.double(), tail, rtol=1e-4, atol=1e-5)
    bucketed = token_divergence(kind, teacher.buckets(), draft_buckets(draft_logits, teacher))
    assert (bucketed.double() <= _dense(kind, target_logits, draft_logits) + 1e-5).all()
    assert (bucketed > 0).all()


def test_divergence_gradients_are_finite_and_only_reach_the_draft():
    target_logits, draft_logits = _laws(seed=5, n=4, vocab=20)
    draft_logits = draft_logits.float().requires_grad_()
    target_logits = target_logits.float().requires_grad_()
    teacher = teacher_top_k(target_logits, k=4)
    for kind in ("fkl", "rkl", "jsd", "tvd"):
        draft_logits.grad = None
        token_divergence(kind, teacher.buckets(), draft_buckets(draft_logits, teacher)).sum().backward()
        assert torch.isfinite(draft_logits.grad).all() and draft_logits.grad.abs().sum() > 0
    assert target_logits.grad is None
    with pytest.raises(ValueError, match="unknown divergence"):
        token_divergence("kl", teacher.buckets(), teacher.buckets())


def test_adaspec_keeps_the_tokens_where_the_draft_trails_the_reference_most():
    draft = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 0.5, 0.1, 9.0, 1.0, 1.0])
    reference = torch.tensor([1.0, 0.0, 3.0, 0.0, 5.0, 0.5, 0.1, 8.0, 0.0, 1.0])  # gaps 0 2 0 4 0 0 0 1 1 0
    keep = adaspec_keep(draft, reference, 0.4)
    assert keep.tolist() == [False, True, False, True, False, False, False, True, True, False]
    assert adaspec_keep(draft, reference, 1.0).all()
    with pytest.raises(ValueError):
        adaspec_keep(draft, reference, 0.0)


def test_restricted_teacher_is_renormalised_and_reports_its_coverage():
    target_logits = _laws(seed=7, n=3, vocab=9)[0].float()
    vocab_ids = torch.tensor([0, 4, 5, 8])
    inside, log_coverage = restrict(target_logits, vocab_ids, temperature=0.7)
    probs = (target_logits / 0.7).softmax(-1)
    torch.testing.assert_close(log_coverage.exp(), probs[:, vocab_ids].sum(-1))
    torch.testing.assert_close((inside / 0.7).softmax(-1), probs[:, vocab_ids] / probs[:, vocab_ids].sum(-1, True))


def test_frequent_vocab_puts_specials_first_then_frequency_then_id():
    tokens = np.array([7, 7, 7, 5, 5, 9, 9, 3, 1, 1, 1, 1])
    assert frequent_vocab([tokens], 5, always=(0, 1)).tolist() == [0, 1, 7, 5, 9]
    with pytest.raises(ValueError):
        frequent_vocab([tokens], 2, always=(0, 1))


def test_shrunk_draft_scores_its_vocabulary_exactly_as_before(tmp_path):
    from transformers import AutoModelForCausalLM

    _, draft_path = save_tiny_pair(tmp_path)
    full = AutoModelForCausalLM.from_pretrained(draft_path, dtype=torch.float64).eval()
    vocab_ids = torch.tensor([0, 1, 2, 5, 9, 11, 20])
    small = shrink_vocab(AutoModelForCausalLM.from_pretrained(draft_path, dtype=torch.float64).eval(), vocab_ids)
    to_draft = torch.full((full.config.vocab_size,), len(vocab_ids))
    to_draft[vocab_ids] = torch.arange(len(vocab_ids))
    inputs = vocab_ids[torch.tensor([[0, 3, 4, 5, 6, 3]])]
    with torch.no_grad():
        torch.testing.assert_close(small(input_ids=to_draft[inputs]).logits[..., :-1], full(input_ids=inputs).logits[..., vocab_ids])
    assert small.config.vocab_size == len(vocab_ids) + 1


def test_restricted_top_k_cache_is_exact_when_k_covers_the_vocabulary_and_bounded_otherwise():
    """restrict_cache on a full-vocabulary top-k teacher: with k = vocabulary it equals the exactly restricted
    teacher; with a smaller k the kept entries never exceed their exact restricted probability."""
    from specgen.modalities.text.training.distill.teacher import TeacherCache, restrict_cache

    target_logits = _laws(seed=11, n=8, vocab=30)[0].float()
    vocab_ids = torch.tensor([0, 3, 4, 7, 10, 12, 19, 25, 29])
    exact_inside, log_coverage = restrict(target_logits, vocab_ids)
    exact = exact_inside.log_softmax(-1)  # [8, 9] the target renormalised on the vocabulary
    for k in (30, 6):
        full = teacher_top_k(target_logits, k)
        cache = TeacherCache(full.top_ids.numpy()[None].astype(np.int32), full.top_logp.numpy()[None].astype(np.float16),
                             full.tail_logp.numpy()[None], np.ones((1, 8), np.float32))
        small = restrict_cache(cache, vocab_ids)
        ids, logp = torch.from_numpy(small.top_ids[0].astype(np.int64)), torch.from_numpy(small.top_logp[0]).float()
        kept = torch.isfinite(logp)
        assert (torch.isin(full.top_ids, vocab_ids) == kept).all()  # exactly the in-vocabulary entries survive
        got, want = logp[kept], exact.gather(-1, ids)[kept]
        if k == 30:
            torch.testing.assert_close(got, want, atol=2e-3, rtol=2e-3)  # float16 storage
            torch.testing.assert_close(torch.from_numpy(small.coverage[0]), log_coverage.exp(), atol=2e-3, rtol=0)
            assert np.isinf(small.tail_logp).all()
        else:
            assert (got <= want + 1e-2).all() and (got < want - 5e-2).any()  # the tail counted in: an upper bound
            assert (torch.from_numpy(small.coverage[0]) <= log_coverage.exp() + 1e-3).all()


def test_teacher_kept_while_sampling_equals_a_scoring_pass(tmp_path):
    """Greedy samples with the teacher captured from the sampling logits: the same tokens as plain sampling and
    the same top-k law a separate teacher-forced pass over the samples gives."""
    from transformers import AutoModelForCausalLM

    from specgen.modalities.text.training.distill.windows import Windows, sample_continuations, target_windows
    from specgen.modalities.text.training.distill.teacher import score_windows

    target_path, _ = save_tiny_pair(tmp_path)
    model = AutoModelForCausalLM.from_pretrained(target_path, dtype=torch.float64).eval()
    prompts = Windows(torch.randint(3, model.config.vocab_size, (5, 6), generator=torch.Generator().manual_seed(0)).numpy(), 6)
    windows, teacher = target_windows(model, prompts, 7, 0.0, seed=0, folder=tmp_path / "s", chunk=2, teacher_k=5)
    plain = sample_continuations(model, torch.from_numpy(prompts.tokens), 7, 0.0, seed=0)
    assert np.array_equal(windows.tokens, plain.numpy())
    scored = score_windows(model, windows.tokens, 5)
    cont = slice(5, None)  # the positions that predict continuation tokens
    assert np.array_equal(teacher.top_ids[:, cont], scored.top_ids[:, cont].astype(np.int32))
    np.testing.assert_allclose(teacher.top_logp[:, cont].astype(np.float32), scored.top_logp[:, cont].astype(np.float32),
                               atol=2e-3)
    np.testing.assert_allclose(teacher.tail_logp[:, cont], scored.tail_logp[:, cont], atol=1e-5)
    record = json.loads((tmp_path / "s" / "samples.json").read_text())
    assert record["windows"] == 5 and record["generated_tokens"] == 35 and record["tokens_per_s"] > 0
    again, _ = target_windows(model, prompts, 7, 0.0, seed=0, folder=tmp_path / "s", chunk=2, teacher_k=5)
    assert np.array_equal(again.tokens, windows.tokens)  # read back from the chunks


# ---- the trainer on a tiny random pair over a few corpus files ---------------------------------------------------

def _config(tmp_path, out, **overrides):
    from specgen.modalities.text.training.distill.distiller import DistillConfig

    target, draft = save_tiny_pair(tmp_path / "models", wide=True) if not (tmp_path / "models").exists() else (
        str(tmp_path / "models" / "target"), str(tmp_path / "models" / "draft"))
    settings = dict(out=str(out), target=target, init=draft, steps=4, batch_size=4, prompt_len=8, new_tokens=16,
                    windows=12, top_k=8, max_files=3, eval_windows=6, cache_dir=str(tmp_path / "cache"), lr=3e-3,
                    warmup=1)
    return DistillConfig(**{**settings, **overrides})


def _weights(run):
    from safetensors.torch import load_file

    return load_file(str(run / "export" / "model.safetensors"))


@pytest.mark.parametrize("data", ["mix", "target"])
def test_interrupted_run_resumes_to_the_same_weights(tmp_path, data):
    from specgen.modalities.text.training.distill.distiller import train_draft

    quiet = lambda text: None  # noqa: E731
    whole = train_draft(_config(tmp_path, tmp_path / "whole", data=data), say=quiet)
    assert train_draft(_config(tmp_path, tmp_path / "cut", data=data), stop_after=2, say=quiet) == {"stopped_at": 2}
    resumed = train_draft(_config(tmp_path, tmp_path / "cut", data=data), say=quiet)
    assert resumed["resumed_from_steps"] == [2] and resumed["steps"] == whole["steps"] == 4
    a, b = _weights(tmp_path / "whole"), _weights(tmp_path / "cut")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    with pytest.raises(Exception, match="different settings"):
        train_draft(_config(tmp_path, tmp_path / "cut", data=data, loss="rkl"), say=quiet)


def test_distillation_raises_heldout_acceptance(tmp_path):
    """A learning test that can fail: the held-out α of the distilled draft beats its starting point."""
    from specgen.modalities.text.training.distill.distiller import train_draft

    quiet = lambda text: None  # noqa: E731
    summary = train_draft(_config(tmp_path, tmp_path / "fkl", steps=40, lr=1e-2), say=quiet)
    before, after = summary["heldout_before"]["alpha"], summary["heldout"]["alpha"]
    assert after > before + 0.05, (before, after)


def test_adaspec_trains_on_the_selected_fraction(tmp_path):
    from specgen.modalities.text.training.distill.distiller import train_draft

    quiet = lambda text: None  # noqa: E731
    train_draft(_config(tmp_path, tmp_path / "ref", steps=3), say=quiet)
    train_draft(_config(tmp_path, tmp_path / "ada", steps=3, adaspec=0.4, reference=str(tmp_path / "ref" / "export")),
                say=quiet)
    kept = [json.loads(line)["kept"] for line in (tmp_path / "ada" / "metrics.jsonl").read_text().splitlines()]
    assert len(kept) == 3 and all(0.35 <= k <= 0.5 for k in kept)


def test_reduced_vocabulary_draft_decodes_exactly(tmp_path):
    """A draft over the most frequent tokens, mapped into target ids: greedy speculative output equals plain
    decoding, and it never proposes a token outside its vocabulary."""
    from specgen.modalities.text.training.distill.distiller import train_draft
    from specgen.modalities.text.generator import TextGenerator

    cfg = _config(tmp_path, tmp_path / "small", vocab_size=12, steps=3)
    summary = train_draft(cfg, say=lambda text: None)
    export = tmp_path / "small" / "export"
    vocab_ids = json.loads((export / "vocab_ids.json").read_text())
    assert len(vocab_ids) == 12 and vocab_ids[:2] == [0, 1]
    assert 0 < summary["coverage"]["heldout"] < 1 and summary["heldout"]["alpha"] <= summary["coverage"]["heldout"] + 1e-6
    assert "Reduced vocabulary: 12 tokens" in (export / "README.md").read_text()
    gen = TextGenerator(cfg.target, str(export))
    plain = gen.generate("def f(x):", method="ar", max_new_tokens=24).tokens
    for event in gen.stream("def f(x):", method="draft", max_new_tokens=24, num_draft_tokens=3):
        pass
    spec = gen.generate("def f(x):", method="draft", max_new_tokens=24, num_draft_tokens=3)
    assert spec.tokens == plain and spec.stats["drafted"] > 0
    sampled = gen.generate("def f(x):", method="draft", max_new_tokens=24, temperature=1.0, seed=3)
    assert len(sampled.tokens) == 24


def test_greedy_samples_train_a_reduced_draft_and_resume_exactly(tmp_path):
    """--sample-temperature 0: greedy target samples, the teacher kept while sampling and restricted to a reduced
    vocabulary counted in the corpus and the samples, held-out greedy samples; an interrupted run ends on the
    same weights."""
    from specgen.modalities.text.training.distill.distiller import prepare_samples, train_draft

    quiet = lambda text: None  # noqa: E731
    settings = dict(sample_temperature=0.0, vocab_size=14, vocab_from="corpus+samples", steps=4, init="scratch:64x1")
    record = prepare_samples(_config(tmp_path, tmp_path / "unused", **settings), say=quiet)
    assert record["windows"] == 12 and record["temperature"] == 0.0 and "--samples-only" in record["command"]
    whole = train_draft(_config(tmp_path, tmp_path / "whole", **settings), say=quiet)
    assert whole["steps"] == 4 and 0 < whole["coverage"]["train"] <= 1 and 0 < whole["heldout"]["alpha"] < 1
    assert "--sample-temperature 0.0" in whole["command"] and "--vocab-from corpus+samples" in whole["command"]
    vocab = json.loads((tmp_path / "whole" / "export" / "vocab_ids.json").read_text())
    assert len(vocab) == len(set(vocab)) == 14
    train_draft(_config(tmp_path, tmp_path / "cut", **settings), stop_after=2, say=quiet)
    train_draft(_config(tmp_path, tmp_path / "cut", **settings), say=quiet)
    a, b = _weights(tmp_path / "whole"), _weights(tmp_path / "cut")
    assert all(torch.equal(a[k], b[k]) for k in a)
    more = train_draft(_config(tmp_path, tmp_path / "more", **{**settings, "init": str(tmp_path / "whole" / "export")}),
                       say=quiet)  # a reduced draft trains on from where it ended
    assert more["heldout_before"]["alpha"] == pytest.approx(whole["heldout"]["alpha"], abs=1e-3)  # fp16 export
    with pytest.raises(Exception, match="another reduced vocabulary"):
        train_draft(_config(tmp_path, tmp_path / "other", **{**settings, "vocab_size": 13,
                                                              "init": str(tmp_path / "whole" / "export")}), say=quiet)
    with pytest.raises(Exception, match="use --data target"):
        train_draft(_config(tmp_path, tmp_path / "bad", sample_temperature=0.0, data="corpus"), say=quiet)
    with pytest.raises(Exception, match="multiple of 64"):
        train_draft(_config(tmp_path, tmp_path / "bad", init="scratch:100x2"), say=quiet)


def test_a_scratch_draft_starts_from_the_targets_embedding_geometry(tmp_path):
    """embed_from_target: the draft's embedding rows are the target's, centred and projected, so their pairwise
    inner products follow the target's (up to the dropped directions and one scale)."""
    from transformers import AutoModelForCausalLM

    from specgen.modalities.text.training.distill.distiller import embed_from_target
    from specgen.modalities.text.models import build_model, draft_shape
    from specgen.modalities.text.generator import load_tokenizer

    target_path, _ = save_tiny_pair(tmp_path)
    target = AutoModelForCausalLM.from_pretrained(target_path).eval()
    draft = build_model("draft", load_tokenizer(target_path), **draft_shape(64, 1))
    vocab_ids = torch.arange(34)  # more tokens than the target has directions (32)
    shrink_vocab(draft, vocab_ids)
    embed_from_target(draft, target, vocab_ids)
    rows = target.get_input_embeddings().weight[vocab_ids].detach()
    rows = rows - rows.mean(0)
    got = draft.get_input_embeddings().weight.detach()[:len(vocab_ids), :rows.shape[1]]
    gram, want = got @ got.T, rows @ rows.T  # the target is 32 wide: all of its directions are kept
    torch.testing.assert_close(gram / gram.abs().max(), want / want.abs().max(), atol=1e-4, rtol=0)
    assert draft.get_input_embeddings().weight[-1, :32].abs().max() == 0  # <unk> at the centre


def test_cli_two_steps_then_resumes_and_rejects_bad_settings(tmp_path, capsys):
    from specgen.app.cli import main

    cfg = _config(tmp_path, tmp_path / "cli")
    base = ["train", "draft", "--target", cfg.target, "--init", cfg.init, "--out", cfg.out, "--max-files", "3",
            "--windows", "8", "--batch-size", "2", "--prompt-len", "8", "--new-tokens", "8", "--top-k", "4",
            "--eval-windows", "4", "--cache-dir", cfg.cache_dir]
    assert main([*base, "--steps", "2"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["steps"] == 2 and 0 < summary["heldout"]["alpha"] < 1
    assert (tmp_path / "cli" / "export" / "model.safetensors").exists()
    assert main([*base, "--steps", "2"]) == 0  # finished: resumes at its end and re-exports
    capsys.readouterr()
    assert main([*base, "--steps", "2", "--adaspec", "0.4"]) == 2
    assert capsys.readouterr().err.strip().startswith("error: AdaSPEC needs")


def test_pruned_self_draft_trains_from_the_target_less_a_block(tmp_path):
    from safetensors.torch import load_file

    from specgen.modalities.text.training.distill.distiller import train_draft

    cfg = _config(tmp_path, tmp_path / "pruned", init="prune:1", loss="ce", steps=2)
    summary = train_draft(cfg, say=lambda text: None)
    assert summary["prune"]["block"] == 1 and len(summary["prune"]["distances"]) == 2
    weights = load_file(str(tmp_path / "pruned" / "export" / "model.safetensors"))
    target = load_file(str(tmp_path / "models" / "target" / "model.safetensors"))
    kept = summary["prune"]["start"] ^ 1  # the tiny target has 2 layers; the other one stays, as layer 0
    name = "model.layers.{}.mlp.down_proj.weight"
    assert name.format(1) not in weights
    assert not torch.equal(weights[name.format(0)].float(), target[name.format(kept)].float())  # it trained
    assert "Pruned from the target" in (tmp_path / "pruned" / "export" / "README.md").read_text()
    forced = train_draft(_config(tmp_path, tmp_path / "forced", init="prune:1@0", loss="ce", steps=1),
                         say=lambda text: None)
    assert forced["prune"]["start"] == 0 and forced["prune"]["forced"]


def test_batch_online_draft_updates_the_draft_and_keeps_outputs_exact(tmp_path):
    """`specgen batch --online-draft I`: the draft learns every I text items; greedy outputs equal a frozen run's."""
    from specgen.app.batch import run_batch

    target, draft = save_tiny_pair(tmp_path / "models", wide=True)
    items = tmp_path / "in.jsonl"
    items.write_text("".join(json.dumps({"id": f"p{i}", "modality": "text", "prompt": p,
                                         "params": {"max_new_tokens": 12}}) + "\n"
                             for i, p in enumerate(["def f(x):", "x = (y)", "if a:", "for k in z:"])))
    frozen = run_batch(items, tmp_path / "frozen.jsonl", model=target, draft=draft, progress=False)
    online = run_batch(items, tmp_path / "online.jsonl", model=target, draft=draft, progress=False, online_draft=2)
    assert frozen["ok"] == online["ok"] == 4
    read = lambda name: [json.loads(line) for line in (tmp_path / name).read_text().splitlines()]  # noqa: E731
    assert [r["result"]["tokens"] for r in read("frozen.jsonl")] == [r["result"]["tokens"] for r in read("online.jsonl")]
    assert [r["stats"]["online_updates"] for r in read("online.jsonl")] == [0, 1, 1, 2]
    with pytest.raises(Exception, match="--engine local"):
        run_batch(items, tmp_path / "ray.jsonl", model=target, draft=draft, engine="ray", online_draft=2)


def test_demo_text_runs_feed_online_learning(tmp_path):
    """`specgen demo --online-draft I`: each Text-tab run with a draft feeds the learner; the panel and header say so."""
    import gradio as gr

    from specgen.app.ui.header import header_markdown
    from specgen.app.ui.text import TextModels, stream_text
    from specgen.modalities.text.generator import TextGenerator
    from specgen.samplers import registry

    target, draft = save_tiny_pair(tmp_path / "models", wide=True)
    models = TextModels(model=target, draft=draft, online_draft=1)
    assert "learning online" in header_markdown(models)
    gen = models.get()
    assert isinstance(gen, TextGenerator) and gen.online is not None and gen.online.interval == 1
    spec = registry.get_method("text", "draft")
    options = dict(temperature=0.0, top_p=1.0, seed=0, max_new_tokens=12)
    *_, last = stream_text(gr, gen, "def f(x):", "draft", spec, False, spec.resolve_knobs({}), options)
    assert last[3]["online_updates"] == 1 and "online draft updates so far" in last[1]
    *_, plain = stream_text(gr, gen, "def f(x):", "ar", registry.get_method("text", "ar"), False, {}, options)
    assert "online_updates" not in plain[3] and gen.online.updates == 1


def test_caches_are_keyed_by_the_target_weights(tmp_path):
    from specgen.modalities.text.training.distill.windows import model_sha256

    target, draft = save_tiny_pair(tmp_path / "models")
    assert model_sha256(target) == model_sha256(target) != model_sha256(draft)


class _MisreportedLaw:
    """Negative control: a drafter that reports a uniform law over its vocabulary instead of the law it drew from."""

    def __init__(self, inner):
        self.inner = inner

    def propose(self, ctx, budget):
        import dataclasses

        draft = self.inner.propose(ctx, budget)
        return dataclasses.replace(draft, draft_probs=torch.full_like(draft.draft_probs, 1 / draft.draft_probs.shape[-1]))

    def observe(self, verdict):
        self.inner.observe(verdict)


@pytest.mark.slow
def test_reduced_vocabulary_draft_samples_the_target_and_a_misreported_law_is_caught():
    """Chi-square of 3-token continuations of a tiny random Llama (vocabulary 6) drafted by a shrunk draft over 3 of
    its tokens, against the target's exact joint, alone and with lookup-filled slots (draft-lookup); the same
    drafters reporting a wrong law must fail the test."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from specgen.modalities.drafters.model import ModelDrafter
    from specgen.modalities.text.ngram import LookupSlots
    from specgen.modalities.runtime.transformers_adapter import TransformersTarget
    from specgen.samplers.acceptance import ChainRejection
    from specgen.samplers.chisquare import goodness_of_fit
    from specgen.samplers.loop import generate
    from specgen.samplers.oracle import target_joint
    from specgen.samplers.length_policies import FixedLength
    from specgen.samplers.processing import Processing

    def tiny(seed, layers, hidden):
        torch.manual_seed(seed)
        config = LlamaConfig(vocab_size=6, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                             initializer_range=0.2)
        return LlamaForCausalLM(config).double().eval()

    class Scored:  # target_joint scores any logits(context)
        def __init__(self, model):
            self.model = model

        def logits(self, context):
            with torch.no_grad():
                return self.model(input_ids=torch.tensor([context])).logits[0, -1]

    target, vocab_ids = tiny(7, 2, 32), torch.tensor([0, 2, 3])
    draft = shrink_vocab(tiny(8, 1, 16), vocab_ids)
    processing, prompt, samples = Processing(temperature=1.0), [1, 2], 3000
    expected = target_joint(Scored(target), processing, prompt, 3)

    def fit(wrap):
        drafter = wrap(ModelDrafter(draft, processing, target_vocab_size=6, vocab_ids=vocab_ids, unknown_id=3))
        result = generate(TransformersTarget(target), drafter, ChainRejection(), [torch.tensor(prompt)] * samples,
                          processing=processing, max_new_tokens=3, policy=FixedLength(3), seed=11)
        assert result.stats["accepted"] > 0
        return goodness_of_fit([tuple(t) for t in result.tokens], expected)

    exact = fit(lambda d: d)
    assert exact.p_value > 1e-4, exact
    control = fit(_MisreportedLaw)
    assert control.p_value < 1e-6, control

    # draft-lookup: the same draft with slots copied from repeated n-grams of the prompt and the draft so far
    prompt = [1, 2, 1, 2]
    expected = target_joint(Scored(target), processing, prompt, 3)

    def fit_lookup(wrap):
        inner = ModelDrafter(draft, processing, target_vocab_size=6, vocab_ids=vocab_ids, unknown_id=3,
                             lookup=LookupSlots(2, 1))
        result = generate(TransformersTarget(target), wrap(inner), ChainRejection(), [torch.tensor(prompt)] * samples,
                          processing=processing, max_new_tokens=3, policy=FixedLength(3), seed=13)
        assert result.stats["accepted"] > 0 and inner.looked_up > 0
        return goodness_of_fit([tuple(t) for t in result.tokens], expected)

    exact = fit_lookup(lambda d: d)
    assert exact.p_value > 1e-4, exact
    assert fit_lookup(_MisreportedLaw).p_value < 1e-6


def test_draft_lookup_defers_the_forwards_of_looked_up_slots(tmp_path):
    """draft-lookup feeds looked-up tokens to the draft only when a later slot needs the draft's law: on a
    repetitive prompt it runs fewer draft forwards than drafted slots, ragged rows included, and greedy output
    still equals plain decoding (the sampled law is checked by the chi-square test above)."""
    from specgen.modalities.drafters.model import ModelDrafter
    from specgen.modalities.text.generator import TextGenerator
    from specgen.modalities.text.ngram import LookupSlots
    from specgen.modalities.runtime.transformers_adapter import TransformersTarget
    from specgen.samplers.acceptance import ChainRejection
    from specgen.samplers.loop import generate
    from specgen.samplers.length_policies import FixedLength
    from specgen.samplers.processing import Processing

    target_path, draft_path = save_tiny_pair(tmp_path)
    gen = TextGenerator(target_path, draft_path)
    prompts = [gen.encode("a b a b a b a b a b"), gen.encode("def f(x): return x"), gen.encode("x = 1\nx = 1\nx =")]
    processing = Processing(temperature=0.0)
    plain = generate(TransformersTarget(gen.model), None, ChainRejection(), prompts, processing=processing,
                     max_new_tokens=20, seed=0)
    drafter = ModelDrafter(gen.draft_model, processing, target_vocab_size=gen.model.config.vocab_size,
                           lookup=LookupSlots(3, 1))
    spec = generate(TransformersTarget(gen.model), drafter, ChainRejection(), prompts, processing=processing,
                    max_new_tokens=20, policy=FixedLength(4), seed=0)
    assert spec.tokens == plain.tokens and spec.stats["drafted"] > 0
    # without deferral every step runs 4 draft forwards (the catch-up and one per further slot)
    assert drafter.looked_up > 0 and drafter.forward_calls < spec.stats["steps"] * 4


def test_draft_lookup_runs_no_draft_forward_when_lookup_fills_every_slot(tmp_path):
    """A proposal that lookup fills throughout leaves the committed tokens the draft has not seen to the next
    proposal that needs the draft: on a repeating prompt some proposals run no draft forward at all, others feed
    that backlog, and greedy output still equals plain decoding (the sampled law: the chi-square test above)."""
    from specgen.modalities.drafters.model import ModelDrafter
    from specgen.modalities.text.generator import TextGenerator
    from specgen.modalities.text.ngram import LookupSlots
    from specgen.modalities.runtime.transformers_adapter import TransformersTarget
    from specgen.samplers.acceptance import ChainRejection
    from specgen.samplers.loop import generate
    from specgen.samplers.length_policies import FixedLength
    from specgen.samplers.processing import Processing

    target_path, draft_path = save_tiny_pair(tmp_path)
    gen = TextGenerator(target_path, draft_path)
    prompts = [gen.encode("a b c a b c a b c a b c a b"), gen.encode("x = 1\nx = 1\nx =")]
    processing = Processing(temperature=0.0)

    class Counted(ModelDrafter):
        per_proposal: list[int] = []

        def propose(self, ctx, budget):
            before = self.forward_calls
            draft = super().propose(ctx, budget)
            self.per_proposal.append(self.forward_calls - before)
            return draft

    for batch in (prompts[:1], prompts):
        drafter = Counted(gen.draft_model, processing, target_vocab_size=gen.model.config.vocab_size,
                          lookup=LookupSlots(3, 1))
        drafter.per_proposal = []
        spec = generate(TransformersTarget(gen.model), drafter, ChainRejection(), batch, processing=processing,
                        max_new_tokens=24, policy=FixedLength(3), seed=0)
        plain = generate(TransformersTarget(gen.model), None, ChainRejection(), batch, processing=processing,
                         max_new_tokens=24, seed=0)
        assert spec.tokens == plain.tokens
        assert 0 in drafter.per_proposal and max(drafter.per_proposal) > 0, drafter.per_proposal
