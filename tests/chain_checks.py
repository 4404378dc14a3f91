"""Checks shared by the chain drafters' exactness tests (test_kangaroo.py, test_eagle_text.py, test_poss.py): a
drafter wrapper that records every proposal, the negative-control rule that leaks the draft's law into the output,
the chi-square run of a method on a tiny text generator, and every chain a drafter's law could propose (for the
enumeration oracle)."""

import torch

from tiny_models import HFTable
from specgen.samplers.acceptance import ChainRejection
from specgen.samplers.chisquare import goodness_of_fit
from specgen.samplers.oracle import target_joint
from specgen.samplers.processing import Processing
from specgen.samplers.types import Decisions, Draft


class Recorder:
    """Wraps a drafter; keeps (context, draft) of every proposal."""

    def __init__(self, drafter):
        self.drafter, self.seen = drafter, []

    def propose(self, ctx, budget):
        draft = self.drafter.propose(ctx, budget)
        self.seen.append(([t.tolist() for t in ctx.tokens], draft))
        return draft

    def observe(self, verdict):
        self.drafter.observe(verdict)


class LeakyRule(ChainRejection):
    """Bug: the draft's law stands in for the target's at the drafted slots (every drafted token is committed)."""

    def decision_probs(self, draft, target_probs):
        decided = super().decision_probs(draft, target_probs)
        return Decisions((torch.arange(draft.length) < draft.drafted()[:, None]).double(), decided.emit_probs)

    def __call__(self, draft, target_probs, noise):
        if draft.draft_probs is None:  # nothing drafted (the loop's last step)
            return super().__call__(draft, target_probs, noise)
        leaked = target_probs.clone()
        leaked[:, :draft.length] = draft.dense_draft_probs(target_probs.shape[-1])
        return super().__call__(draft, leaked, noise)


def real_slots(tokens, valid) -> torch.Tensor:
    """[rows, n] bool: a scored window's real slots (`valid` [rows] for a ragged one, None: every slot)."""
    n = tokens.shape[1]
    return torch.arange(n) < (torch.full((tokens.shape[0], 1), n) if valid is None else valid[:, None])


def queued_and_alone(generator, method: str, params: dict | None = None, new_tokens: int = 16):
    """(what each of five prompts got when two batch rows were refilled from a queue as requests finished, as
    `serve` and `batch --rows` do; what each gets from plain decoding alone), by prompt index."""
    prompts = [generator.encode(p) for p in ("abc abc abc (x", "x", "ab (ab ab (ab", "abc", "(x) (x) (x)")]
    pipeline = generator.pipeline(method, prompts[:2], max_new_tokens=new_tokens, params=params or {})
    served: dict[int, list[int]] = {}
    for event in pipeline.run(prompts[:2], queue=iter(list(enumerate(prompts))[2:])):
        served.setdefault(event.sample, []).extend(event.tokens)
    alone = {i: generator.pipeline("ar", [p], max_new_tokens=new_tokens).generate([p]).tokens[0]
             for i, p in enumerate(prompts)}
    return served, alone


def sampled_fit(generator, method: str, params: dict, rule=None, rows: int = 2000):
    """(chi-square fit, stats) of 2,000 samples of 3 tokens after "ab" by `method` at temperature 1 and top-k 4 (few
    cells: a strong test with few samples) against the target's exact joint; `rule` replaces the method's. `rows`:
    samples per batch (each batch its own seed; the stats are the last batch's)."""
    processing = Processing(temperature=1.0, top_k=4)
    samples = []
    for batch in range(2000 // rows):
        pipeline = generator.pipeline(method, [generator.encode("ab")], max_new_tokens=3,
                                      sampling={"temperature": 1.0, "top_k": 4}, params=params)
        if rule is not None:
            pipeline.rule = rule
        result = pipeline.generate([generator.encode("ab")] * rows, seed=11 + batch)
        samples += [tuple(t) for t in result.tokens]
    expected = target_joint(HFTable(generator.model), processing, generator.encode("ab").tolist(), 3)
    return goodness_of_fit(samples, expected), result.stats


def chain_proposals(law, prefix, k):
    """Every chain of k tokens the head could propose after `prefix`, with its probability (law(prefix, drafted))."""
    def grow(tokens, laws, prob):
        if len(tokens) == k:
            yield prob, Draft(torch.tensor([tokens]), torch.stack(laws)[None])
            return
        current = law(tuple(prefix), tuple(tokens))
        for token in current.nonzero().flatten().tolist():
            yield from grow(tokens + [token], laws + [current], prob * float(current[token]))

    yield from grow([], [], 1.0)


def stopped_chain_proposals(law, plain_law, prefix, k, threshold):
    """Every chain the self-draft could propose after `prefix` with its probability: tokens drawn from `law`, the
    chain cut before a token whose plain (temperature 1) law has top-1 probability below `threshold`."""
    def grow(context, tokens, laws, prob):
        stop = len(tokens) == k or (tokens and float(plain_law(context).max()) < threshold)
        if stop:
            padded = tokens + [0] * (k - len(tokens))
            probs = laws + [laws[-1]] * (k - len(laws))
            yield prob, Draft(torch.tensor([padded]), torch.stack(probs)[None], num_drafted=torch.tensor([len(tokens)]))
            return
        current = law(context)
        for token in current.nonzero().flatten().tolist():
            yield from grow(context + [token], tokens + [token], laws + [current], prob * float(current[token]))

    yield from grow(list(prefix), [], [], 1.0)


def memo(fn):
    cache = {}

    def at(context):
        key = tuple(context)
        if key not in cache:
            cache[key] = fn(context)
        return cache[key]

    return at


def save_random_adapter(model, folder, exit_layer: int, seed: int, agreement: float = 0.5, scale: float = 0.05):
    """A Kangaroo adapter at `exit_layer` started from the target's next layer, its weights perturbed (so its law is
    neither the target's nor uniform), saved where the target's adapters are looked up with `agreement` as its
    held-out greedy agreement; returns the loaded adapter."""
    from specgen.modalities.drafters.kangaroo import AdapterConfig, KangarooAdapter, adapter_path
    from specgen.modalities.text.training.distill.windows import model_sha256

    config = AdapterConfig.for_target(model, exit_layer, target_sha256=model_sha256(folder))
    adapter = KangarooAdapter.from_target(model, config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in adapter.parameters():
            p.add_(scale * torch.randn(p.shape, generator=generator))
    path = adapter_path(folder / "kangaroo", exit_layer)
    adapter.save(path, {"heldout": {"greedy_agreement": agreement}})
    return KangarooAdapter.load(path)
