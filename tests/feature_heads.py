"""Helpers shared by the feature drafters' tests (test_eagle_text.py, test_poss.py, test_mtp.py, test_head_tree.py,
test_falcon.py): a head fitted for a few seconds to a tiny target's features, the draft's law computed the reference
way, the largest gap between a run's reported draft laws and that reference, the exact-enumeration oracle over the
head's chains, and the checks every such drafter passes against plain decoding (greedy equality alone, in samples
and in ragged batches; the chi-square fit of sampled output, which a leaking rule fails)."""

import torch

from chain_checks import LeakyRule, Recorder, chain_proposals, sampled_fit
from tiny_models import HFTable
from specgen.modalities.drafters.eagle import TextEagleHead, load_head, output_layer
from specgen.samplers.oracle import exact_output, max_abs_diff, target_joint
from specgen.samplers.processing import Processing

PROMPT = "abc abc abc (x"


def fitted_head(model, folder, vocab_ids=None, seed=3, steps=100, mtp=False, kinds=None, falcon=False):
    """A head fitted for a few seconds to the target's features on random text (so drafts are often accepted and
    the sampled test exercises acceptance), saved where the target's heads are looked up; `mtp`: a FastMTP module
    (its input norms started away from 1, so a drafter that drops them drafts another law) saved in folder/mtp
    with per-kind vocabularies `kinds`; `falcon`: a Falcon head (blocks of 2 under the block mask, pair t predicting
    f_{t+1}) saved in folder/falcon."""
    from specgen.modalities.drafters.falcon import FalconHead, block_visible, load_falcon
    from specgen.modalities.drafters.mtp import MtpHead, load_mtp

    torch.manual_seed(seed)
    kind = MtpHead if mtp else FalconHead if falcon else TextEagleHead
    head = kind.for_target(model, intermediate_size=48, heads=4, kv_heads=1)
    if mtp:
        with torch.no_grad():
            head.embed_norm.weight.uniform_(0.3, 2.0)
            head.feature_norm.weight.uniform_(0.3, 2.0)
    ids = torch.randint(2, model.config.vocab_size, (128, 16))
    with torch.no_grad():
        features = model.model(input_ids=ids).last_hidden_state
    output = model.lm_head  # a served Gemma's is int8 rows
    weight = output.dequantized() if hasattr(output, "dequantized") else output.weight.detach()
    rows = lambda x: torch.nn.functional.linear(x, weight)  # noqa: E731 - float rows: the law term has a gradient
    optimizer = torch.optim.Adam(head.parameters(), lr=3e-3)
    for step in range(steps):
        pick = torch.randint(0, len(ids), (32,))
        wanted = features[pick, 1:]  # pair t = (x_t, f_{t-1}) predicts f_t
        positions = torch.arange(1, 16).expand(32, -1)
        pairs = model.model.embed_tokens(ids[pick, 1:]), features[pick, :-1], positions
        if falcon:  # pair t predicts f_{t+1}, its block of 2 visible
            wanted, predicted = features[pick, 2:], head(*pairs, 1, block_visible(15, 2, step % 2))[:, :14]
        else:
            predicted = head(*pairs)
        law = torch.softmax(rows(wanted), -1)
        cross_entropy = -(law * rows(predicted).log_softmax(-1)).sum(-1).mean()
        loss = torch.nn.functional.smooth_l1_loss(predicted, wanted) + cross_entropy
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    record = {"target": str(folder), "after": {"alpha": 0.5}}
    if mtp:
        head.save(folder / "mtp", str(folder), vocab_ids, record, kinds)
        return load_mtp(folder / "mtp")[:2]
    if falcon:
        head.save(folder / "falcon", str(folder), vocab_ids, record)
        return load_falcon(folder / "falcon")
    head.save(folder / "eagle", str(folder), vocab_ids, record)
    return load_head(folder / "eagle")


class HeadLaw:
    """The draft's logits computed the reference way: the target's features from one transformers forward over the
    committed context, then the head module over the pairs (x_t, f_{t-1}), t >= 1, as in training; deeper drafted
    tokens on the head's own outputs, drafted token k by the head's layer for depth k (PosS's specialist k - 1;
    an EAGLE head has one layer), each run afresh over the whole pair sequence."""

    def __init__(self, model, head, vocab_ids=None):
        self.model, self.head, self.vocab_ids = model, head, vocab_ids

    @torch.no_grad()
    def logits(self, context, drafted=()):
        ids = torch.tensor([list(context)])
        features = self.model.model(input_ids=ids).last_hidden_state[0].float()  # [L, d]
        previous, tokens, out = features[:-1], list(context), None  # f_{t-1} for the pairs t = 1..L-1
        for depth, token in enumerate((None, *drafted), 1):
            if token is not None:  # a drafted token's pair reads the last level's output
                tokens.append(token)
                previous = torch.cat([previous, out[None]])
            embed = self.model.model.embed_tokens(torch.tensor([tokens[1:]])).float()
            hidden = self.head(embed, previous[None], torch.arange(1, len(tokens))[None], depth)[0]
            out = hidden[-1]
        rows = output_layer(self.model, self.vocab_ids)
        return rows(out[None])[0].double()


