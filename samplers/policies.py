"""Draft-length policies: how many tokens to draft next step (the adaptive ones live in length_policies)."""

from __future__ import annotations

from specgen.errors import InvalidRequest
from specgen.samplers.types import Verdict


class FixedLength:
    def __init__(self, num_draft_tokens: int):
        if num_draft_tokens < 0:
            raise InvalidRequest(f"num_draft_tokens must be >= 0, got {num_draft_tokens}")
        self.length = num_draft_tokens

    def next_length(self) -> int:
        return self.length

    def observe(self, verdict: Verdict) -> None:
        pass


class HeuristicLength:
    """Hugging Face assisted generation's "heuristic" schedule: +2 when every drafted token of every row
    was accepted, otherwise -1 (never below `minimum`)."""

    def __init__(self, num_draft_tokens: int = 5, minimum: int = 1, maximum: int = 64):
        if not 1 <= minimum <= num_draft_tokens <= maximum:
            raise InvalidRequest("need 1 <= minimum <= num_draft_tokens <= maximum")
        self.length, self.minimum, self.maximum = num_draft_tokens, minimum, maximum

    def next_length(self) -> int:
        return self.length

    def observe(self, verdict: Verdict) -> None:
        if bool((verdict.num_accepted >= verdict.num_drafted).all()):
            self.length = min(self.maximum, self.length + 2)
        else:
            self.length = max(self.minimum, self.length - 1)


def _adaptive():
    from specgen.samplers.length_policies import ConfidenceLength, CostModelLength, SvipLength

    return {"svip": SvipLength, "kangaroo": ConfidenceLength, "cost": CostModelLength}


# 'svip' and 'kangaroo' stop drafting token by token: only drafters that consult `policy.stop` (the text model
# drafter) use that part; 'cost' needs the run's SpecStats (`attach`). See samplers/length_policies.py.
POLICIES = {"fixed": FixedLength, "heuristic": HeuristicLength, **_adaptive()}


def make_policy(name: str, num_draft_tokens: int):
    try:
        return POLICIES[name](num_draft_tokens)
    except KeyError:
        raise InvalidRequest(f"unknown length schedule {name!r}; choose from: {', '.join(POLICIES)}") from None
