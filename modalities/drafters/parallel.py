"""`parallel`: the draft model drafts on a core of its own, ahead of the target (Mirror-SD, Bhendawade et al.
2025; speculative streaming). Every other method drafts and verifies one after the other on one core.

    main process (the target)                     draft process (its own core)
    propose(ctx)  ── committed contexts ───────►  a window drafted ahead from exactly ctx? send it; else draft
                  ◄─ drafted window ───────────   then at once draft the next window on every branch ctx may
    verify: one target forward    ║               take: all accepted plus the bonus it guesses, or rejected at
                                  ║               slot j with the correction it guesses (its likeliest other
                                  ║               token), all branches in one batched chain
    propose(ctx') ────────────────────────────►  a branch equals ctx': its window is ready, or nearly

A step then costs max(verify, draft) instead of their sum when a branch hits. Why a process and not a thread
(docs/parallel.md): on these small models both forwards hold the GIL for most of a step; two threads ran a code
pair step in 10.3 ms against 8.7 ms one after the other, while two processes do not slow each other down.

Exactness: a window is served only when the context it was drafted from equals the committed context token for
token, its tokens were drawn from the laws it reports (counter-based noise keyed by sample and position, as
`draft` draws them), and the target verifies it with the same chain rule: the output law is `draft`'s.

Timing: what the draft process computes depends on tokens only. A speculation is either completed (the next
request matches one of its branches, so the process finishes it before answering) or abandoned, and an
abandoned speculation's rows are rewound to the part of their caches it cannot have touched, whether it ran
for one forward or to its end (`ModelDrafter.rewind`). So outputs do not depend on how long anything took;
tests/modalities/test_parallel.py injects random delays on both sides.
"""

from __future__ import annotations

import atexit
import os
import pickle
import random
import threading
import time
import weakref
from dataclasses import dataclass, field

import torch

from specgen.errors import InvalidRequest, SpecgenError
from specgen.modalities.drafters.model import Interrupted, ModelDrafter
from specgen.samplers.processing import Processing
from specgen.samplers.types import DecodeContext, Draft


class DraftProcessError(SpecgenError, RuntimeError):
    """The draft process failed or exited (the CLI reports it on one `error:` line)."""


@dataclass(frozen=True)
class DraftConfig:
    """What the draft process builds its `ModelDrafter` from (picklable)."""

    draft_path: str
    target_vocab_size: int
    processing: Processing = Processing(temperature=0.0)  # the draft's (hooks and constraints must pickle)
    loader: str = "text"  # "text": a causal LM (its vocab_ids.json maps a reduced vocabulary); "speech"
    int8_head: bool = False
    branches: int = 3
    max_ngram: int = 0  # > 0: prompt lookup fills the slots it can, as in `draft-lookup`
    min_ngram: int = 2
    jitter_s: float = 0.0  # tests: a random sleep up to this long before every draft forward of the process


@dataclass
class Branch:
    """One context the next request may commit, and the chain drafted ahead from it: `budget + 1` tokens, the
    window and, at the extra slot, the draft's own guess of the bonus (the next speculation's branches)."""

    context: list[int]
    row: int  # the draft cache row it drafts on
    tokens: list[int] = field(default_factory=list)
    laws: torch.Tensor | None = None  # [budget + 1, vocab] the laws `tokens` were drawn from
    probs: list[float] = field(default_factory=list)  # per slot, the draft's probability of its token
    alternatives: list[list[int]] = field(default_factory=list)  # per slot, the draft's likeliest other tokens
    alternative_probs: list[list[float]] = field(default_factory=list)


