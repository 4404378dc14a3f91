"""Scoring the speech bench's decoded runs for its speed/quality frontier: pocketsphinx word errors and the
speaker-similarity proxy of every sampled run, the token-swap stress test on held-out corpus utterances, and the
frontier assembled from them (its statistics and report are `speech_frontier`'s)."""

from __future__ import annotations

from pathlib import Path


class QualityScorer:
    """Decoded speech -> {"edits", "words", "similarity"}: pocketsphinx with a unigram LM over the evaluation
    sentences' words (as `specgen.modalities.speech.training.evaluate`), and the speaker-similarity proxy against
    voice profiles built from training utterances of the corpus decoded through the same codec."""

    def __init__(self, recogniser, profiles, swap_set, corpus_path, references):
        self.recogniser, self.profiles, self.swap_set = recogniser, profiles, swap_set
        self.corpus_path, self.references = corpus_path, references

    @classmethod
    def build(cls, generator, prompts, corpus, swap_utterances: int, reference_per_voice: int) -> "QualityScorer":
        """Checks the corpus against the codebook and the prompts' voices before any timing."""
        from specgen.errors import InvalidRequest
        from specgen.modalities.speech.models import default_paths
        from specgen.modalities.speech.training.evaluate import Recogniser
        from specgen.modalities.speech.training.quality import (VoiceProfiles, decoded_references, load_corpus,
                                                                split_corpus)
        from specgen.modalities.speech.training.codebook import VAL_UTTERANCES

        corpus = Path(corpus or default_paths()["codec"].parent / "corpus")
        training, held_out = split_corpus(load_corpus(corpus), VAL_UTTERANCES)
        if any(int(u.tokens.max(initial=0)) >= generator.vocab.num_tokens for u in training + held_out):
            raise InvalidRequest(f"the corpus {corpus} has tokens beyond the codebook's {generator.vocab.num_tokens}")
        missing = sorted({p["voice"] for p in prompts} - {u.voice for u in training})
        if missing:
            raise InvalidRequest(f"the corpus {corpus} has no utterances of voice(s) {', '.join(missing)}")
        recogniser = Recogniser([p["text"] for p in prompts] + [u.text for u in held_out])
        swap_set = [u for u in held_out if recogniser.covers(u.text)][:swap_utterances]  # words pocketsphinx knows
        references = decoded_references(generator.codec, training, reference_per_voice)
        return cls(recogniser, VoiceProfiles.fit(references, generator.codec.cfg), swap_set, corpus,
                   {v: len(a) for v, a in references.items()})

    def measure(self, audio, text: str, voice: str) -> dict:
        edits, words = self.recogniser.errors(audio, text)
        return {"edits": edits, "words": words, "similarity": self.profiles.similarity(audio, voice)}

    def describe(self) -> dict:
        from importlib.metadata import version

        from specgen.modalities.speech.training.quality import CEPSTRA

        return {"recogniser": f"pocketsphinx {version('pocketsphinx')} (en-us acoustic model and dictionary) with a "
                              "unigram LM over the words of the prompts and the held-out swap-test sentences",
                "speaker_proxy": f"cosine between the standardised mean and std of cepstra c1..c{CEPSTRA - 1} over "
                                 "speech frames and the voice's profile, the mean over "
                                 f"{min(self.references.values(), default=0)} corpus training utterances of that "
                                 "voice decoded through the same codec",
                "corpus": str(self.corpus_path), "references_per_voice": self.references}


def build_frontier(variants, summaries, items, scorer, generator, thetas, swap_rate: float) -> dict:
    """Per variant its speed against `ar` and `sd` (and with a scorer its quality change against `ar`); with a
    scorer also the swap test per theta, the speaker proxy's separation and the chosen theta."""
    from specgen.app.bench.speech_frontier import (QualityBound, choose_theta, quality_deltas, speedup,
                                                   summarise_swaps)
    from specgen.modalities.speech.training.quality import separation, swap_test

    rows = []
    for v in variants:
        s = summaries[v.key]
        row = {"variant": v.key, "label": v.label, "method": v.method, "knob": v.knob, "value": v.value,
               "lossless": s["lossless"], "runs": s["runs"], "tau": s["tau"], "alpha_hat": s["alpha_hat"],
               "exact_alpha_hat": s.get("exact_alpha_hat"), "acceptance_level": s.get("acceptance_level"),
               **speedup(items, v.key, "speedup_vs_ar"), **speedup(items, v.key, "speedup_vs_sd")}
        rows.append(row | (quality_deltas(items, v.key) if scorer is not None else {}))
    frontier = {"rows": rows, "swap_test": [], "swap_rows": [], "speaker_proxy": None, "choice": None,
                "setup": {"swap_rate": swap_rate, "thetas": list(thetas)}}
    if scorer is None:
        return frontier

    def measure(audio, utterance):
        return scorer.measure(audio, utterance.text, utterance.voice)

    swap_rows, decoded = swap_test(generator.codec, scorer.swap_set, {t: generator.groups(t) for t in thetas},
                                   measure, rate=swap_rate)
    swaps = summarise_swaps(swap_rows)
    frontier |= {"swap_test": swaps, "swap_rows": swap_rows, "speaker_proxy": separation(scorer.profiles, decoded),
                 "choice": choose_theta(rows, swaps, QualityBound()),
                 "setup": {**frontier["setup"], **scorer.describe()}}
    return frontier
