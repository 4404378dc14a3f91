"""`SpeechGenerator`: text to acoustic tokens by plain or speculative decoding, and tokens to a waveform.

A request is a sentence and a voice; the prompt is [BOS, voice, characters, BOA] and generation runs until EOS
or `max_new_tokens` tokens. One `Processing` (temperature, top-k, top-p, and what may come next: acoustic tokens
and EOS, or for an interleaved model `SpokenInOrder`) serves plain decoding, verification and the draft alike.
Methods come from the registry: `ar` (plain decoding), `sd` (a small draft model proposes chains; exact rejection
sampling, greedy matching at temperature 0) and two relaxed verifications of the same chains, lossy by design:
`ssd` (a tolerance beta on every acceptance) and `pcg` (rejection sampling on groups of similar acoustic tokens,
exact in groups; the groups are built from the target's embeddings once per theta and cached, see
`specgen.modalities.speech.groups`).
Without arguments it loads the models shipped in `assets/speech/`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Iterator

import numpy as np
import torch

from specgen.settings import use_threads
from specgen.errors import InvalidRequest, VocabularyMismatch
from specgen.modalities.drafters.model import ModelDrafter
from specgen.modalities.speech.codec import AcousticCodec
from specgen.modalities.speech.groups import check_theta, load_or_build_groups
from specgen.modalities.speech.models import (CALIBRATION_TEXTS, DEFAULT_VOICE, EXAMPLE_TEXT, SpeechVocab,
                                              default_paths, load_speech_lm, load_speech_vocab)
from specgen.modalities.pipeline import Generator
from specgen.modalities.runtime.transformers_adapter import TransformersTarget, measure_window_s
from specgen.samplers.acceptance import make_rule
from specgen.samplers.processing import Processing
from specgen.samplers.registry import get_method
from specgen.samplers.groups import TokenGroups
from specgen.samplers.stats import SpecStats
from specgen.samplers.types import StepEvent

# Sampling defaults for the shipped models (a small model's flat tail over 1024 tokens makes plain T=1 noisy).
DEFAULT_TEMPERATURE = 0.8
DEFAULT_TOP_K = 50
FRAMES_PER_CHAR = 8  # default length cap: 8 frames (128 ms) per character plus 40; the corpus averages under 5


@dataclass(frozen=True)
class AcousticOnly:
    """Position constraint: every generated slot is an acoustic token or EOS."""

    num_tokens: int
    eos: int

    def __call__(self, logits: torch.Tensor, positions: torch.Tensor | None) -> torch.Tensor:
        banned = torch.ones(logits.shape[-1], dtype=torch.bool)
        banned[:self.num_tokens] = False
        banned[self.eos] = False
        return logits.masked_fill(banned, float("-inf"))


@dataclass(frozen=True)
class SpokenInOrder:
    """Prefix constraint of the interleaved layout. After BOA the text's characters come in order, each followed
    by at least one frame; EOS comes after the last character's frames. Between characters the model's wish to move
    on (its probability of any character or of EOS) goes to the text's next character, or to EOS after the last:
    the model picks how long each character lasts, never which character comes next. Other tokens are masked."""

    vocab: SpeechVocab

    def routes(self, context: torch.Tensor, continuation) -> torch.Tensor:
        v, char_base = self.vocab, self.vocab.char_base
        ids = torch.as_tensor(context)
        boa = int((ids == v.boa).nonzero()[0, 0])  # one tensor scan per step, not a Python pass over the context
        text = ids[2:boa].tolist()  # [BOS, voice, characters..., BOA]
        spoken = int((ids[boa + 1:] >= char_base).sum())
        last = int(ids[-1])
        rows = []
        for i in range(len(continuation) + 1):
            if last == v.boa:
                rows.append(torch.full((v.vocab_size,), text[0]))  # the first character is certain
            elif last >= char_base:
                rows.append(self._frames)
            else:  # after a frame: staying, or moving on to the next character (EOS after the last)
                rows.append(self._frames.masked_fill(self._onward, text[spoken] if spoken < len(text) else v.eos))
            if i < len(continuation):
                last = int(continuation[i])
                spoken += last >= char_base
        return torch.stack(rows)

    @cached_property
    def _frames(self) -> torch.Tensor:
        """[vocab] every frame to itself, everything else masked."""
        routes = torch.full((self.vocab.vocab_size,), -1)
        routes[:self.vocab.num_tokens] = torch.arange(self.vocab.num_tokens)
        return routes

    @cached_property
    def _onward(self) -> torch.Tensor:
        """[vocab] bool: the tokens that mean moving on (every character, and EOS)."""
        onward = torch.zeros(self.vocab.vocab_size, dtype=torch.bool)
        onward[self.vocab.char_base:] = True
        onward[self.vocab.eos] = True
        return onward


@dataclass(frozen=True)
class SpeechResult:
    audio: np.ndarray  # float32 mono waveform of the first sample
    sample_rate: int
    tokens: list[int]  # acoustic tokens of the first sample (EOS dropped)
    stats: dict
    samples: list[dict]  # one {"tokens", "audio"} per sample (and "groups" with pcg)
    groups: list[int] | None = None  # pcg: the group each token of the first sample was committed in


class SpeechGenerator(Generator):
    modality = "speech"
    example_prompt = EXAMPLE_TEXT  # the demo's first text, and the request `auto`'s calibration times windows after

    def __init__(self, model: str | Path | None = None, draft: str | Path | None = None,
                 codec: str | Path | None = None, *, threads: int | None = 1, dtype: torch.dtype = torch.float32):
        if threads:
            use_threads(threads)
        paths = default_paths()
        self.model_path = Path(model or paths["target"])
        self.draft_path = Path(draft) if draft else (paths["draft"] if model is None else None)
        self.codec_path = Path(codec or paths["codec"])
        self.model = load_speech_lm(self.model_path, dtype)
        self.vocab = load_speech_vocab(self.model_path)
        self.dtype = dtype
        self._draft_model = None
        self._codec = None
        self._groups: dict[float, TokenGroups] = {}  # PCG's groups per theta

    def encode(self, text: str) -> torch.Tensor:
        """The prompt of `text` in the default voice."""
        return self.vocab.prompt_ids(text, DEFAULT_VOICE)

    def calibration_prompts(self) -> list[str]:
        """The texts `auto`'s calibration measures each candidate's acceptance from."""
        return [self.example_prompt, *CALIBRATION_TEXTS]

    @property
    def codec(self) -> AcousticCodec:
        if self._codec is None:
            self._codec = AcousticCodec.load(self.codec_path)
            if self._codec.num_tokens != self.vocab.num_tokens:
                raise VocabularyMismatch(f"the codebook has {self._codec.num_tokens} tokens but the speech model "
                                         f"expects {self.vocab.num_tokens}")
        return self._codec

    @property
    def sample_rate(self) -> int:
        return self.codec.cfg.sample_rate

    @property
    def draft_model(self):
        if self._draft_model is None:
            if self.draft_path is None:
                raise InvalidRequest("a method with a draft (sd, ssd, pcg) needs a draft model (draft=PATH)")
            self._draft_model = load_speech_lm(self.draft_path, self.dtype)
            if load_speech_vocab(self.draft_path) != self.vocab:
                raise VocabularyMismatch(f"the draft in {str(self.draft_path)!r} has another vocabulary than the "
                                         f"target in {str(self.model_path)!r}")
        return self._draft_model

    def groups(self, theta: float) -> TokenGroups:
        """PCG's groups of the target's acoustic tokens at `theta` (built once, then from the cache)."""
        theta = check_theta(theta)
        if theta not in self._groups:
            self._groups[theta] = load_or_build_groups(self.model, self.vocab.num_tokens, self.vocab.vocab_size, theta)
        return self._groups[theta]

    def rule(self, method: str, processing: Processing, knobs: dict):
        """The acceptance rule of a method with its resolved knobs (pcg's groups are built, or loaded, here)."""
        spec = get_method("speech", method)
        return make_rule(spec.rule, processing, **self.rule_options(spec, knobs, None))

    def processing(self, *, temperature: float | None = None, top_k: int | None = None,
                   top_p: float = 1.0) -> Processing:
        constrained = self.vocab.layout == "interleaved"
        return Processing(temperature=DEFAULT_TEMPERATURE if temperature is None else temperature,
                          top_k=DEFAULT_TOP_K if top_k is None else top_k, top_p=top_p,
                          hooks=() if constrained else (AcousticOnly(self.vocab.num_tokens, self.vocab.eos),),
                          constraint=SpokenInOrder(self.vocab) if constrained else None)

    def max_new_tokens_for(self, text: str, voice: str = DEFAULT_VOICE, max_new_tokens: int | None = None) -> int:
        """The length cap of a request: the given one (checked against the context), or the default for the text."""
        return self.length_cap([self.vocab.prompt_ids(text, voice)], max_new_tokens)

    def stream(self, text: str, *, method: str | None = None, voice: str = DEFAULT_VOICE,
               max_new_tokens: int | None = None,
               temperature: float | None = None, top_k: int | None = None, top_p: float = 1.0, seed: int = 0,
               num_samples: int = 1, stats: SpecStats | None = None, **params) -> Iterator[StepEvent]:
        pipeline, prompts = self._request(text, voice, method, num_samples, max_new_tokens, stats, params,
                                          temperature=temperature, top_k=top_k, top_p=top_p)
        yield from pipeline.run(prompts, seed=seed)

    def _request(self, text: str, voice: str, method: str | None, num_samples: int, max_new_tokens: int | None,
                 stats: SpecStats | None, params: dict, **sampling):
        self.check_request(method, num_samples, params)
        prompt_ids = self.vocab.prompt_ids(text, voice)
        pipeline = self.pipeline(method, [prompt_ids], max_new_tokens=max_new_tokens, sampling=sampling,
                                 params=params, stats=stats)
        return pipeline, [prompt_ids] * num_samples

    # ---- the pipeline's parts (modalities/pipeline.py) -------------------------------------------------------

    @property
    def stop_tokens(self) -> tuple[int, ...]:
        return (self.vocab.eos,)

    def length_cap(self, prompts, max_new_tokens: int | None) -> int:
        prompt = prompts[0]
        room = self.model.config.max_position_embeddings - len(prompt)
        if max_new_tokens is None:  # the interleaved layout also spends one token per character
            per_char = FRAMES_PER_CHAR + (self.vocab.layout == "interleaved")
            return min(room, per_char * (len(prompt) - 3) + 40)
        if not 1 <= max_new_tokens <= room:
            raise InvalidRequest(f"max_new_tokens must be between 1 and {room} for this text ({len(prompt)} prompt "
                                 f"tokens, context {self.model.config.max_position_embeddings}), got {max_new_tokens}")
        return max_new_tokens

    def engine(self, capacity: int | None) -> TransformersTarget:
        return self._target()

    def drafter(self, spec, knobs: dict, processing: Processing, policy, engine):
        if spec.drafter == "model":
            return ModelDrafter(self.draft_model, processing, target_vocab_size=self.vocab.vocab_size)
        if spec.drafter == "parallel":  # the draft on a core of its own (modalities/drafters/parallel.py)
            from specgen.modalities.drafters.parallel import parallel_drafter

            draft = self.draft_model  # loads and checks it here, before a process starts
            return parallel_drafter(knobs, draft, self.draft_path, self.vocab.vocab_size, processing,
                                    loader="speech")
        return super().drafter(spec, knobs, processing, policy, engine)

    def rule_options(self, spec, knobs: dict, drafter) -> dict:
        if spec.rule == "group":
            return {"groups": self.groups(knobs["theta"]), "residual": knobs["residual"]}
        if spec.rule == "tolerance":
            return {"beta": knobs["beta"]}
        return {}

    def generate(self, text: str, *, method: str | None = None, ar_step_s: float | None = None, decode: bool = True,
                 voice: str = DEFAULT_VOICE, max_new_tokens: int | None = None, seed: int = 0, num_samples: int = 1,
                 **options) -> SpeechResult:
        """Tokens, waveform (decode=False skips the vocoder: audio stays empty) and the stats of one request."""
        sampling = {k: options.pop(k) for k in ("temperature", "top_k", "top_p") if k in options}
        pipeline, prompts = self._request(text, voice, method, num_samples, max_new_tokens, None, options, **sampling)
        result = pipeline.generate(prompts, seed=seed, ar_step_s=ar_step_s)
        summary = result.stats
        groups: list[list[int]] = [[] for _ in range(num_samples)]  # pcg tags every committed token with its group
        for event in result.events:
            groups[event.row].extend(event.extra.get("groups", ()))
        # characters (interleaved layout) and EOS are not frames
        groups = [self.vocab.acoustic_tags(row, tags) if tags else None for row, tags in zip(result.tokens, groups)]
        tokens = [self.vocab.acoustic(row) for row in result.tokens]
        summary["audio_s"] = len(tokens[0]) / self.codec.cfg.frame_rate if decode else None
        audios = [self.decode(t) if decode else np.zeros(0, np.float32) for t in tokens]
        samples = [{"tokens": t, "audio": a, **({"groups": g} if g is not None else {})}
                   for t, a, g in zip(tokens, audios, groups)]
        return SpeechResult(audios[0], self.sample_rate if decode else 0, tokens[0], summary, samples, groups[0])

    def decode(self, tokens: list[int]) -> np.ndarray:
        """Acoustic tokens -> float32 waveform at `sample_rate` (codebook centroids, InverseMelScale, Griffin-Lim)."""
        return self.codec.decode(tokens)

    def measure_step_s(self, text: str, voice: str = DEFAULT_VOICE, repeats: int = 3) -> float:
        """Median time of one plain decoding step after the prompt: T_ar for the cost model."""
        return measure_window_s(self._target(), self.vocab.prompt_ids(text, voice), 1, repeats)

    def _target(self) -> TransformersTarget:
        # the compiled decoding step (`kernels.decode_step`): about twice as fast as torch for this small model's
        # one-token steps, and bitwise row-invariant, so a slot scores the same alone and in a verified window
        return TransformersTarget(self.model, decode_kernel=True)