class Ahead:
    """The drafting logic of the draft process (also run inline, on the caller's thread, for comparison and
    tests): `answer` a request, then `speculate` on its branches. Real row r drafts on the draft cache rows
    r * branches .. r * branches + branches - 1; `home[r]` is the one that drafted its latest window. Every chain
    is drafted one token past the window: that slot's token and its runners-up are the guessed bonus tokens of
    the full-acceptance branches (`_candidates`)."""

    def __init__(self, drafter: ModelDrafter, branches: int, jitter_s: float = 0.0):
        if branches < 1:
            raise InvalidRequest(f"branches must be >= 1, got {branches}")
        self.drafter, self.branches, self.jitter_s = drafter, branches, jitter_s
        self._random = random.Random()
        self.home: dict[int, int] = {}
        self.plans: dict[int, list[Branch]] = {}  # real row -> the branches of the speculation
        self.expected: dict[int, list[list]] = {}  # real row -> the contexts its branches stand for (`may_hit`)
        self.done = False  # the speculation ran to its end
        self.held: list[list[int]] | None = None  # the draft cache's tokens when the speculation started
        self.last: tuple | None = None  # the answered request and chains, which the speculation extends
        self.counters = {"hits": 0, "misses": 0, "speculations": 0, "abandoned": 0, "branch_rows": 0}
        self.accepted, self.tried = [0] * self.BINS, [0] * self.BINS  # per confidence bin (`accept_rate`)

    # ---- answering ------------------------------------------------------------------------------------------

    def answer(self, contexts: list[list[int]], rows: list[int], sample_ids: list[int], seed: int,
               budget: int) -> tuple[list[list[int]], torch.Tensor | None]:
        """The window for each row: the speculated one whose context is the row's, else drafted now (from the
        row's cache rewound to what it held before the speculation). Returns (tokens, laws or None)."""
        self._size(max(rows) + 1)
        self._count_accepted(contexts, rows)
        hits = {i: b for i, row in enumerate(rows) if (b := self._hit(row, contexts[i], budget)) is not None}
        misses = [i for i in range(len(rows)) if i not in hits]
        for i in misses:
            self._rewind(rows[i])
            self.home.setdefault(rows[i], rows[i] * self.branches)
        chains: list[Branch] = [hits.get(i) for i in range(len(rows))]
        if misses:
            ctx = DecodeContext([torch.tensor(contexts[i]) for i in misses],
                                torch.tensor([self.home[rows[i]] for i in misses]),
                                torch.tensor([sample_ids[i] for i in misses]), seed)
            # the window alone: the slot past it (the guessed bonus) is drafted when speculating, off the critical path
            for i, chain in zip(misses, self._chains(ctx, budget)):
                chain.context, chain.row = contexts[i], self.home[rows[i]]
                chains[i] = chain
        for i, b in hits.items():
            self.home[rows[i]] = b.row
        self.counters["hits"] += len(hits)
        self.counters["misses"] += len(misses)
        self.plans, self.expected, self.done = {}, {}, False
        self.last = (rows, sample_ids, seed, budget, chains)
        tokens = [chain.tokens[:budget] for chain in chains]
        laws = None if self.drafter.processing.greedy else torch.stack([c.laws[:budget] for c in chains])
        return tokens, laws

    def _chains(self, ctx: DecodeContext, length: int) -> list[Branch]:
        """One proposal of `length` tokens over ctx's rows, as chains (context and row filled in by the caller)."""
        draft = self.drafter.propose(ctx, length)
        greedy = self.drafter.processing.greedy
        d = self.drafter
        return [Branch([], 0, draft.tokens[k].tolist(), None if greedy else draft.draft_probs[k].clone(),
                       d.drafted_probs[k].tolist(), d.alternatives[k].tolist(), d.alternative_probs[k].tolist())
                for k in range(len(ctx.tokens))]

    def _hit(self, row: int, context: list[int], budget: int) -> Branch | None:
        if not self.done:
            return None
        for b in self.plans.get(row, ()):
            if b.context == context and len(b.tokens) > budget:
                return b
        return None

    def may_hit(self, contexts: list[list[int]], rows: list[int]) -> bool:
        """Whether a request that arrived while the speculation runs can take one of its windows."""
        return any(len(pattern) == len(context) and all(p is None or p == t for p, t in zip(pattern, context))
                   for context, row in zip(contexts, rows) for pattern in self.expected.get(row, ()))

    # ---- speculating ----------------------------------------------------------------------------------------

    def speculate(self, interrupt=None) -> None:
        """Draft the next chain on the `branches` likeliest next contexts of each last answered window
        (`_candidates`), in one batched proposal. `interrupt()`, asked before every draft forward, abandons it (its
        rows are then rewound)."""
        rows, sample_ids, seed, budget, chains = self.last
        self.held, self.done = self.drafter.held(), False
        self.drafter.interrupt = self._asker(interrupt)
        try:
            self._guess_bonus(rows, sample_ids, seed, budget, chains)
            order = self._plan(rows, budget, chains)
            ctx = DecodeContext([torch.tensor(b.context) for _, b in order], torch.tensor([b.row for _, b in order]),
                                torch.tensor([sample_ids[i] for i, _ in order]), seed)
            drafted = self._chains(ctx, budget + 1)
        except Interrupted:
            self.abandon()
            return
        finally:
            self.drafter.interrupt = None
        self.plans = {}
        for (i, b), chain in zip(order, drafted):
            chain.context, chain.row = b.context, b.row
            self.plans.setdefault(rows[i], []).append(chain)
        self.done = True

    def _guess_bonus(self, rows, sample_ids, seed, budget, chains) -> None:
        """Chains drafted on demand stop at the window: draft their next slot (the guessed bonus) now."""
        short = [i for i, chain in enumerate(chains) if len(chain.tokens) <= budget]
        if not short:
            return
        # until the branches are planned, these rows stand for the window's context (what `abandon` rewinds), and
        # a request that arrives meanwhile is matched against the branches with the bonus not known yet
        self.plans = {rows[i]: [Branch(chains[i].context + chains[i].tokens, self.home[rows[i]])] for i in short}
        self.expected = {row: self._candidates(chain, budget) for row, chain in zip(rows, chains)}
        ctx = DecodeContext([torch.tensor(chains[i].context + chains[i].tokens) for i in short],
                            torch.tensor([self.home[rows[i]] for i in short]),
                            torch.tensor([sample_ids[i] for i in short]), seed)
        for i, guess in zip(short, self._chains(ctx, 1)):
            chain = chains[i]
            chain.tokens, chain.probs = chain.tokens + guess.tokens, chain.probs + guess.probs
            chain.alternatives = chain.alternatives + guess.alternatives
            chain.alternative_probs = chain.alternative_probs + guess.alternative_probs

    def _candidates(self, chain: Branch, budget: int) -> list[list]:
        """The `branches` contexts the next request is likeliest to bring: the window accepted through slot j - 1
        and then, at slot j, a correction (were it rejected: one of the draft's runners-up there, by its share of
        what the drafted token left) or, past the window, the bonus (the drafted token or a runner-up, by the
        draft's law). Slot j is accepted with the rate measured so far for drafted tokens as confident as its
        (`accept_rate`). Before the bonus slot is drafted (None), every bonus is a candidate."""
        window, ranked, reach = chain.tokens[:budget], [], 1.0
        if len(chain.tokens) <= budget:
            ranked.append((float("inf"), chain.context + window + [None]))
        for j in range(min(budget + 1, len(chain.tokens))):
            ends = list(zip(chain.alternatives[j], chain.alternative_probs[j]))
            if j == budget:
                ranked += [(reach * prob, chain.context + window + [token])
                           for token, prob in ends + [(chain.tokens[j], chain.probs[j])]]
                break
            accept = self.accept_rate(chain.probs[j])
            rest = max(1.0 - chain.probs[j], 1e-6)
            ranked += [(reach * (1 - accept) * prob / rest, chain.context + window[:j] + [token])
                       for token, prob in ends]
            reach *= accept
        ranked.sort(key=lambda item: -item[0])
        if ranked and ranked[0][1][-1] is None:  # unknown bonus: any ranking of the rest may be chosen
            return [context for _, context in ranked]
        return [context for _, context in ranked[:self.branches]]

    BINS = 10

    def accept_rate(self, confidence: float) -> float:
        """How often drafted tokens of this draft probability were accepted so far (10 bins; prior 8 of 10)."""
        b = min(int(confidence * self.BINS), self.BINS - 1)
        return (self.accepted[b] + 8) / (self.tried[b] + 10)

    def _count_accepted(self, contexts: list[list[int]], rows: list[int]) -> None:
        """Read off which window slots the target accepted from the contexts that followed (`accept_rate`)."""
        if self.last is None:
            return
        before = {row: chain for row, chain in zip(self.last[0], self.last[4])}
        budget = self.last[3]
        for context, row in zip(contexts, rows):
            chain = before.get(row)
            if chain is None or len(context) <= len(chain.context) or context[:len(chain.context)] != chain.context:
                continue  # a new request in this row
            kept = min(len(context) - len(chain.context) - 1, budget)
            for j in range(min(kept + 1, budget)):
                b = min(int(chain.probs[j] * self.BINS), self.BINS - 1)
                self.tried[b] += 1
                self.accepted[b] += j < kept

    def _plan(self, rows, budget, chains) -> list[tuple[int, Branch]]:
        plans, order = {}, []
        for i, row in enumerate(rows):
            home = self.home[row]
            spare = iter(w for w in range(row * self.branches, (row + 1) * self.branches) if w != home)
            branches = [Branch(context, home if k == 0 else next(spare))
                        for k, context in enumerate(self._candidates(chains[i], budget))]
            plans[row] = branches
            order += [(i, b) for b in branches]
        self.plans, self.expected = plans, {row: [b.context for b in plans[row]] for row in plans}
        self.counters["speculations"] += 1
        self.counters["branch_rows"] += len(order)
        return order

    def _asker(self, interrupt):
        if not self.jitter_s:
            return interrupt

        def ask():
            time.sleep(self._random.uniform(0, self.jitter_s))
            return bool(interrupt and interrupt())
        return ask

    def abandon(self) -> None:
        """Rewind every speculated row, as far as the speculation could have reached."""
        if self.plans:
            self.counters["abandoned"] += 1
        for row in list(self.plans):
            self._rewind(row)
        self.plans, self.expected, self.done = {}, {}, False

    def _rewind(self, row: int) -> None:
        for b in self.plans.pop(row, ()):
            self.drafter.rewind(self.held, b.row, b.context)

    def _size(self, rows: int) -> None:
        """Cache rows for `rows` real rows' branches (a resize empties every cache: plans are dropped)."""
        needed = rows * self.branches
        if not self.drafter.cached or len(self.drafter.cached) < needed:
            self.drafter._reset(needed)
            self.plans, self.expected, self.done, self.home = {}, {}, False, {}


