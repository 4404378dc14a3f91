"""The one method registry: every method name maps to its drafter, acceptance rule, length policy,
`lossless` flag and knob schema. CLI choices, bench defaults, demo pickers and `docs/methods.md`
all derive from it. Pure data: importing this module loads no torch (the CLI's `--help` relies on it).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from specgen.errors import InvalidRequest

MODALITIES = ("text", "image", "video", "speech")


@dataclass(frozen=True)
class Knob:
    """One user-settable parameter of a method."""

    name: str
    type: type
    default: object
    help: str
    minimum: float | None = None
    maximum: float | None = None

    def validate(self, value: object) -> object:
        try:
            value = self.type(value)
        except (TypeError, ValueError):
            raise InvalidRequest(f"{self.name} must be a {self.type.__name__}, got {value!r}") from None
        if self.minimum is not None and value < self.minimum:
            raise InvalidRequest(f"{self.name} must be >= {self.minimum}, got {value}")
        if self.maximum is not None and value > self.maximum:
            raise InvalidRequest(f"{self.name} must be <= {self.maximum}, got {value}")
        return value


@dataclass(frozen=True)
class ChoiceKnob(Knob):
    """A string knob that takes one of a few names."""

    choices: tuple[str, ...] = ()

    def validate(self, value: object) -> object:
        value = super().validate(value)
        if value not in self.choices:
            raise InvalidRequest(f"{self.name} must be one of {', '.join(self.choices)}, got {value!r}")
        return value


@dataclass(frozen=True)
class MethodSpec:
    """What a method name means. `drafter`, `rule` and `policy` are keys that the modality and
    `specgen.samplers` resolve to objects, so this table stays importable without torch."""

    name: str
    modality: str
    lossless: bool
    summary: str
    drafter: str | None  # None: plain autoregressive decoding, no draft
    rule: str  # key into samplers.acceptance.RULES ("none" for plain decoding)
    policy: str = "fixed"  # key into samplers.length_policies.POLICIES
    paper: str = ""
    knobs: tuple[Knob, ...] = field(default_factory=tuple)
    # what the loop scores with: the "full" target, or the target decoding each token to a dynamic depth
    # ("early-exit", modalities/text/early_exit.py)
    target: str = "full"

    def resolve_knobs(self, params: dict | None) -> dict:
        """Defaults overridden by `params`; unknown names and bad values raise InvalidRequest."""
        params = dict(params or {})
        known = {knob.name: knob for knob in self.knobs}
        unknown = sorted(set(params) - set(known))
        if unknown:
            raise InvalidRequest(f"method {self.name!r} has no parameter(s) {', '.join(unknown)}; "
                                 f"known: {', '.join(known) or 'none'}")
        return {name: knob.validate(params[name]) if name in params else knob.default
                for name, knob in known.items()}


NUM_DRAFT_TOKENS = Knob("num_draft_tokens", int, 5, "draft length gamma per step", 1, 64)
LENGTH_SCHEDULE = ChoiceKnob("length_schedule", str, "fixed",
                             "'fixed'; 'heuristic' (+2 when all drafts are accepted, -1 otherwise); 'svip' (stop at a "
                             "draft entropy bound); 'kangaroo' (stop below a draft confidence); 'cost' (the length "
                             "the measured cost model predicts fastest)",
                             choices=("fixed", "heuristic", "svip", "kangaroo", "cost"))  # samplers/length_policies.py
# 5 as vLLM's prompt_lookup_max: on the bench prompts longer matches change nothing, shorter ones lose
NGRAM_SIZE = Knob("max_matching_ngram_size", int, 5, "longest n-gram looked up in the context", 1, 16)
# TETRIS (Wu et al., arXiv 2502.15197) wraps any chain drafter when several rows decode together (num_samples,
# batch --rows): samplers/tetris.py's TetrisDrafter; the pipeline applies it (modalities/pipeline.py)
VERIFY_CAPACITY = Knob("verify_capacity", int, 0, "TETRIS: verify at most this many drafted tokens per step across "
                       "the batch's rows, the ones most likely accepted (0 = every drafted token)", 0, 4096)
CAPACITY_ESTIMATE = ChoiceKnob("capacity_estimate", str, "confidence", "TETRIS: how a drafted token's acceptance is "
                               "estimated: the draft's 'confidence', or the row's acceptance 'history' (for point-mass "
                               "drafts such as prompt lookup)", choices=("confidence", "history"))
TETRIS_KNOBS = (VERIFY_CAPACITY, CAPACITY_ESTIMATE)

_METHODS: dict[tuple[str, str], MethodSpec] = {}


def register(spec: MethodSpec) -> MethodSpec:
    if spec.modality not in MODALITIES:
        raise ValueError(f"unknown modality {spec.modality!r}")
    key = (spec.modality, spec.name)
    if key in _METHODS:
        raise ValueError(f"method {spec.name!r} is already registered for {spec.modality}")
    _METHODS[key] = spec
    return spec


def method_names(modality: str) -> list[str]:
    return [name for (mod, name) in _METHODS if mod == modality]


def get_method(modality: str, name: str) -> MethodSpec:
    try:
        return _METHODS[(modality, name)]
    except KeyError:
        choices = ", ".join(method_names(modality)) or "none yet"
        raise InvalidRequest(f"unknown {modality} method {name!r}; choose from: {choices}") from None


# What a request without a method gets: `auto` everywhere. The best single method measured per model before `auto`
# (its first guess when no calibration exists yet is still the cost model's, not this table's).
DEFAULT_METHODS = {"text": "auto", "image": "auto", "video": "auto", "speech": "auto"}
BEST_FIXED_METHODS = {"image": "mc-sjd", "video": "mc-sjd", "speech": "sd"}


def default_method(modality: str, *, draft_model: bool = False, lookup_first: bool = False) -> str:
    """The method a request without one gets: `auto` (samplers/auto.py), which picks among the modality's lossless
    methods and plain decoding per request from the calibrated cost model and adapts between steps. `draft_model`
    and `lookup_first` name the best fixed method instead (`fixed_default_method`)."""
    if modality not in DEFAULT_METHODS:
        raise InvalidRequest(f"unknown modality {modality!r}; choose from: {', '.join(MODALITIES)}")
    return DEFAULT_METHODS[modality]


def fixed_default_method(modality: str, *, draft_model: bool = False, lookup_first: bool = False) -> str:
    """The best single method measured before `auto`. Text: a draft model's `draft` when one is loaded, unless the
    model is one measured faster with prompt lookup (`lookup_first`, Gemma 3 270M); else prompt lookup `ngram`."""
    if modality == "text":
        return "draft" if draft_model and not lookup_first else "ngram"
    if modality not in BEST_FIXED_METHODS:
        raise InvalidRequest(f"unknown modality {modality!r}; choose from: {', '.join(MODALITIES)}")
    return BEST_FIXED_METHODS[modality]


def knob_owners(modality: str) -> dict[str, list[str]]:
    """Each knob name of the modality's methods -> the methods that take it, in registration order."""
    owners: dict[str, list[str]] = {}
    for name in method_names(modality):
        for knob in _METHODS[(modality, name)].knobs:
            owners.setdefault(knob.name, []).append(name)
    return owners