class FalconLaw:
    """A Falcon head's draft logits computed the reference way: the target's features from one transformers forward
    over the context, then the head module over the whole pair sequence — the true pairs (x_t, f_{t-1}), then each
    drafted block's pairs on the outputs that gave their laws — under a mask where the last `block` true pairs form
    one block and each drafted block another (`relaxed` False: plain causal, the mask a drafter forgetting the blocks
    would use). Drafted token n's law: block n // k's output n % k (zero, a uniform law, for a context with fewer
    true pairs than a block)."""

    def __init__(self, model, head, vocab_ids=None, relaxed=True):
        self.model, self.head, self.vocab_ids, self.relaxed = model, head, vocab_ids, relaxed

    @torch.no_grad()
    def logits(self, context, drafted=()):
        k, context, drafted = self.head.block, list(context), list(drafted)
        features = self.model.model(input_ids=torch.tensor([context])).last_hidden_state[0].float()  # [L, d]
        pairs = len(context) - 1
        tokens, previous = context[1:], features[:-1]  # pair t = (x_t, f_{t-1}), t = 1..L-1
        blocks = [-1] * max(pairs - k, 0) + [0] * min(k, pairs)  # block ids; -1: a pair of its own (causal)
        out = torch.zeros(k, features.shape[1]) if pairs < k else None
        for b in range(len(drafted) // k + 1):
            if b > 0:  # block b's pairs: the tokens block b - 1 drafted, on its outputs
                tokens, previous = tokens + drafted[(b - 1) * k:b * k], torch.cat([previous, out])
                blocks += [b] * k
            if b > 0 or pairs >= k:
                embed = self.model.model.embed_tokens(torch.tensor([tokens])).float()
                ids = torch.tensor(blocks)
                order = torch.where(ids < 0, torch.arange(len(blocks)) - len(blocks), ids)  # singletons: causal
                visible = order[None, :] <= order[:, None] if self.relaxed else torch.ones(
                    len(blocks), len(blocks), dtype=torch.bool).tril()
                hidden = self.head(embed, previous[None], torch.arange(1, len(tokens) + 1)[None], 1, visible)[0]
                out = hidden[-k:]
        rows = output_layer(self.model, self.vocab_ids)
        return rows(out[len(drafted) % k][None])[0].double()


def law_errors(generator, model, head, stale=False, method="eagle", draft_tokens=3, reference=None, **options):
    """Largest gap between every reported draft law of a two-row run of `method` and `head`'s law at that context
    (`reference`: the law's computation, default `HeadLaw`)."""
    pipeline = generator.pipeline(method, [generator.encode(PROMPT)], max_new_tokens=20,
                                  params={"num_draft_tokens": draft_tokens}, sampling=options)
    if stale:  # bug: verification's features are never stored (the head reads what the prefill left)
        engine = pipeline.drafter.target
        engine.commit = lambda kept, rows: engine.cache.__setattr__("rows", rows) or engine.cache.commit(kept)
    recorder = Recorder(pipeline.drafter)
    pipeline.drafter = recorder
    list(pipeline.run([generator.encode(PROMPT), generator.encode("ab (")]))
    reference, worst = reference or HeadLaw(model, head), 0.0
    for contexts, draft in recorder.seen:
        for row, context in enumerate(contexts):
            for slot in range(draft.length):
                law = pipeline.processing(reference.logits(context, draft.tokens[row, :slot].tolist()))
                worst = max(worst, float((draft.draft_probs[row, slot].double() - law).abs().max()))
    return worst


def enumeration_gap(model, head, rule, chain: int, prompt=(0, 2, 3), new_tokens: int = 3, reference=None) -> float:
    """Largest gap between the output law of `rule` over every `chain`-token chain `head` can propose (its
    reference law, temperature 1, top-k 2) and the target's exact joint of `new_tokens` tokens after `prompt`."""
    processing = Processing(temperature=1.0, top_k=2)
    reference, cache = reference or HeadLaw(model, head), {}

    def law(prefix, drafted):
        if (prefix, drafted) not in cache:
            cache[prefix, drafted] = processing(reference.logits(prefix, drafted))
        return cache[prefix, drafted]

    target = HFTable(model)
    out = exact_output(target, processing, rule, lambda prefix: chain_proposals(law, prefix, chain), prompt,
                       new_tokens)
    return max_abs_diff(out, target_joint(target, processing, prompt, new_tokens))


def assert_greedy_is_plain(generator, method: str, params: dict, accepted: bool = False) -> None:
    """Greedy `method` at `params` reproduces plain decoding token for token, alone and as two samples (and, with
    `accepted`, accepts some drafted token on the way)."""
    plain = generator.generate(PROMPT, method="ar", max_new_tokens=40)
    spec = generator.generate(PROMPT, method=method, max_new_tokens=40, **params)
    assert spec.tokens == plain.tokens and spec.stats["lossless"]
    assert spec.stats["accepted"] > 0 or not accepted
    batch = generator.generate(PROMPT, method=method, max_new_tokens=40, num_samples=2, **params)
    assert all(s["tokens"] == plain.tokens for s in batch.samples)


def assert_ragged_is_alone(generator, method: str, params: dict | None = None) -> None:
    """Ragged prompts batched together (one of a single token: no pair) decode as each does alone."""
    prompts = [generator.encode(p) for p in (PROMPT, "x", "ab (ab")] + [torch.tensor([3])]
    alone = [generator.pipeline("ar", [p], max_new_tokens=24).generate([p]).tokens[0] for p in prompts]
    together = generator.pipeline(method, prompts, max_new_tokens=24, params=params or {}).generate(prompts)
    assert together.tokens == alone and together.stats["accepted"] > 0


def assert_sampling_law(generator, method: str, params: dict, exact: bool = True) -> None:
    """Sampled output fits the target's joint (chi-square) and drafts pay (tau > 1.05); with `exact` False the
    method's rule is replaced by one that lets the draft's law leak into the output, which must fail the fit."""
    fit, stats = sampled_fit(generator, method, params, None if exact else LeakyRule())
    if exact:
        assert fit.p_value > 1e-4 and stats["tau"] > 1.05, (fit, stats["tau"])
    else:
        assert fit.p_value < 1e-6, fit