# ---- the draft process ------------------------------------------------------------------------------------------


def build_model_drafter(config: DraftConfig, model=None) -> ModelDrafter:
    """The `ModelDrafter` a `DraftConfig` describes (loading the draft unless `model` is given)."""
    from specgen.modalities.text.generator import draft_vocab_ids

    model = model if model is not None else load_draft(config)
    reduced = draft_vocab_ids(config.draft_path) if config.loader == "text" else None
    lookup = None
    if config.max_ngram > 0:
        from specgen.modalities.text.ngram import LookupSlots

        lookup = LookupSlots(config.max_ngram, config.min_ngram)
    # speculation drafts up to two windows past the committed context: room past the model's positions
    capacity = getattr(model.config, "max_position_embeddings", 2048) + 2 * 66
    drafter = ModelDrafter(model, config.processing, target_vocab_size=config.target_vocab_size, vocab_ids=reduced,
                           unknown_id=0 if reduced is None else len(reduced), capacity=capacity,
                           int8_head=config.int8_head, lookup=lookup)
    drafter.keep_runners_up = True  # the branches' guesses
    return drafter


def load_draft(config: DraftConfig):
    if config.loader == "speech":
        from specgen.modalities.speech.models import load_speech_lm

        return load_speech_lm(config.draft_path)
    from specgen.modalities.text.generator import load_causal_lm

    return load_causal_lm(config.draft_path)