def all_methods() -> list[MethodSpec]:
    return list(_METHODS.values())


def render_methods_markdown() -> str:
    """The text of docs/methods.md (a test keeps the file equal to this)."""
    lines = ["# Methods", "",
             "Generated from `specgen.samplers.registry` by `python -m specgen.samplers.registry`; do not edit by hand.",
             "**lossless** means the output distribution equals the target's processed distribution exactly.", ""]
    for modality in MODALITIES:
        specs = [s for s in _METHODS.values() if s.modality == modality]
        if not specs:
            continue
        lines += [f"## {modality}", "", "| method | lossless | drafter | acceptance rule | length policy | summary | knobs |",
                  "|---|---|---|---|---|---|---|"]
        for s in specs:
            knobs = "<br>".join(f"`{k.name}`={k.default!r}: {k.help}" for k in s.knobs) or "—"
            paper = f" ({s.paper})" if s.paper else ""
            lines.append(f"| `{s.name}` | {'yes' if s.lossless else 'no'} | {s.drafter or '—'} | {s.rule} | "
                         f"{s.policy} | {s.summary}{paper} | {knobs} |")
        lines.append("")
    return "\n".join(lines)


# ---- text -------------------------------------------------------------------------------------
register(MethodSpec("ar", "text", True, "plain autoregressive decoding of the target (the baseline)",
                    drafter=None, rule="none"))
register(MethodSpec("draft", "text", True,
                    "a small draft model proposes a chain; exact rejection sampling (greedy match at temperature 0)",
                    drafter="model", rule="chain", policy="fixed",
                    paper="Leviathan et al. 2023; Chen et al. 2023",
                    knobs=(NUM_DRAFT_TOKENS, LENGTH_SCHEDULE, *TETRIS_KNOBS)))
register(MethodSpec("ngram", "text", True,
                    "prompt lookup: each slot the most frequent follower of the longest suffix n-gram seen before "
                    "(the first slot down to 1-grams, later ones only while min_matching_ngram_size tokens match); "
                    "point-mass drafts", drafter="ngram", rule="chain", policy="fixed",
                    paper="Saxena 2023 (prompt lookup decoding)",
                    knobs=(NUM_DRAFT_TOKENS, NGRAM_SIZE,
                           Knob("min_matching_ngram_size", int, 2, "shortest matching n-gram that lets a slot after "
                                "the first be drafted", 1, 16), LENGTH_SCHEDULE, *TETRIS_KNOBS)))
MIN_NGRAM_SIZE = Knob("min_matching_ngram_size", int, 2, "shortest repeated n-gram that lets lookup fill a slot",
                      1, 16)
