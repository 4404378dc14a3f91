"""Acoustic Similarity Groups (PCG, Yanuka et al. 2025, arXiv 2511.13732): overlapping groups of tokens that lie
close together in the target's embedding space, and the coarse-grained law over groups they induce.

    G(k)      = {t : cos(E_k, E_t) > theta} ∪ {k}      one group per token, seeded at it (reflexive)
    owners(t) = {k : t ∈ G(k)}
    w[k, t]   = 1 / |owners(t)|                          each token's mass split evenly over its groups

W is column-stochastic, so P_c = W p is a law over groups for every token law p, and rejection sampling on the
group variable is exact in groups. Reflexivity makes theta >= 1 give singletons (W = I: plain token-level
speculative sampling). Tokens without a row in the similarity table (special tokens, text characters) and the
listed special ids are singletons too, so they are only ever accepted as themselves.

Tables are CSR in int32: members (group -> tokens, ascending) and owners (token -> groups, ascending). Group ids
are token ids: group k is the one seeded at token k.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
import torch

from specgen import kernels
from specgen.errors import InvalidRequest

FORMAT = 1  # version of the .npz layout
_MASS_ENTRIES = 1 << 22  # gathered entries per `group_mass` call when weighing every group (bounds memory)


@dataclass(frozen=True)
class TokenGroups:
    """Overlapping token groups as CSR tables (see the module docstring)."""

    theta: float
    member_indptr: torch.Tensor  # [groups + 1] int32: members of k are member_ids[member_indptr[k]:member_indptr[k+1]]
    member_ids: torch.Tensor  # [entries] int32
    owner_indptr: torch.Tensor  # [vocab + 1] int32: owners of t are owner_ids[owner_indptr[t]:owner_indptr[t+1]]
    owner_ids: torch.Tensor  # [entries] int32
    owner_counts: torch.Tensor  # [vocab] int32 |owners(t)|, >= 1 (every token owns its own group)

    def __post_init__(self):
        groups, vocab = self.member_indptr.numel() - 1, self.owner_indptr.numel() - 1
        if groups != vocab or self.owner_counts.numel() != vocab:
            raise InvalidRequest(f"token groups need one group per token: {groups} groups, {vocab} tokens")
        if self.member_ids.numel() != self.owner_ids.numel() or int(self.member_indptr[-1]) != self.member_ids.numel():
            raise InvalidRequest("token group tables are inconsistent (member and owner entries differ)")
        if vocab and int(self.owner_counts.min()) < 1:
            raise InvalidRequest("every token must belong to its own group")

    @property
    def vocab_size(self) -> int:
        return self.owner_counts.numel()

    @property
    def num_groups(self) -> int:
        return self.member_indptr.numel() - 1

    @cached_property
    def sizes(self) -> torch.Tensor:
        """[groups] int64 |G(k)|."""
        return (self.member_indptr[1:] - self.member_indptr[:-1]).long()

    @cached_property
    def max_members(self) -> int:
        return int(self.sizes.max()) if self.num_groups else 0

    @cached_property
    def member_weights(self) -> torch.Tensor:
        """[entries] float64 w[k, t] = 1 / |owners(t)| for every (group, member) entry."""
        return 1.0 / self.owner_counts.double()[self.member_ids.long()]

    def members(self, group: int) -> list[int]:
        return self.member_ids[int(self.member_indptr[group]):int(self.member_indptr[group + 1])].tolist()

    def owners(self, token: int) -> list[int]:
        return self.owner_ids[int(self.owner_indptr[token]):int(self.owner_indptr[token + 1])].tolist()

    def mass(self, probs: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
        """(W p)(k) of the listed groups: probs [rows, vocab], group_ids [rows, m] (-1: none) -> [rows, m] float64."""
        return kernels.group_mass(probs, group_ids, self.member_indptr, self.member_ids, self.member_weights,
                                  self.max_members)

    def coarse(self, probs: torch.Tensor) -> torch.Tensor:
        """P_c = W p over every group: probs [..., vocab] -> [..., groups] float64 (sums to probs' total)."""
        flat = probs.reshape(-1, probs.shape[-1])
        every = torch.arange(self.num_groups, device=probs.device)
        step = max(1, _MASS_ENTRIES // max(1, flat.shape[0] * self.max_members))  # groups per call
        parts = [self.mass(flat, every[start:start + step].expand(flat.shape[0], -1))
                 for start in range(0, self.num_groups, step)]
        return torch.cat(parts, -1).reshape(*probs.shape[:-1], self.num_groups)

    def pick_owner(self, tokens: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
        """A uniformly chosen owner group of each token (the law w[., t]): tokens [...], uniform [...] in (0, 1)."""
        tokens = tokens.long()
        counts = self.owner_counts.long()[tokens]
        rank = (uniform.double() * counts).long().clamp(max=counts - 1)
        return self.owner_ids.long()[self.owner_indptr.long()[tokens] + rank]

    @cached_property
    def dense_weights(self) -> torch.Tensor:
        """The dense [groups, vocab] float64 W (for exact enumeration on small vocabularies)."""
        rows = torch.repeat_interleave(torch.arange(self.num_groups), self.sizes)
        weights = torch.zeros(self.num_groups, self.vocab_size, dtype=torch.float64)
        weights[rows, self.member_ids.long()] = self.member_weights
        return weights

    def stats(self, groups: range | None = None) -> dict:
        """Group-size statistics over `groups` (default: all), e.g. the acoustic tokens only."""
        sizes = self.sizes if groups is None else self.sizes[groups.start:groups.stop]
        sizes = sizes.double()
        tables = sum(t.numel() * t.element_size() for t in (self.member_indptr, self.member_ids, self.owner_indptr,
                                                              self.owner_ids, self.owner_counts))
        return {"theta": self.theta, "groups": int(sizes.numel()), "entries": int(sizes.sum()),
                "mean_size": float(sizes.mean()), "median_size": float(sizes.median()),
                "p90_size": float(sizes.quantile(0.9)), "max_size": int(sizes.max()),
                "singletons": float((sizes == 1).double().mean()), "table_bytes": int(tables)}

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".partial.npz")  # written whole, then renamed: readers never see half
        np.savez(tmp, format=FORMAT, theta=self.theta,
                 **{name: getattr(self, name).numpy() for name in _TABLES})
        tmp.replace(path)
        return path

    @classmethod
    def load(cls, path: str | Path) -> "TokenGroups":
        with np.load(Path(path)) as data:
            if int(data["format"]) != FORMAT:
                raise InvalidRequest(f"{path}: token group format {int(data['format'])}, expected {FORMAT}")
            return cls(float(data["theta"]), *(torch.from_numpy(data[name].astype(np.int32)) for name in _TABLES))


_TABLES = ("member_indptr", "member_ids", "owner_indptr", "owner_ids", "owner_counts")


def build_groups(embeddings: torch.Tensor, theta: float, num_tokens_total: int, special_ids=(),
                 chunk_rows: int | None = None) -> TokenGroups:
    """Groups from embedding rows [V_acoustic, d] of tokens 0 .. V_acoustic-1; tokens V_acoustic ..
    num_tokens_total-1 and `special_ids` are singletons. Similarities are computed `chunk_rows` rows at a time,
    so a V x V float matrix never exists at once."""
    acoustic = embeddings.shape[0]
    if num_tokens_total < acoustic:
        raise InvalidRequest(f"num_tokens_total ({num_tokens_total}) is smaller than the {acoustic} embedding rows")
    if not np.isfinite(theta):
        raise InvalidRequest(f"theta must be a finite number, got {theta}")
    special = torch.zeros(acoustic, dtype=torch.bool)
    special_ids = [int(s) for s in special_ids if 0 <= int(s) < acoustic]
    special[special_ids] = True
    pairs = [_self_pairs(num_tokens_total)]  # reflexive: every token is in its own group
    if theta < 1 and acoustic > 1:
        pairs.append(_similar_pairs(embeddings, theta, special, chunk_rows))
    groups, tokens = np.concatenate([p[0] for p in pairs]), np.concatenate([p[1] for p in pairs])
    return _from_pairs(float(theta), groups, tokens, num_tokens_total)


def _self_pairs(vocab: int) -> tuple[np.ndarray, np.ndarray]:
    ids = np.arange(vocab, dtype=np.int64)
    return ids, ids


def _similar_pairs(embeddings: torch.Tensor, theta: float, special: torch.Tensor, chunk_rows: int | None):
    """(group, token) pairs with cos > theta between distinct non-special rows."""
    unit = embeddings.float()
    unit = unit / unit.norm(dim=-1, keepdim=True).clamp(min=1e-12)  # a zero row has cosine 0 with everything
    vocab = unit.shape[0]
    chunk_rows = chunk_rows or max(1, (1 << 22) // vocab)  # ~16 MB of similarities per chunk
    groups, tokens = [], []
    for start in range(0, vocab, chunk_rows):
        rows = torch.arange(start, min(start + chunk_rows, vocab))
        similar = (unit[rows] @ unit.T) > theta  # [chunk, vocab]
        similar[:, special] = False
        similar[special[rows]] = False
        similar[torch.arange(len(rows)), rows] = False  # the diagonal comes from the reflexive pairs
        k, t = similar.nonzero(as_tuple=True)
        groups.append((k + start).numpy())
        tokens.append(t.numpy())
    return np.concatenate(groups).astype(np.int64), np.concatenate(tokens).astype(np.int64)


def _from_pairs(theta: float, groups: np.ndarray, tokens: np.ndarray, vocab: int) -> TokenGroups:
    """CSR tables (ascending within each row) from unordered (group, token) pairs."""
    by_group = np.lexsort((tokens, groups))
    member_indptr = np.concatenate([[0], np.cumsum(np.bincount(groups, minlength=vocab))])
    by_token = np.lexsort((groups, tokens))
    owner_counts = np.bincount(tokens, minlength=vocab)
    owner_indptr = np.concatenate([[0], np.cumsum(owner_counts)])

    def int32(a):
        return torch.from_numpy(np.ascontiguousarray(a, dtype=np.int32))

    return TokenGroups(theta, int32(member_indptr), int32(tokens[by_group]), int32(owner_indptr),
                       int32(groups[by_token]), int32(owner_counts))


def swap_tokens(tokens: torch.Tensor, groups: TokenGroups, rate: float,
                generator: torch.Generator | None = None) -> torch.Tensor:
    """The token-swap stress test: each token, with probability `rate`, is replaced by another member of one
    of its groups (an owner group chosen uniformly, then a member other than the token uniformly); a token whose
    chosen group holds only itself, and ids outside the groups' vocabulary, stay. tokens [...] -> same shape."""
    if not 0 <= rate <= 1:
        raise InvalidRequest(f"the swap rate must be in [0, 1], got {rate}")
    flat = tokens.reshape(-1).long()
    inside = (flat >= 0) & (flat < groups.vocab_size)
    token = torch.where(inside, flat, 0)
    chosen, owner_u, member_u = torch.rand(3, flat.numel(), generator=generator, dtype=torch.float64)
    group = groups.pick_owner(token, owner_u)
    start, size = groups.member_indptr.long()[group], groups.sizes[group]
    # a member other than the token: draw among size - 1 slots and step over the token (members are ascending)
    slot = torch.minimum((member_u * (size - 1)).long(), (size - 2).clamp(min=0))
    members = groups.member_ids.long()
    candidate = members[start + slot]
    candidate = torch.where(candidate >= token, members[(start + slot + 1).clamp(max=members.numel() - 1)], candidate)
    swapped = inside & (chosen < rate) & (size > 1)
    return torch.where(swapped, candidate, flat).reshape(tokens.shape).to(tokens.dtype)