def _pin_to_own_core() -> None:
    """Run on the last allowed core (the main process keeps the others; the OS still schedules it there)."""
    try:
        cores = sorted(os.sched_getaffinity(0))
        if len(cores) > 1:
            os.sched_setaffinity(0, {cores[-1]})
    except (AttributeError, OSError):
        pass


def serve(conn) -> None:
    """The draft process: answer each request, then speculate until the next one arrives (polling the pipe
    before every draft forward)."""
    from specgen.settings import use_threads

    use_threads(1)
    _pin_to_own_core()
    models: dict[str, object] = {}
    ahead, pending = None, None
    while True:
        try:
            message = pending if pending is not None else _receive(conn)
        except (EOFError, OSError):  # the main process has gone
            return
        pending = None
        if message[0] == "stop":
            return
        try:
            if message[0] == "begin":
                config = message[1]
                if config.draft_path not in models:
                    models[config.draft_path] = load_draft(config)
                ahead = Ahead(build_model_drafter(config, models[config.draft_path]), config.branches,
                              config.jitter_s)
                _send(conn, ("ready",))
                continue
            tokens, laws = ahead.answer(*message[1:])
        except Exception as error:  # the request fails, the process stays
            _send(conn, ("error", f"{type(error).__name__}: {error}"))
            continue
        _send(conn, ("draft", tokens, laws, dict(ahead.counters)))

        def interrupt() -> bool:
            nonlocal pending
            if pending is None and conn.poll():
                pending = _receive(conn)  # EOF here ends the speculation, then the loop
            return pending is not None and not (pending[0] == "propose" and ahead.may_hit(pending[1], pending[2]))

        try:
            ahead.speculate(interrupt)
        except Exception:  # e.g. a branch past the cache: the next request drafts afresh
            ahead.abandon()