register(MethodSpec("draft-lookup", "text", True,
                    "a draft model whose slots prompt lookup fills where the context ends in a repeated n-gram (a "
                    "point mass there, the draft's law elsewhere); exact rejection sampling",
                    drafter="model-lookup", rule="chain", policy="fixed",
                    paper="Leviathan et al. 2023 with Saxena 2023's lookup",
                    knobs=(NUM_DRAFT_TOKENS, NGRAM_SIZE, MIN_NGRAM_SIZE, LENGTH_SCHEDULE)))
BRANCHES = Knob("branches", int, 3, "windows drafted ahead per row while the target verifies: the likeliest next "
                "contexts (all accepted with a guessed bonus, or rejected at a slot with a guessed correction)", 1, 64)
WORKER = ChoiceKnob("worker", str, "process", "'process': the draft in a process on its own core; 'inline': the "
                    "same windows drafted on the calling thread (no overlap)", choices=("process", "inline"))
# Mirror-SD (modalities/drafters/parallel.py): the draft model in a process of its own, drafting the next window
# on the likeliest branches the verification may take while the target verifies this one
register(MethodSpec("parallel", "text", True,
                    "the draft model on a core of its own drafts the next window while the target verifies this "
                    "one, on the likeliest branches the verification may take (all accepted with a guessed bonus, or "
                    "rejected at a slot with a guessed correction); a window is used only when its context is "
                    "the committed one; exact rejection sampling (greedy match at temperature 0)",
                    drafter="parallel", rule="chain", policy="fixed",
                    paper="Bhendawade et al. 2025, Mirror Speculative Decoding (arXiv 2510.13161)",
                    knobs=(NUM_DRAFT_TOKENS,
                           BRANCHES,  # 3: among the fastest of 2-6 on the code pair (docs/parallel.md)
                           Knob("max_matching_ngram_size", int, 5, "longest n-gram prompt lookup matches to fill a "
                                "drafted slot, as in draft-lookup (0: the draft model alone)", 0, 16),
                           MIN_NGRAM_SIZE,
                           WORKER)))
TREE_BUDGET = Knob("tree_budget", int, 16, "drafted tree nodes per step (the root excluded)", 1, 256)
TREE_DEPTH = Knob("max_depth", int, 8, "deepest drafted node (also the loop's draft length)", 1, 64)
register(MethodSpec("sequoia", "text", True,
                    "a static draft tree (Sequoia's dynamic program over an acceptance-by-rank vector, or a named "
                    "shape); children drawn without replacement, verified by the without-replacement tree rule "
                    "(the deterministic rule at temperature 0)", drafter="tree-static", rule="tree",
                    paper="Chen et al. 2024, Sequoia (arXiv 2402.12374)",
                    knobs=(TREE_BUDGET, TREE_DEPTH,
                           Knob("shape", str, "dp", "'dp' (Sequoia's optimal tree for accept_probs), 'eagle' or "
                                "'medusa' (the mc_sim_7b_63 trees), 'chain-N' or 'k-ary-WxD'"),
                           Knob("accept_probs", str, "0.953,0.0268,0.0112,0.0045,0.0045",
                                "P(the r-th drawn child is the accepted one), r = 1, 2, ... (comma-separated; the default "
                                "was measured on the shipped code pair, its distilled draft, by `python -m specgen.app.bench.calibrate`)"))))
register(MethodSpec("dyspec", "text", True,
                    "a dynamic draft tree grown best-first by draft path probability under a node budget; children "
                    "drawn without replacement, verified by the without-replacement tree rule (deterministic at "
                    "temperature 0)", drafter="tree-dyspec", rule="tree",
                    paper="Xiong et al. 2024, DySpec (arXiv 2410.11744)",
                    knobs=(TREE_BUDGET, TREE_DEPTH,
                           Knob("rank_temperature", float, 0.1, "at temperature 0, the temperature of the draft law "
                                "whose path probabilities rank candidate nodes (the shipped code draft's plain softmax "
                                "underrates its first choice)", 0.01, 10.0),
                           Knob("per_round", int, 0, "most nodes added per draft forward past a node whose law is "
                                "still unknown (1: exact best-first; 0: one per 16 nodes of the budget)", 0, 256))))
# a feature head's output rows (eagle, poss, mtp; eagle2 over a head)
OUTPUT_ROWS = Knob("output_rows", int, 0, "a head with a reduced vocabulary drafts over its this many most frequent "
                   "tokens and the prompt's (0: all it kept)", 0, 1 << 20)
register(MethodSpec("eagle2", "text", True,
                    "EAGLE-2's dynamic tree from a draft model or a feature head (`head`): top-k expansion per depth, "
                    "global re-ranking to the node budget; candidates verified by the deterministic tree rule (as "
                    "EAGLE does)",
                    drafter="tree-eagle2", rule="tree", paper="Li et al. 2024, EAGLE-2 (arXiv 2406.16858)",
                    # not `top_k`: that name is the sampling option of every request, so the knob could not be passed
                    knobs=(TREE_BUDGET, Knob("expand_top_k", int, 4, "candidates per expanded node and frontier width "
                                             "(EAGLE-2's top-k)", 1, 32),
                           Knob("depth", int, 5, "expansion rounds (deepest node)", 1, 32),
                           OUTPUT_ROWS,
                           ChoiceKnob("head", str, "model", "the drafter that grows the tree: 'model' (the draft "
                                      "model), 'eagle' (the target's EAGLE head) or 'mtp' (its FastMTP module)",
                                      choices=("model", "eagle", "mtp")))))
