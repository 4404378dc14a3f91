"""Exact enumeration of a draft-verify process on TableLMs: the first layer of the exactness tests and of
`specgen selfcheck`.

The output distribution over the first `horizon` generated tokens is computed by enumerating every proposal
the drafter could make (with the probability it is made), every outcome of the rule's `decision_probs`, and
recursing on the committed prefix. A lossless rule must reproduce the target's joint distribution exactly.
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict

import torch

from specgen.samplers.types import Draft, DraftTree


def target_joint(lm, processing, prompt, horizon) -> dict[tuple, float]:
    """The target's exact joint distribution of the next `horizon` tokens; `lm` is anything with
    `logits(context) -> [vocab]`. Each prefix is scored once and only prefixes of positive probability grow."""
    joint: dict[tuple, float] = {(): 1.0}
    for _ in range(horizon):
        grown = {}
        for prefix, prob in joint.items():
            law = processing(lm.logits(list(prompt) + list(prefix)))
            for token in (law > 0).nonzero().flatten().tolist():
                grown[prefix + (token,)] = prob * float(law[token])
        joint = grown
    return joint


def max_abs_diff(a: dict, b: dict) -> float:
    return max(abs(a.get(key, 0.0) - b.get(key, 0.0)) for key in set(a) | set(b))


def chain_proposals(law, prefix, k, *, point_mass=False, reported_law=None):
    """Every chain of k draft tokens with its probability. law(context) -> [vocab] is the law the drafter
    samples from; reported_law (default: law) is what the Draft claims, to build stale-distribution controls."""
    reported_law = reported_law or law
    if point_mass:
        tokens, context = [], list(prefix)
        for _ in range(k):
            tokens.append(int(law(context).argmax()))
            context.append(tokens[-1])
        yield 1.0, Draft(torch.tensor([tokens]))
        return
    vocab = len(law(prefix))
    for seq in itertools.product(range(vocab), repeat=k):
        prob, context, reported = 1.0, list(prefix), []
        for token in seq:
            prob *= float(law(context)[token])
            reported.append(reported_law(context))
            context.append(token)
        if prob > 0:
            yield prob, Draft(torch.tensor([seq]), torch.stack(reported)[None])


def _child_sets(law_at_node, width, siblings):
    """Ordered children of one node with their probability under the sibling sampling mode."""
    law = law_at_node.double()
    if siblings == "deterministic":
        yield 1.0, law.sort(descending=True, stable=True).indices[:width].tolist()
        return
    vocab = len(law)
    if siblings == "with_replacement":
        for seq in itertools.product(range(vocab), repeat=width):
            prob = float(torch.prod(law[list(seq)]))
            if prob > 0:
                yield prob, list(seq)
        return
    support = (law > 0).nonzero().flatten().tolist()
    phantoms = [t for t in range(vocab) if t not in support][:max(0, width - len(support))]
    for seq in itertools.permutations(support, min(width, len(support))):
        prob, used = 1.0, 0.0
        for token in seq:
            prob *= float(law[token]) / (1.0 - used)
            used += float(law[token])
        if prob > 0:  # past the support, a drafter pads with zero-probability children
            yield prob, list(seq) + phantoms


def tree_proposals(law, prefix, branching, siblings):
    """Every fixed-shape tree (node 0 = prefix[-1]) with its probability."""

    def expand(nodes, frontier, level, prob):
        if level == len(branching):
            tokens = torch.tensor([[n[0] for n in nodes]])
            parents = torch.tensor([[n[1] for n in nodes]])
            probs = None if siblings == "deterministic" else torch.stack([law(n[2]) for n in nodes])[None]
            yield prob, DraftTree(tokens, parents, probs)
            return
        # choose children for every frontier node (the product over frontier nodes)
        options = [list(_child_sets(law(nodes[node][2]), branching[level], siblings)) for node in frontier]
        for combo in itertools.product(*options):
            new_nodes, new_frontier, p = list(nodes), [], prob
            for node, (child_prob, kids) in zip(frontier, combo):
                p *= child_prob
                for token in kids:
                    new_nodes.append((token, node, nodes[node][2] + [token]))
                    new_frontier.append(len(new_nodes) - 1)
            yield from expand(new_nodes, new_frontier, level + 1, p)

    yield from expand([(prefix[-1], -1, list(prefix))], [0], 0, 1.0)


def target_probs_for(proposal, lm, processing, prefix) -> torch.Tensor:
    if isinstance(proposal, DraftTree):
        contexts = []
        for node in range(proposal.num_nodes):
            path = proposal.ancestor_mask[0, node].nonzero().flatten().tolist()[1:]  # skip the root
            contexts.append(list(prefix) + proposal.tokens[0, path].tolist())
    else:
        draft = proposal.tokens[0].tolist()
        contexts = [list(prefix) + draft[:j] for j in range(len(draft) + 1)]
    return torch.stack([processing(lm.logits(c)) for c in contexts])[None]


def outcomes(proposal, decisions):
    """(probability, emitted law, committed-before-emission tokens) for every way the walk can stop."""
    accept, emit = decisions.accept_probs[0], decisions.emit_probs[0]
    if isinstance(proposal, DraftTree):
        children = proposal.children[0]

        def walk(node, prob, tokens):
            for kid in children[node]:
                yield from walk(kid, prob * float(accept[kid]), tokens + [int(proposal.tokens[0, kid])])
                prob *= 1.0 - float(accept[kid])
            yield prob, emit[node], tokens

        yield from walk(0, 1.0, [])
        return
    draft = proposal.tokens[0].tolist()
    drafted = int(proposal.drafted()[0])
    prob = 1.0
    for j in range(drafted + 1):
        stop = 1.0 - float(accept[j]) if j < drafted else 1.0
        yield prob * stop, emit[j], draft[:j]
        if j < drafted:
            prob *= float(accept[j])


def exact_output(lm, processing, rule, proposals, prompt, horizon) -> dict[tuple, float]:
    """Distribution over the first `horizon` generated tokens; proposals(prefix) yields (prob, proposal)."""
    memo: dict = {}

    def dist(prefix: tuple, need: int) -> dict[tuple, float]:
        if need <= 0:
            return {(): 1.0}
        if (prefix, need) in memo:
            return memo[(prefix, need)]
        out: dict[tuple, float] = defaultdict(float)
        for proposal_prob, proposal in proposals(prefix):
            decisions = rule.decision_probs(proposal, target_probs_for(proposal, lm, processing, prefix))
            for stop_prob, law, accepted in outcomes(proposal, decisions):
                if proposal_prob * stop_prob == 0:
                    continue
                for token in (law > 0).nonzero().flatten().tolist():
                    committed = tuple(accepted + [token])[:need]
                    weight = proposal_prob * stop_prob * float(law[token])
                    for tail, tail_prob in dist(prefix + committed, need - len(committed)).items():
                        out[committed + tail] += weight * tail_prob
        memo[(prefix, need)] = dict(out)
        return memo[(prefix, need)]

    return dist(tuple(prompt), horizon)


def jacobi_output(lm, processing, prompt, horizon, *, window: int, coupling: str, init_law=None, init="random",
                  stored_law=None, noise_keyed_by: str = "position") -> dict[tuple, float]:
    """Exact output distribution of Jacobi decoding (samplers.jacobi), enumerated over the process's states
    (committed prefix, uncommitted drafts with their laws and, for the Gumbel coupling, what the drafts drawn so far
    reveal of each position's noise).
    stored_law(old_law, target_law, kept) -> the law a re-draft is stored with (default: the target law, as
    the drafter does); negative controls pass a stale one. init_law: [vocab] law of random initial drafts.

    The Gumbel coupling draws argmax(log law + g) with one noise vector g per absolute position, shared by every
    step, so a position's earlier drafts condition its later ones. With two tokens the draw depends on g only
    through d = g_1 - g_0, which is logistic: token 1 wins iff d > log law_0 - log law_1. The state then keeps an
    interval for each uncommitted position's d, and every draw splits it with exact logistic masses; larger
    vocabularies would need the Gumbel mass of polyhedra, so the Gumbel coupling is enumerated for two tokens.
    noise_keyed_by="slot" (a negative control) keys the noise by the slot's index in the window instead, so after
    a commit a slot reuses noise that an earlier draw at another position has already conditioned.
    One function on purpose: its nested helpers share the memo and the laws of one enumeration, and the whole state
    machine reads in one place, next to the drafter it checks."""
    from specgen.kernels import reference

    stored_law = stored_law or (lambda old, new, kept: new)
    vocab = len(processing(lm.logits(list(prompt))))
    if coupling == "gumbel" and vocab != 2:
        raise ValueError("the Gumbel coupling is enumerated for a two-token vocabulary only")
    init_law = torch.full((vocab,), 1.0 / vocab, dtype=torch.float64) if init_law is None else init_law.double()
    memo: dict = {}

    def law_at(context):
        return processing(lm.logits(list(context))).double()

    def fills(prefix, drafts, k):
        """Every way to fill the window to k drafts: (probability, [(token, law)])."""
        if len(drafts) >= k:
            yield 1.0, list(drafts[:k])
            return
        token = drafts[-1][0] if drafts else prefix[-1]
        if init == "left" and 0 <= token < vocab and init_law[token] > 0:  # else drawn like "random"
            yield from fills(prefix, list(drafts) + [(token, torch.zeros(vocab, dtype=torch.float64).index_fill_(0, torch.tensor(token), 1.0))], k)
            return
        for token in (init_law > 0).nonzero().flatten().tolist():
            for prob, full in fills(prefix, list(drafts) + [(token, init_law)], k):
                yield float(init_law[token]) * prob, full

    def redrafts(slot_laws, olds, positions, noise):
        """Every joint re-draft of the kept slots: (probability, ((token, stored law), ...), noise after). Each
        slot's choice is (probability, token, stored law, (position, noise interval) for Gumbel draws or None)."""
        options = []
        for target_law, old, position in zip(slot_laws, olds, positions):
            choices = []
            if coupling == "gumbel":
                for prob, token, interval in _gumbel_draws(target_law, noise.get(position, (-math.inf, math.inf))):
                    kept = old is not None and old[0] == token
                    choices.append((prob, token, stored_law(old[1], target_law, True) if kept else target_law,
                                    (position, interval)))
            elif coupling == "maximal" and old is not None:
                token, law = old
                keep = float(reference.accept_probability(target_law[token], law[token]))
                if keep > 0:
                    choices.append((keep, token, stored_law(law, target_law, True), None))
                residual = reference.residual_probs(target_law, law)
                for t in (residual > 0).nonzero().flatten().tolist():
                    if keep < 1:
                        choices.append(((1 - keep) * float(residual[t]), t, stored_law(law, target_law, False),
                                        None))
            else:
                for t in (target_law > 0).nonzero().flatten().tolist():
                    choices.append((float(target_law[t]), t, target_law, None))
            options.append(choices)
        for combo in itertools.product(*options):
            prob = 1.0
            for p, _, _, _ in combo:
                prob *= p
            after = dict(noise)
            after.update(drawn for _, _, _, drawn in combo if drawn is not None)
            yield prob, tuple((token, law) for _, token, law, _ in combo), after

    def dist(prefix: tuple, drafts: tuple, need: int, noise: dict | None = None) -> dict[tuple, float]:
        if need <= 0:
            return {(): 1.0}
        noise = dict(noise or {})
        if noise_keyed_by == "position":  # the noise of committed positions is never read again
            noise = {position: interval for position, interval in noise.items() if position >= len(prefix)}
        key = (prefix, tuple((t, law.numpy().tobytes()) for t, law in drafts), need, tuple(sorted(noise.items())))
        if key in memo:
            return memo[key]
        out: dict[tuple, float] = defaultdict(float)
        k = min(window - 1, need - 1)
        for fill_prob, full in fills(prefix, drafts, k):
            tokens = [t for t, _ in full]
            target = [law_at(prefix + tuple(tokens[:m])) for m in range(k + 1)]  # slot m: law after m drafts
            reach = fill_prob
            for stop in range(k + 1):  # the first `stop` drafts accepted, then a token emitted at slot `stop`
                if stop < k:
                    accept = float(reference.accept_probability(target[stop][tokens[stop]], full[stop][1][tokens[stop]]))
                    weight, emit_law = reach * (1 - accept), reference.residual_probs(target[stop], full[stop][1])
                else:
                    accept, weight, emit_law = 0.0, reach, target[k]
                if weight > 0:
                    kept_slots = range(stop + 1, k + 1)
                    olds = [full[m] if m < k else None for m in kept_slots]
                    for token in (emit_law > 0).nonzero().flatten().tolist():
                        committed = (tuple(tokens[:stop]) + (token,))[:need]
                        positions = ([len(prefix) + m for m in kept_slots] if noise_keyed_by == "position"
                                     else [m - stop - 1 for m in kept_slots])  # the slot in the next window
                        for draft_prob, next_drafts, after in redrafts([target[m] for m in kept_slots], olds,
                                                                       positions, noise):
                            w = weight * float(emit_law[token]) * draft_prob
                            for tail, tail_prob in dist(prefix + committed, next_drafts, need - len(committed),
                                                        after).items():
                                out[committed + tail] += w * tail_prob
                reach *= accept
        memo[key] = dict(out)
        return memo[key]

    return dist(tuple(prompt), (), horizon)


def _gumbel_draws(law: torch.Tensor, interval: tuple[float, float]):
    """The Gumbel draw argmax(log law + g) over two tokens given d = g_1 - g_0 in `interval`: every outcome as
    (probability, token, the interval of d that gives it)."""
    low, high = interval
    threshold = math.log(float(law[0])) - math.log(float(law[1])) if float(law[0]) * float(law[1]) > 0 else (
        math.inf if float(law[1]) == 0 else -math.inf)  # token 1 wins iff d > threshold
    total = _logistic_mass(low, high)
    for token, part in ((0, (low, min(high, threshold))), (1, (max(low, threshold), high))):
        mass = _logistic_mass(*part) if part[0] < part[1] else 0.0
        if mass > 0:
            yield mass / total, token, part


def _logistic_mass(low: float, high: float) -> float:
    """P(low < d < high) for a standard logistic d (the difference of two Gumbel variates), computed on the side
    of zero that keeps the subtraction accurate."""
    sigmoid = lambda x: 0.0 if x == -math.inf else 1.0 if x == math.inf else 1.0 / (1.0 + math.exp(-x))  # noqa: E731
    if low >= 0:
        return sigmoid(-low) - sigmoid(-high)
    return sigmoid(high) - sigmoid(low)


def exact_group_output(lm, processing, rule, proposals, prompt, horizon) -> dict[tuple, float]:
    """Joint distribution of (tokens, groups) over the first `horizon` generated tokens under a rule that tags
    each committed token with a group (`group_decision_probs`, e.g. PCG): keys are (tokens, groups) tuple pairs.
    The groups never change what comes next (the model sees tokens), so recursion is on the token prefix."""
    memo: dict = {}

    def walks(accept, emit, drafted):
        """(probability, accepted groups, law of (group, token) emitted at the stop) for every way to stop."""
        partial = [(1.0, ())]  # ways to accept the first j drafts, with their groups
        for j in range(drafted + 1):
            if j == drafted:  # every drafted token accepted: the bonus slot
                for prob, groups in partial:
                    yield prob, groups, emit[j]
                return
            stop = 1.0 - float(accept[j].sum())
            for prob, groups in partial:
                yield prob * stop, groups, emit[j]
            partial = [(prob * float(accept[j, g]), groups + (g,)) for prob, groups in partial
                       for g in (accept[j] > 0).nonzero().flatten().tolist()]

    def dist(prefix: tuple, need: int) -> dict[tuple, float]:
        if need <= 0:
            return {((), ()): 1.0}
        if (prefix, need) in memo:
            return memo[(prefix, need)]
        out: dict[tuple, float] = defaultdict(float)
        for proposal_prob, proposal in proposals(prefix):
            decisions = rule.group_decision_probs(proposal, target_probs_for(proposal, lm, processing, prefix))
            accept, emit = decisions.owner_accept[0], decisions.emit_joint[0]
            draft = proposal.tokens[0].tolist()
            for stop_prob, groups, law in walks(accept, emit, int(proposal.drafted()[0])):
                if proposal_prob * stop_prob == 0:
                    continue
                for group, token in (law > 0).nonzero().tolist():
                    tokens = tuple(draft[:len(groups)] + [token])[:need]
                    tags = (groups + (group,))[:need]
                    weight = proposal_prob * stop_prob * float(law[group, token])
                    for (tail, tail_groups), tail_prob in dist(prefix + tokens, need - len(tokens)).items():
                        out[(tokens + tail, tags + tail_groups)] += weight * tail_prob
        memo[(prefix, need)] = dict(out)
        return memo[(prefix, need)]

    return dist(tuple(prompt), horizon)


def group_marginals(joint: dict[tuple, float], horizon: int) -> dict[tuple, dict[int, float]]:
    """From `exact_group_output`: for every token prefix of length h < horizon with positive probability, the law
    of the group committed at position h given that prefix ({prefix: {group: probability}})."""
    mass: dict[tuple, float] = defaultdict(float)
    tagged: dict[tuple, dict[int, float]] = defaultdict(lambda: defaultdict(float))
    for (tokens, groups), prob in joint.items():
        for h in range(horizon):
            mass[tokens[:h]] += prob
            tagged[tokens[:h]][groups[h]] += prob
    return {prefix: {g: p / mass[prefix] for g, p in laws.items()}
            for prefix, laws in tagged.items() if mass[prefix] > 0}