def _send(conn, message) -> None:
    """Plain pickling (tensors by value): a `Connection`'s own pickler would hand tensors over as shared memory,
    which needs the two processes to be multiprocessing's parent and child."""
    conn.send_bytes(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))


def _receive(conn):
    return pickle.loads(conn.recv_bytes())


class _Worker:
    """A draft process: a fresh interpreter (`python -c`, not multiprocessing's spawn, which would re-run the
    caller's main script) that connects back over a local socket and runs `serve`."""

    START_TIMEOUT_S = 120

    def __init__(self):
        import secrets
        import subprocess
        import sys
        from multiprocessing.connection import Listener

        authkey = secrets.token_bytes(32)
        with Listener(family="AF_UNIX", authkey=authkey) as listener:
            self.process = subprocess.Popen(
                [sys.executable, "-c", "from specgen.modalities.drafters.parallel import main; main()"],
                stdin=subprocess.PIPE)
            self.process.stdin.write(f"{listener.address}\n{authkey.hex()}\n".encode())
            self.process.stdin.close()
            accepted: list = []
            waiter = threading.Thread(target=lambda: accepted.append(listener.accept()), daemon=True)
            waiter.start()
            deadline = time.monotonic() + self.START_TIMEOUT_S
            while waiter.is_alive() and self.process.poll() is None and time.monotonic() < deadline:
                waiter.join(0.05)
            if not accepted:
                self.process.kill()
                raise DraftProcessError(f"the draft process did not start (exit code {self.process.poll()})")
        self.conn = accepted[0]

    def call(self, message) -> tuple:
        try:
            _send(self.conn, message)
            reply = _receive(self.conn)
        except (EOFError, BrokenPipeError, ConnectionResetError) as error:
            raise DraftProcessError(f"the draft process exited (code {self.process.poll()})") from error
        if reply[0] == "error":
            raise DraftProcessError(f"the draft process failed: {reply[1]}")
        return reply

    def stop(self) -> None:
        try:
            _send(self.conn, ("stop",))
        except (BrokenPipeError, OSError):
            pass
        try:
            self.process.wait(timeout=5)
        except Exception:
            self.process.kill()
        self.conn.close()

    @property
    def alive(self) -> bool:
        return self.process.poll() is None