register(MethodSpec("svip", "text", True,
                    "a draft model proposes a chain and stops drafting where its entropy predicts rejection "
                    "(sqrt(0.15 H) > threshold); exact rejection sampling (greedy match at temperature 0)",
                    drafter="model", rule="chain", policy="svip", paper="Zhang et al. 2024, SVIP (arXiv 2411.18462)",
                    knobs=(Knob("num_draft_tokens", int, 12, "the most tokens drafted per step", 1, 64),
                           Knob("entropy_threshold", float, 0.3, "stop after a token drawn from a law with "
                                "sqrt(0.15 * entropy) above this", 0.0, 10.0))))
# Model-free drafters (modalities/drafters/stand.py, retrieval.py, dense.py, consensus.py; docs/model_free.md).
# Their trees are verified by the tree rule: without replacement with the store's law (stand), deterministic
# candidates (rest, dresd, consensus), greedy tree matching at temperature 0.
_FREE_BUDGET = Knob("tree_budget", int, 16, TREE_BUDGET.help, 1, 256)
_FREE_DEPTH = Knob("max_depth", int, 8, TREE_DEPTH.help, 1, 64)
DATASTORE = Knob("datastore", str, "", "datastore folder (`specgen datastore build`); empty: the default one for "
                 "the model's tokenizer in the user cache, built on first use from the Python standard library")
MAX_MATCH = Knob("max_match", int, 16, "longest context suffix matched", 1, 16)
MIN_MATCH = Knob("min_match", int, 2, "shortest context suffix that counts as a match", 1, 16)
# every scored slot costs (on Gemma 3 270M its 262k-token output layer): only candidates this likely are drafted
MIN_SHARE = Knob("min_share", float, 0.1, "drop trie nodes carrying less than this share of the retrieved "
                 "continuations' weight", 0.0, 1.0)
CONTEXT_WEIGHT = Knob("context_weight", float, 8.0, "weight of a continuation found in the request's own context "
                      "(a datastore continuation weighs 1; 0: the datastore alone)", 0.0, 1000.0)
register(MethodSpec("stand", "text", True,
                    "model-free: an n-gram store of the target's own laws (top-k at every committed position, the "
                    "prompt's n-grams as point masses), shared by the samples of a request; trees grown best-first "
                    "with children drawn without replacement (Gumbel-top-k) from the store's law, verified by the "
                    "without-replacement tree rule with that law", drafter="stand", rule="tree",
                    paper="Song et al. 2025, STAND (arXiv 2506.04708)",
                    knobs=(Knob("tree_budget", int, 8, TREE_BUDGET.help, 1, 256), _FREE_DEPTH,
                           Knob("max_ngram", int, 4, "longest n-gram key of the store (back-off to 1)", 1, 16),
                           Knob("store_top_k", int, 8, "tokens kept per store entry", 1, 256),
                           ChoiceKnob("share", str, "samples", "'samples': the samples of a request share one store; "
                                      "'none': one store per sample", choices=("samples", "none")),
                           Knob("min_value", float, 0.1, "never try a child whose path probability under the store "
                                "would be below this", 0.0, 1.0))))
register(MethodSpec("rest", "text", True,
                    "model-free sparse retrieval: the longest context suffix looked up in a datastore's suffix array "
                    "(and in the context itself); the continuations merged into a trie of deterministic candidates",
                    drafter="rest", rule="tree", paper="He et al. 2024, REST (arXiv 2311.08252)",
                    knobs=(_FREE_BUDGET, _FREE_DEPTH, DATASTORE, MAX_MATCH, MIN_MATCH,
                           Knob("retrieved", int, 64, "datastore occurrences whose continuations enter the trie",
                                1, 4096), CONTEXT_WEIGHT, MIN_SHARE)))
register(MethodSpec("dresd", "text", True,
                    "model-free dense retrieval: the context's embedding (a model's last hidden state) queries an "
                    "ANN index (faiss) of datastore contexts; their next tokens merged into a trie of deterministic "
                    "candidates", drafter="dresd", rule="tree", paper="Gritta et al. 2025, DReSD (arXiv 2502.15572)",
                    knobs=(_FREE_BUDGET, _FREE_DEPTH, DATASTORE,
                           Knob("neighbours", int, 16, "nearest datastore contexts retrieved per step", 1, 1024),
                           CONTEXT_WEIGHT, MIN_SHARE)))
