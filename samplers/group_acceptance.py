"""Relaxed chain acceptance rules for speech tokens: lossy at token level by design, each with the bound it keeps.

`GroupRejection` (PCG, Yanuka et al. 2025, arXiv 2511.13732) runs rejection sampling on the group variable of
`TokenGroups`: per drafted token t it picks an owner group k of t uniformly at random (the law w[., t]) and
accepts with min(1, P_c(k) / Q_c(k)), where P_c = W target_probs and Q_c = W draft_probs. At the first rejection
it draws the recovered group k' from norm((P_c - Q_c)+) and the recovered token from the target restricted to k'
(weights target(u) w[k', u]); after a fully accepted chain the bonus token comes from the target and is tagged
with a uniformly chosen owner. The committed *group* of every slot is then distributed as P_c given the committed
prefix, exactly; the committed *token* is not distributed as the target (an accepted token stands in for its
group). Its distance to the target is at most sum_k min(P_c, Q_c)(k) * TV(target | k, draft | k), the accepted
group mass times the within-group disagreement.

`ToleranceRejection` (SSD, Lin et al. 2025, arXiv 2505.15380) accepts drafted token t if u < min(1, p/q) + beta
and recovers from norm((p - q)+) (the target when that is empty). Tokens the target rules out (probability 0:
position constraints, top-k/top-p) are never accepted, so constraints still hold. Each emitted token's law is
within total variation min(beta, TV(p, q)) of the target's.

Both rules report, per row, how many drafted tokens exact token-level sampling would have accepted with the
same drafts and uniforms (`Verdict.exact_accepted`), so runs show what the relaxation gained.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

from specgen import kernels
from specgen.errors import InvalidRequest
from specgen.samplers.acceptance import ChainRejection
from specgen.samplers.groups import TokenGroups
from specgen.samplers.noise import Purpose
from specgen.samplers.types import AcceptanceNoise, Decisions, Draft, Verdict

RESIDUALS = ("explicit", "thinning")


@dataclass(frozen=True)
class GroupDecisions:
    """What a group rule realises, at group level (the exact group enumeration reads these).

    owner_accept[b, i, g] = P(drafted token i is tested in group g and accepted | the tokens before it accepted);
    emit_joint[b, j, g, u] = P(the token emitted when the walk stops at slot j is u, tagged with group g)."""

    owner_accept: torch.Tensor  # [batch, k, groups] float64
    emit_joint: torch.Tensor  # [batch, k + 1, groups, vocab] float64

    def token_level(self) -> Decisions:
        return Decisions(self.owner_accept.sum(-1), self.emit_joint.sum(-2))


class GroupRejection:
    """PCG: rejection sampling on overlapping token groups (module docstring). residual="explicit" draws the
    recovered group from W target - W draft over every group; "thinning" draws (token ~ target, owner ~ uniform)
    pairs and keeps one with probability (1 - Q_c/P_c)+, up to `thinning_rounds` rounds drawn at once, and falls
    back to the explicit residual when no round kept (both give the residual law exactly)."""

    lossless = False  # exact in groups, not in tokens
    name = "group"

    def __init__(self, groups: TokenGroups, residual: str = "explicit", thinning_rounds: int = 16):
        if residual not in RESIDUALS:
            raise InvalidRequest(f"unknown residual {residual!r}; choose from: {', '.join(RESIDUALS)}")
        if not 1 <= int(thinning_rounds) <= 1024:
            raise InvalidRequest(f"thinning_rounds must be between 1 and 1024, got {thinning_rounds}")
        self.groups, self.residual, self.thinning_rounds = groups, residual, int(thinning_rounds)

    def _check_vocabulary(self, target_probs: torch.Tensor) -> None:
        if target_probs.shape[-1] != self.groups.vocab_size:
            raise InvalidRequest(f"the token groups cover {self.groups.vocab_size} tokens but the target has "
                                 f"{target_probs.shape[-1]}")

    # ---- the owner group a drafted token is tested in. It must be drawn from w[., t], independently of the laws:
    # ---- choosing a 'best' group breaks exactness (the tests' negative control overrides these two methods).

    def choose_owner(self, tokens: torch.Tensor, uniform: torch.Tensor, target_probs: torch.Tensor,
                     draft_probs: torch.Tensor) -> torch.Tensor:
        """tokens [batch, k], uniform [batch, k] -> owner group ids [batch, k]."""
        return self.groups.pick_owner(tokens, uniform)

    def owner_law(self, tokens: torch.Tensor, target_probs: torch.Tensor, draft_probs: torch.Tensor) -> torch.Tensor:
        """The law `choose_owner` draws from: tokens [batch, k] -> [batch, k, groups] float64."""
        return self.groups.dense_weights.T[tokens]

    # ---- exact decisions (small vocabularies: dense over groups x vocabulary)

    def group_decision_probs(self, draft: Draft, target_probs: torch.Tensor) -> GroupDecisions:
        self._check_vocabulary(target_probs)
        k = draft.length
        within = torch.arange(k) < draft.drafted()[:, None]  # [batch, k]
        tokens = draft.tokens.clamp(min=0)
        draft_probs = ChainRejection._draft_probs(draft, target_probs).double()  # [batch, k, vocab]
        target_coarse = self.groups.coarse(target_probs)  # [batch, k + 1, groups]
        draft_coarse = self.groups.coarse(draft_probs)  # [batch, k, groups]
        group_accept = kernels.accept_probability(target_coarse[:, :k], draft_coarse)
        owner_accept = self.owner_law(tokens, target_probs[:, :k], draft_probs) * group_accept * within[..., None]
        # emitting token u in group g: target(u) w[g, u] (the bonus: u ~ target, g a uniform owner of u), and after a
        # rejection residual(g) * target(u) w[g, u] / P_c(g) (the target restricted to the residual group)
        joint = target_probs.double()[..., None, :] * self.groups.dense_weights  # [batch, k + 1, groups, vocab]
        coarse = target_coarse[:, :k, :, None]
        inside_group = torch.where(coarse > 0, joint[:, :k] / torch.where(coarse > 0, coarse, 1.0), 0.0)
        recovered = kernels.residual_probs(target_coarse[:, :k], draft_coarse)[..., None] * inside_group
        emit = joint.clone()
        emit[:, :k] = torch.where(within[..., None, None], recovered, joint[:, :k])
        return GroupDecisions(owner_accept, emit)

    def decision_probs(self, draft: Draft, target_probs: torch.Tensor) -> Decisions:
        """Token level: accept drafted t with sum_k w[k, t] min(1, P_c(k)/Q_c(k)); the emitted token's law."""
        return self.group_decision_probs(draft, target_probs).token_level()

    # ---- sampling

    def __call__(self, draft: Draft, target_probs: torch.Tensor, noise: AcceptanceNoise) -> Verdict:
        self._check_vocabulary(target_probs)
        batch, k = draft.tokens.shape
        drafted = draft.drafted()
        tokens = draft.tokens.clamp(min=0)  # slots past num_drafted may hold PLACEHOLDER
        draft_probs = ChainRejection._draft_probs(draft, target_probs)  # [batch, k, vocab]
        owner_uniform = noise.uniform(Purpose.GROUP_OWNER)[..., 0]  # [batch, k + 1]
        owner = self.choose_owner(tokens, owner_uniform[:, :k], target_probs[:, :k], draft_probs)  # [batch, k]
        ratio = kernels.accept_probability(self._mass_at(target_probs[:, :k], owner), self._mass_at(draft_probs, owner))
        passes = (noise.accept_uniform.double() < ratio) & (torch.arange(k) < drafted[:, None])
        num_accepted = passes.long().cumprod(-1).sum(-1)  # [batch]

        rows = torch.arange(batch)
        stop_target = target_probs[rows, num_accepted]  # [batch, vocab]
        stop_draft = draft_probs[rows, num_accepted.clamp(max=k - 1)] if k else torch.zeros_like(stop_target)
        rejected = num_accepted < drafted
        emit_uniform = _at(noise.emit_uniform, num_accepted)
        bonus = kernels.sample_categorical(stop_target.double(), emit_uniform)
        bonus_group = self.groups.pick_owner(bonus, _at(owner_uniform, num_accepted))
        recovered, recovered_group = self._recover(stop_target, stop_draft, rejected, noise, num_accepted)
        emitted = torch.where(rejected, recovered, bonus)
        emitted_group = torch.where(rejected, recovered_group, bonus_group)
        exact = exact_accepted(tokens, draft_probs, target_probs, drafted, noise.accept_uniform)
        return Verdict.from_chain(_chain_layout(draft.tokens, num_accepted, emitted), num_accepted, drafted,
                                  groups=_chain_layout(owner, num_accepted, emitted_group), exact_accepted=exact)

    def _mass_at(self, probs: torch.Tensor, group: torch.Tensor) -> torch.Tensor:
        """(W probs[b, i])(group[b, i]): probs [batch, k, vocab], group [batch, k] -> [batch, k] float64."""
        batch, k = group.shape
        flat = probs.reshape(batch * k, probs.shape[-1])
        return self.groups.mass(flat, group.reshape(batch * k, 1)).reshape(batch, k)

    def _recover(self, target: torch.Tensor, draft: torch.Tensor, rejected: torch.Tensor, noise: AcceptanceNoise,
                 slot: torch.Tensor):
        """(token, group) [batch] from the residual at each row's stop slot (rows that did not reject get values
        that are never used). target, draft: [batch, vocab] laws at the stop slot."""
        if self.residual == "explicit":
            return self._explicit_residual(target, draft, noise, slot)
        rounds = self.thinning_rounds
        thin = _at(noise.uniform(Purpose.GROUP_THIN, 3 * rounds), slot).reshape(-1, rounds, 3)  # [batch, M, 3]
        candidates = kernels.sample_categorical(target.double()[:, None, :].expand(-1, rounds, -1), thin[..., 0])
        groups = self.groups.pick_owner(candidates, thin[..., 1])  # [batch, M]
        target_mass, draft_mass = self.groups.mass(target, groups), self.groups.mass(draft, groups)
        keep = torch.where(target_mass > 0, (1 - draft_mass / torch.where(target_mass > 0, target_mass, 1.0)), 0.0)
        kept = thin[..., 2] < keep.clamp(min=0.0)
        first = kept.long().argmax(-1, keepdim=True)  # the first kept round
        token, group = candidates.gather(1, first).squeeze(1), groups.gather(1, first).squeeze(1)
        missing = rejected & ~kept.any(-1)
        # one host sync: the fallback weighs every group (W p), which thinning exists to avoid; it runs only when
        # all rounds of a rejecting row were thinned away (probability alpha_g ** M)
        if bool(missing.any()):
            fallback_token, fallback_group = self._explicit_residual(target, draft, noise, slot)
            token = torch.where(missing, fallback_token, token)
            group = torch.where(missing, fallback_group, group)
        return token, group

    def _explicit_residual(self, target: torch.Tensor, draft: torch.Tensor, noise: AcceptanceNoise,
                           slot: torch.Tensor):
        target_coarse, draft_coarse = self.groups.coarse(target), self.groups.coarse(draft)  # [batch, groups]
        weights = (target_coarse - draft_coarse).clamp(min=0.0)  # unnormalised: sample_categorical scales u
        weights = torch.where(weights.sum(-1, keepdim=True) > 0, weights, target_coarse)  # P_c == Q_c: any group
        group = kernels.sample_categorical(weights, _at(noise.emit_uniform, slot))
        member_uniform = _at(noise.uniform(Purpose.GROUP_MEMBER)[..., 0], slot)
        return self._member_draw(target, group, member_uniform), group

    def _member_draw(self, target: torch.Tensor, group: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
        """A token of each row's group drawn with weights target(u) w[g, u]: target [batch, vocab], group [batch]."""
        groups = self.groups
        start, size = groups.member_indptr.long()[group], groups.sizes[group]
        slots = torch.arange(max(groups.max_members, 1))
        entries = (start[:, None] + slots).clamp(max=groups.member_ids.numel() - 1)  # [batch, max_members]
        members = groups.member_ids.long()[entries]
        weights = target.double().gather(1, members) * groups.member_weights[entries] * (slots < size[:, None])
        return members.gather(1, kernels.sample_categorical(weights, uniform)[:, None]).squeeze(1)


class ToleranceRejection:
    """SSD: accept drafted t if u < min(1, target(t)/draft(t)) + beta where target(t) > 0; recover from
    norm((target - draft)+) (module docstring). beta = 0 is `ChainRejection`, decision for decision."""

    lossless = False
    name = "tolerance"

    def __init__(self, beta: float = 0.1):
        if not (isinstance(beta, (int, float)) and math.isfinite(beta) and 0 <= beta <= 1):
            raise InvalidRequest(f"beta must be a number in [0, 1], got {beta!r}")
        self.beta = float(beta)

    def decision_probs(self, draft: Draft, target_probs: torch.Tensor) -> Decisions:
        exact = ChainRejection().decision_probs(draft, target_probs)
        accept = exact.accept_probs
        return Decisions(torch.where(accept > 0, (accept + self.beta).clamp(max=1.0), accept), exact.emit_probs)

    def __call__(self, draft: Draft, target_probs: torch.Tensor, noise: AcceptanceNoise) -> Verdict:
        # u < ratio + beta  <=>  u - beta < ratio; clamping at 0 keeps "never accept where the target is 0"
        # (0 < ratio fails there), and beta = 0 leaves every uniform, hence every decision, unchanged
        shifted = dataclasses.replace(noise, accept_uniform=(noise.accept_uniform.double() - self.beta).clamp(min=0.0))
        verdict = ChainRejection()(draft, target_probs, shifted)
        draft_probs = ChainRejection._draft_probs(draft, target_probs)
        exact = exact_accepted(draft.tokens.clamp(min=0), draft_probs, target_probs, draft.drafted(),
                               noise.accept_uniform)
        return dataclasses.replace(verdict, exact_accepted=exact)


def exact_accepted(tokens: torch.Tensor, draft_probs: torch.Tensor, target_probs: torch.Tensor,
                   drafted: torch.Tensor, accept_uniform: torch.Tensor) -> torch.Tensor:
    """[batch] the prefix exact token-level sampling accepts with these drafts and uniforms.
    tokens [batch, k]; draft_probs [batch, k, vocab] dense; target_probs [batch, k + 1, vocab]."""
    k = tokens.shape[1]
    at = tokens[..., None]
    ratio = kernels.accept_probability(target_probs[:, :k].gather(-1, at), draft_probs.gather(-1, at)).squeeze(-1)
    passes = (accept_uniform.double() < ratio) & (torch.arange(k) < drafted[:, None])
    return passes.long().cumprod(-1).sum(-1)


def _at(values: torch.Tensor, slot: torch.Tensor) -> torch.Tensor:
    """values[b, slot[b], ...]: [batch, slots, ...] -> [batch, ...]."""
    return values[torch.arange(values.shape[0]), slot]


def _chain_layout(drafted: torch.Tensor, num_accepted: torch.Tensor, emitted: torch.Tensor) -> torch.Tensor:
    """[batch, k + 1]: the accepted drafted values, then the emitted one, then PLACEHOLDER."""
    batch, k = drafted.shape
    padded = torch.cat([drafted, drafted.new_full((batch, 1), kernels.PLACEHOLDER)], 1)
    layout = torch.where(torch.arange(k + 1) < num_accepted[:, None], padded, kernels.PLACEHOLDER)
    return layout.scatter(1, num_accepted[:, None], emitted[:, None].to(layout.dtype))