_IDLE: list[_Worker] = []  # started draft processes no drafter uses now (they keep their loaded drafts)
_LOCK = threading.Lock()


def _take() -> _Worker:
    with _LOCK:
        while _IDLE:
            worker = _IDLE.pop()
            if worker.alive:
                return worker
    return _Worker()


def _give_back(worker: _Worker) -> None:
    with _LOCK:
        if worker.alive and len(_IDLE) < 2:
            _IDLE.append(worker)
            return
    worker.stop()


@atexit.register
def _stop_all() -> None:
    with _LOCK:
        while _IDLE:
            _IDLE.pop().stop()


def main() -> None:
    """The draft process's entry point: read the socket address and key from stdin, connect, serve."""
    import sys
    from multiprocessing.connection import Client

    address, key = sys.stdin.read().split()
    serve(Client(address, authkey=bytes.fromhex(key)))


def parallel_drafter(knobs: dict, model, draft_path, target_vocab_size: int, processing: Processing, *,
                     vocab_ids: torch.Tensor | None = None, **config) -> "ParallelDrafter":
    """The `parallel` drafter of a request: its knobs (`branches`, `worker`, the lookup sizes where the method has
    them) over the draft `model` loaded from `draft_path`; `config`: further `DraftConfig` fields."""
    config = DraftConfig(str(draft_path), target_vocab_size, processing, branches=knobs["branches"],
                         max_ngram=knobs.get("max_matching_ngram_size", 0),
                         min_ngram=knobs.get("min_matching_ngram_size", 2), **config)
    inline = knobs["worker"] == "inline"
    return ParallelDrafter(config, inline=inline, model=model if inline else None, vocab_ids=vocab_ids)


class ParallelDrafter:
    """The main process's side of `parallel`: each proposal is a round trip to the draft process (or, with
    `inline`, the same `Ahead` run on this thread after each proposal: the same windows, no overlap)."""

    def __init__(self, config: DraftConfig, *, inline: bool = False, model=None,
                 vocab_ids: torch.Tensor | None = None):
        self.config, self.vocab_ids, self.processing = config, vocab_ids, config.processing
        self.inline = Ahead(build_model_drafter(config, model), config.branches, config.jitter_s) if inline else None
        self.worker: _Worker | None = None
        self.counters: dict = {}

    def propose(self, ctx: DecodeContext, budget: int) -> Draft:
        request = ([t.tolist() for t in ctx.tokens], ctx.rows.tolist(), ctx.sample_ids.tolist(), int(ctx.seed),
                   int(budget))
        if self.inline is not None:
            tokens, laws = self.inline.answer(*request)
            self.counters = dict(self.inline.counters)
            self.inline.speculate()
        else:
            if self.worker is None:
                self.worker = _take()
                weakref.finalize(self, _give_back, self.worker)
                self.worker.call(("begin", self.config))
            _, tokens, laws, self.counters = self.worker.call(("propose", *request))
        return Draft(torch.tensor(tokens, dtype=torch.long), laws, vocab_ids=self.vocab_ids)

    def observe(self, verdict) -> None:
        pass  # the next request's contexts say which branch, if any, was taken

    def run_summary(self) -> dict:
        c = self.counters
        answered = c.get("hits", 0) + c.get("misses", 0)
        return {"ahead_hits": c.get("hits", 0), "ahead_misses": c.get("misses", 0),
                "ahead_hit_rate": round(c.get("hits", 0) / answered, 4) if answered else None,
                "speculations_abandoned": c.get("abandoned", 0), "speculations": c.get("speculations", 0),
                # drafted branch windows no request took: the draft work spent for nothing
                "branch_windows_unused": (round(1 - c.get("hits", 0) / c["branch_rows"], 4)
                                          if c.get("branch_rows") else None),
                "draft_process": self.inline is None}