register(MethodSpec("consensus", "text", True,
                    "model-free, for several samples (--num-samples N): each path's longest suffix matched in the "
                    "other paths; continuations weighted by match length and supporting paths, merged into a trie "
                    "of deterministic candidates; exact per path", drafter="consensus", rule="tree",
                    paper="Li et al. 2025 (arXiv 2503.05330)",
                    knobs=(_FREE_BUDGET, _FREE_DEPTH, Knob("max_match", int, 8, MAX_MATCH.help, 1, 16), MIN_MATCH,
                           Knob("group", int, 16, "samples that draft for each other (samples 0..group-1, then the "
                                "next group)", 1, 1024), MIN_SHARE)))
# Self-speculation (modalities/drafters/kangaroo.py, docs/self_speculation.md): the target's first layers and a
# trained adapter draft; served only where an adapter was trained for the target (`specgen train adapter`). Its own
# confidence stop keeps it out of `auto`'s candidates (those take fixed lengths). Registered last of the text methods:
# the others' knobs keep their places in the demo's positional API (TETRIS's and auto's, shown last, move by two).
register(MethodSpec("kangaroo", "text", True,
                    "self-speculation: the target's first exit_layer layers, a trained one-layer attention adapter "
                    "and the target's own output layer draft a chain, stopping below a top-1 confidence; the full "
                    "target verifies by exact rejection sampling (greedy match at temperature 0)",
                    drafter="kangaroo", rule="chain", policy="kangaroo",
                    paper="Liu et al. 2024, Kangaroo (arXiv 2404.18911)",
                    # defaults: the fastest on the shipped code target's held-out prompts (docs/self_speculation.md),
                    # whose flat laws put the draft's top-1 probability low even where it is right (the paper's 0.6
                    # stops chains); 3, not 4, since the adapter skips its MLP: a 4-slot window costs a 5-slot one less
                    knobs=(Knob("num_draft_tokens", int, 3, "the most tokens drafted per step", 1, 64),
                           Knob("exit_layer", int, 0, "target layers the draft runs before its adapter (an adapter "
                                "must be trained for it; 0: the shallowest trained one)", 0, 256),
                           Knob("confidence", float, 0.0, "stop drafting before a token whose draft top-1 "
                                "probability is below this (0: never; the paper's code uses 0.6)", 0.0, 1.0),
                           # 'recompute' by default: on this CPU a layer over a few slots costs what it costs
                           # over one, and keeping the draft's stream costs more than reuse saves
                           # (benchmarks/kangaroo/shallow-pass-latest.md)
                           ChoiceKnob("shallow_pass", str, "recompute", "'reuse': verification takes the draft's "
                                      "keys, values and stream of the target's first exit_layer layers where they "
                                      "are bit for bit its own; 'recompute': verification runs every layer",
                                      choices=("reuse", "recompute")))))


# DEL (modalities/drafters/dynamic_exit.py, docs/self_speculation.md): Kangaroo's self-drafts at every exit layer with
# a trained adapter, the exit layer and the draft length chosen each step from shadow tokens (what each exit would
# have drafted, read off the target's verification). Registered after kangaroo: the demo's positional API.
register(MethodSpec("del", "text", True,
                    "DEL: self-speculation from the exit layer and draft length predicted fastest each step; every "
                    "exit layer's would-be acceptance is tracked from the target's own verified hidden states "
                    "(shadow tokens through that exit's adapter and output layer, no extra target forward); exact "
                    "rejection sampling (greedy match at temperature 0)",
                    drafter="del", rule="chain", policy="kangaroo",
                    paper="Entezari Zarch et al. 2025, DEL (arXiv 2504.05598)",
                    knobs=(Knob("num_draft_tokens", int, 8, "the longest draft DEL may choose per step", 1, 64),
                           Knob("exit_layers", str, "", "comma-separated exit layers to choose among (each needs a "
                                "trained Kangaroo adapter; empty: every trained one)"),
                           ChoiceKnob("draft_exit", str, "off", "'off': draft the chosen length; 'calibrated': "
                                      "DEL's dynamic draft exit, each row stops where its drafted tokens' chance of "
                                      "all being accepted (the exit's measured match rate per draft confidence) no "
                                      "longer pays for another token", choices=("off", "calibrated")),
                           Knob("confidence", float, 0.0, "stop drafting before a token whose draft top-1 "
                                "probability is below this (0: never)", 0.0, 1.0))))

# EAGLE for text (modalities/drafters/eagle.py, docs/eagle.md): a one-layer head over the target's own features;
# served only where a head was trained for the target (`specgen train head --method eagle`). Registered after
# kangaroo for the same reason (the demo's positional API).
register(MethodSpec("eagle", "text", True,
                    "EAGLE: a one-layer head over the target's own last hidden states (kept while it verifies) and "
                    "the next token's embedding predicts the target's next feature; the target's output rows (a "
                    "reduced set for large vocabularies) turn it into a chain; exact rejection sampling (greedy "
                    "match at temperature 0)",
                    drafter="eagle", rule="chain", paper="Li et al. 2024, EAGLE (arXiv 2401.15077)",
                    knobs=(NUM_DRAFT_TOKENS, LENGTH_SCHEDULE,
                           OUTPUT_ROWS, *TETRIS_KNOBS)))
# PosS (modalities/drafters/poss.py): the EAGLE head's chain, each deeper drafted position from a layer of its own
register(MethodSpec("poss", "text", True,
                    "PosS position specialists: the EAGLE head drafts the first token and trained layers of their "
                    "own the deeper ones (token k from specialist k - 1, the last past its count), each trained on "
                    "the deviated features it reads there; exact rejection sampling (greedy match at temperature 0)",
                    drafter="poss", rule="chain", paper="Huang et al. 2025, PosS (arXiv 2506.03566)",
                    knobs=(NUM_DRAFT_TOKENS, LENGTH_SCHEDULE, OUTPUT_ROWS, *TETRIS_KNOBS)))
# FastMTP (modalities/drafters/mtp.py): one MTP module for every depth, trained recursively on self-distilled data
register(MethodSpec("mtp", "text", True,
                    "FastMTP: one multi-token-prediction module (normed token embedding and hidden state, one "
                    "decoder layer), its weights shared by every drafted position and applied recursively, trained "
                    "on the target's own continuations; the draft's output rows are the most frequent tokens of the "
                    "prompt's kind of text (code or prose) and the prompt's own; exact rejection sampling (greedy "
                    "match at temperature 0)",
                    drafter="mtp", rule="chain", paper="Cai et al. 2025, FastMTP (arXiv 2509.18362)",
                    knobs=(NUM_DRAFT_TOKENS, LENGTH_SCHEDULE, OUTPUT_ROWS,
                           ChoiceKnob("vocabulary", str, "kind", "which list output_rows reads: 'kind' (the one of "
                                      "the prompt's kind of text, code or prose: FastMTP's language-aware "
                                      "compression), 'global' (all training text's), or 'full' (every row of the "
                                      "target's output layer, no compression)", choices=("kind", "global", "full")),
                           *TETRIS_KNOBS)))

# Dynamic inference for code completion (modalities/text/early_exit.py, docs/early_exit.md): lossy, no draft; the loop
# decodes one token per step from the target decoding it to the depth its controllers choose. Registered last: the
# demo's positional API.
register(MethodSpec("early-exit", "text", False,
                    "dynamic inference (lossy): each token leaves the target after the first layer whose trained "
                    "controller predicts a trained exit head gets it right (the skipped layers' keys and values "
                    "copied from that state), and the completion ends where the controller predicts the full "
                    "model would be wrong; no draft, one token per step",
                    drafter=None, rule="none", target="early-exit",
                    paper="Sun et al. 2024, dynamic inference for code completion (arXiv 2401.09964)",
                    # defaults from a sweep on held-out code contexts other than the recorded ones: the fastest exit
                    # threshold; stops off, since even at 0.99 they cost 3 % ROUGE-L there (the paper: 1.1 % in all)
                    # on this target, which is wrong at three tokens in four (docs/early_exit.md)
                    knobs=(Knob("exit_threshold", float, 0.4, "leave at the first layer whose controller gives exit "
                                "at least this probability (1: never, plain decoding's tokens)", 0.0, 1.0),
                           Knob("stop_threshold", float, 1.0, "end the completion where the controller gives stop "
                                "at least this probability (1: never; at 0.99 the target was wrong at 99 in 100 stops "
                                "on held-out code)", 0.0, 1.0),
                           Knob("decision_layers", str, "auto", "comma-separated layers after which the controllers "
                                "decide (and the last, for stops); 'auto': those where held-out tokens leaving saved "
                                "at least 0.1 layer per token; empty: every layer (the paper's)"))))

# PPD (modalities/drafters/ppd.py, docs/ppd.md): trained prompt tokens in the verification window guess the next
# step's drafts; served only where they were trained for the target (`specgen train head --method ppd`). Registered
# after early-exit with no knob of its own: the demo's positional API keeps its order.
register(MethodSpec("ppd", "text", True,
                    "PPD, parallel prompt decoding: trained prompt tokens ride in the target's own verification "
                    "window after every slot and guess the tokens after the next one, which the next step drafts "
                    "(no draft forward, no second model); exact rejection sampling (greedy match at temperature 0)",
                    drafter="ppd", rule="chain", paper="Chen et al. 2024, PPD (arXiv 2405.18628)",
                    # 1 by default: each drafted guess adds a group of that many prompt tokens after every window
                    # slot, and on the code target deeper guesses are rarely right (benchmarks/ppd/code-latest.md)
                    knobs=(Knob("num_draft_tokens", int, 1, "the most guesses drafted per step (at most the trained "
                                "prompt tokens; each adds a prompt token after every window slot)", 1, 16),)))
# Falcon (modalities/drafters/falcon.py, docs/eagle.md): the EAGLE head's chain drafted a block of tokens per head
# forward; served only where a head was trained for the target. Registered last (the demo's positional API).
register(MethodSpec("falcon", "text", True,
                    "Falcon: a semi-autoregressive one-layer head over the target's own features drafts a block of "
                    "tokens (2 as trained) per forward, its pairs seeing their whole block, trained with glancing "
                    "distillation on its own predictions; exact rejection sampling (greedy match at temperature 0)",
                    drafter="falcon", rule="chain", paper="Gao et al. 2025, Falcon (arXiv 2412.12639)",
                    knobs=(NUM_DRAFT_TOKENS, OUTPUT_ROWS)))


# ---- image and video --------------------------------------------------------------------------
WINDOW = Knob("window", int, 32, "Jacobi window L: tokens scored per step (the pending token and L-1 drafts)", 2, 256)
JACOBI_INIT = ChoiceKnob("init", str, "random", "how empty window slots are drafted: 'random' (uniform over image "
                         "codes) or 'left' (copy the previous token)", choices=("random", "left"))
# The coupled methods keep a draft the next pass agrees with, so a good first guess pays off more than for SJD:
# copying the previous code (backgrounds repeat) took 4-7 % fewer steps than random drafts for MC-SJD on images
# (2-12 % for Gumbel) and 10-14 % on clips, while SJD, which redraws every slot anyway, took 2-4 % more
# (docs/image.md).
COUPLED_INIT = ChoiceKnob("init", str, "left", JACOBI_INIT.help, choices=JACOBI_INIT.choices)
# Default windows: the best of `specgen bench image` / `bench video` (benchmarks/image-latest.md, video-latest.md).
for _modality, _sjd_window, _window in (("image", 16, 16), ("video", 16, 32)):
    _knob = Knob("window", int, _window, WINDOW.help, 2, 256)
    register(MethodSpec("ar", _modality, True,
                        "plain autoregressive decoding of the visual token model (the baseline)", drafter=None,
                        rule="none"))
    register(MethodSpec("sjd", _modality, True,
                        "speculative Jacobi decoding: the model drafts its own window; uncommitted slots are "
                        "re-drafted independently from this step's law", drafter="jacobi-independent", rule="chain",
                        paper="Teng et al. 2024", knobs=(Knob("window", int, _sjd_window, WINDOW.help, 2, 256),
                                                         JACOBI_INIT)))
    register(MethodSpec("mc-sjd", _modality, True,
                        "Jacobi decoding with maximal coupling: uncommitted slots keep their draft with probability "
                        "min(1, new law / old law), so the window settles", drafter="jacobi-maximal", rule="chain",
                        paper="So et al. 2025 (MC-SJD / speculative coupled decoding)", knobs=(_knob, COUPLED_INIT)))
    register(MethodSpec("gumbel-sjd", _modality, True,
                        "Jacobi decoding with Gumbel coupling: every step re-drafts with the same Gumbel noise per "
                        "position", drafter="jacobi-gumbel", rule="chain",
                        paper="So et al. 2025 (MC-SJD / speculative coupled decoding)", knobs=(_knob, COUPLED_INIT)))


# Image only: static draft trees from the EAGLE-style head over the image target's features, verified exactly
# (eagle) or with LANTERN's relaxed acceptance over latent neighbours in the VQ codebook (lantern, lantern++).
# Defaults: benchmarks/image-head-shapes/image-lantern-latest.md (the chain sweep) and
# benchmarks/image-lantern-latest.md (the lambda sweep). A chain drafts one code per head forward through the
# compiled draft step, and on one CPU thread a chain returns more than a wide tree. A plain step of the shipped
# target costs about three head levels, so exact verification gains little past 4 deep; the relaxed test accepts
# deeper and peaks at 5.
_TREE_HELP = "static draft tree: 'chain-N', 'k-ary-WxD' or 'eagle' (EAGLE-1's 25-node tree)"
HEAD_TREE = Knob("shape", str, "chain-4", _TREE_HELP)
RELAXED_HEAD_TREE = Knob("shape", str, "chain-5", _TREE_HELP)
NEIGHBOURS = Knob("neighbours", int, 10, "k: latent neighbours a drafted code may borrow target mass from", 1, 4096)
register(MethodSpec("eagle", "image", True,
                    "an EAGLE-style head over the target's features drafts a static tree (children without "
                    "replacement); exact tree verification", drafter="eagle-head", rule="tree",
                    paper="Li et al. 2024, EAGLE (arXiv 2401.15077)", knobs=(HEAD_TREE,)))
register(MethodSpec("lantern", "image", False,
                    "the head's tree of top candidates, each accepted with min(1, p + mass of its nearest latent "
                    "neighbours), the moved mass at most delta (additive); TV-optimal residual",
                    drafter="eagle-head", rule="lantern", paper="Jang et al. 2024, LANTERN (arXiv 2410.03355)",
                    knobs=(RELAXED_HEAD_TREE, NEIGHBOURS,
                           Knob("delta", float, 0.1, "the most target mass a code may borrow (0 = exact)", 0.0, 1.0))))
register(MethodSpec("lantern++", "image", False,
                    "the head's static tree (children without replacement), each code accepted with "
                    "min(1, p~/q) where p~ <= lambda p borrows the mass of its nearest latent neighbours; "
                    "TV-optimal residual", drafter="eagle-head", rule="lantern",
                    paper="Park et al. 2025, LANTERN++ (arXiv 2502.06352)",
                    knobs=(RELAXED_HEAD_TREE, NEIGHBOURS,
                           Knob("lam", float, 10.0, "lambda: p~(x) <= lambda p(x) (1 = exact)", 1.0, 1000.0))))


# ---- speech -----------------------------------------------------------------------------------
SPEECH_DRAFT_TOKENS = Knob("num_draft_tokens", int, 4, NUM_DRAFT_TOKENS.help, 1, 64)
# Defaults for the shipped phoneme target and its 1024-token codebook (docs/speech.md, "PCG and SSD" and the
# frontier under Results): theta 0.5 gives groups of 1.4 tokens on average (74 % singletons), the only theta of the
# measured frontier whose generation stays within the quality bound (dWER upper 95 % bound +0.022); 0.4 and below
# make groups of 3.6-34 tokens that cost +0.38 WER or more in the token-swap test. beta 0.1 bounds each token's
# total variation from the target by 0.1.
PCG_THETA = 0.5
SSD_BETA = 0.1
register(MethodSpec("ar", "speech", True, "plain autoregressive decoding of the speech token model (the baseline)",
                    drafter=None, rule="none"))
register(MethodSpec("sd", "speech", True,
                    "a small draft speech model proposes a chain of acoustic tokens; exact rejection sampling "
                    "(greedy match at temperature 0)", drafter="model", rule="chain", policy="fixed",
                    paper="Leviathan et al. 2023; Chen et al. 2023",
                    knobs=(SPEECH_DRAFT_TOKENS, LENGTH_SCHEDULE)))
register(MethodSpec("parallel", "speech", True,
                    "the draft speech model on a core of its own drafts the next chain while the target verifies "
                    "this one, on the likeliest branches the verification may take; a chain is used only when its "
                    "context is the committed one; exact rejection sampling", drafter="parallel", rule="chain",
                    policy="fixed", paper="Bhendawade et al. 2025, Mirror Speculative Decoding (arXiv 2510.13161)",
                    # 2 tokens, 2 branches: a speech draft forward costs a quarter of a 5-token verify, so longer
                    # chains and more branches outlast the verify they hide behind (docs/parallel.md)
                    knobs=(Knob("num_draft_tokens", int, 2, NUM_DRAFT_TOKENS.help, 1, 64),
                           Knob("branches", int, 2, BRANCHES.help, 1, 64), WORKER)))
register(MethodSpec("ssd", "speech", False,
                    "the draft model's chain verified with a tolerance: a drafted token is accepted if "
                    "u < min(1, target/draft) + beta (never where the target gives it 0), recovered from the "
                    "residual; each token's law stays within total variation min(beta, TV(target, draft)) of the "
                    "target's", drafter="model", rule="tolerance", policy="fixed",
                    paper="Lin et al. 2025, SSD (arXiv 2505.15380)",
                    knobs=(SPEECH_DRAFT_TOKENS,
                           Knob("beta", float, SSD_BETA, "tolerance added to every acceptance probability "
                                "(0 = exact sd)", 0.0, 1.0),
                           LENGTH_SCHEDULE)))
register(MethodSpec("pcg", "speech", False,
                    "the draft model's chain verified on overlapping groups of acoustically similar tokens (cosine "
                    "> theta between the target's input embeddings): rejection sampling on the group variable, "
                    "exact in groups, not in tokens; each committed token is tagged with its group",
                    drafter="model", rule="group", policy="fixed",
                    paper="Yanuka et al. 2025, PCG (arXiv 2511.13732)",
                    knobs=(SPEECH_DRAFT_TOKENS,
                           Knob("theta", float, PCG_THETA, "cosine threshold of the groups (1 = singletons = sd)",
                                0.0, 1.0),
                           ChoiceKnob("residual", str, "explicit", "how the recovered group is drawn: 'explicit' "
                                      "(W target - W draft over every group) or 'thinning' (rejection draws from the "
                                      "target, explicit after 16 empty rounds); both are exact in groups",
                                      choices=("explicit", "thinning")),
                           LENGTH_SCHEDULE)))


# ---- every modality ----------------------------------------------------------------------------
AUTO_KNOBS = (Knob("margin", float, 0.2, "how much faster (predicted) another choice must be before auto switches to "
                   "it (hysteresis; half of it to change the draft length, a quarter to switch where no catch-up "
                   "is paid: docs/auto.md)", 0.0, 1.0),
              Knob("candidates", str, "", "comma-separated methods auto may choose from besides plain decoding "
                   "(empty: every lossless method of the modality the model can serve)"))
for _modality in MODALITIES:
    register(MethodSpec("auto", _modality, True,
                        "picks the method and draft length the calibrated cost model predicts fastest for this "
                        "request (plain decoding included), learns acceptance per position online and switches "
                        "between steps; each step verified by the rule of the method that drafted it",
                        drafter="auto", rule="auto", policy="auto", knobs=AUTO_KNOBS))


if __name__ == "__main__":
    print(render_methods_markdown())
