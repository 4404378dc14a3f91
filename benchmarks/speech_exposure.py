"""Where target-only speech loses its words: one held-out sentence set decoded six ways by one token model.

    python benchmarks/speech_exposure.py [--model assets/speech/target ...] [--corpus assets/speech/corpus] [--n 96] \
        [--out benchmarks/speech-exposure-latest]

On the corpus' held-out utterances (the last 96 of `assets/speech/corpus`, with their aligned character durations)
whose words pocketsphinx knows, each model is decoded

- `teacher_argmax` / `teacher_sample`: each frame predicted from the *true* frames before it (argmax, or a sample at
  temperature 0.8, top-k 50): what the model knows one frame at a time;
- `true_durations_greedy` / `true_durations_T0.8`: free-running on its own frames, but each character held for its
  true number of frames: free-running without the duration choice;
- `free_T0.8` / `free_T0.3`: plain decoding as `SpeechGenerator` runs it (the model picks the durations);

and every token sequence goes through the codebook and Griffin-Lim to pocketsphinx (unigram LM over the sentences'
words). `ceiling` decodes the true tokens. Pooled WER per condition, top-1 accuracy under teacher forcing. Writes
OUT.json and OUT.md.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def conditions(model, vocab, utterance, durations, generator, sample):
    """{condition: acoustic tokens} for one utterance, and the teacher-forced top-1 accuracy."""
    import torch

    frames_only = vocab.num_tokens
    seq, prompt = vocab.sequence(utterance.text, utterance.voice, utterance.tokens, durations)
    with torch.no_grad():
        logits = model(torch.tensor([seq])).logits[0]  # [slots, vocab]
    at = [t for t in range(prompt - 1, len(seq) - 1) if seq[t + 1] < frames_only]  # slots predicting a frame
    out = {"teacher_argmax": [int(logits[t, :frames_only].argmax()) for t in at],
           "teacher_sample": [sample(logits[t], 0.8) for t in at]}
    accuracy = sum(a == int(b) for a, b in zip(out["teacher_argmax"], utterance.tokens)) / len(at)
    for name, temperature in (("true_durations_greedy", 0.0), ("true_durations_T0.8", 0.8)):
        tokens = []
        with torch.no_grad():
            past = model(vocab.prompt_ids(utterance.text, utterance.voice)[None], use_cache=True).past_key_values
            for char, count in zip(vocab.char_ids(utterance.text), durations):
                step = model(torch.tensor([[char]]), past_key_values=past, use_cache=True)
                for _ in range(int(count)):
                    tokens.append(sample(step.logits[0, -1], temperature))
                    step = model(torch.tensor([[tokens[-1]]]), past_key_values=step.past_key_values, use_cache=True)
                past = step.past_key_values
        out[name] = tokens
    for temperature in (0.8, 0.3):
        out[f"free_T{temperature}"] = generator.generate(utterance.text, voice=utterance.voice, method="ar", seed=0,
                                                         temperature=temperature, decode=False).tokens
    return out, accuracy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", nargs="+", default=[str(ROOT / "assets" / "speech" / "target")])
    parser.add_argument("--corpus", default=str(ROOT / "assets" / "speech" / "corpus"),
                        help="the encoded corpus whose durations match the models' text units (a phoneme model "
                             "needs a corpus aligned with --units phonemes); its last 96 utterances are used")
    parser.add_argument("--n", type=int, default=96, help="held-out utterances to consider (the corpus' last)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "speech-exposure-latest"))
    args = parser.parse_args()
    import torch

    from specgen.modalities.speech import codec
    from specgen.modalities.speech.generator import SpeechGenerator
    from specgen.modalities.speech.models import default_paths, load_speech_lm, load_speech_vocab
    from specgen.modalities.speech.training.alignment import load_durations
    from specgen.modalities.speech.training.codebook import VAL_UTTERANCES
    from specgen.modalities.speech.training.evaluate import Recogniser, _words, word_error_rate
    from specgen.modalities.speech.training.quality import load_corpus, split_corpus

    from specgen.settings import use_threads

    use_threads(args.threads)
    paths = default_paths()
    corpus = Path(args.corpus)
    acoustic = codec.AcousticCodec.load(paths["codec"])
    utterances, durations = load_corpus(corpus), load_durations(corpus)
    _, held = split_corpus(utterances, VAL_UTTERANCES)
    first = len(utterances) - len(held)
    held = list(enumerate(held, first))[:args.n]
    recogniser = Recogniser([u.text for _, u in held])
    held = [(i, u) for i, u in held if recogniser.covers(u.text)]
    started = time.perf_counter()
    report = {"command": "python benchmarks/speech_exposure.py --model " + " ".join(args.model)
              + f" --corpus {args.corpus} --n {args.n}",
              "utterances": len(held), "models": {}}
    ceiling = [0, 0]
    for path in args.model:
        model, vocab = load_speech_lm(path), load_speech_vocab(path)
        generator = SpeechGenerator(path, None, paths["codec"])
        noise = torch.Generator().manual_seed(0)

        def sample(logits, temperature, top_k=50):
            frames = logits[:vocab.num_tokens].float()
            if temperature == 0:
                return int(frames.argmax())
            top = torch.topk(frames / temperature, top_k)
            return int(top.indices[torch.multinomial(top.values.softmax(-1), 1, generator=noise)])

        errors, accuracies = {}, []
        for i, u in held:
            decoded, accuracy = conditions(model, vocab, u, durations[i], generator, sample)
            accuracies.append(accuracy)
            if path == args.model[0]:
                decoded = {"ceiling": u.tokens.tolist(), **decoded}
            for name, tokens in decoded.items():
                edits, words = word_error_rate(" ".join(_words(u.text)), recogniser(acoustic.decode(tokens)))
                errors[name] = [errors.get(name, [0, 0])[0] + edits, errors.get(name, [0, 0])[1] + words]
        if "ceiling" in errors:
            ceiling = errors.pop("ceiling")
        report["models"][path] = {"wer": {k: round(e / w, 4) for k, (e, w) in errors.items()},
                                  "teacher_top1": round(sum(accuracies) / len(accuracies), 4)}
    report["ceiling_wer"] = round(ceiling[0] / ceiling[1], 4)
    report["wall_s"] = round(time.perf_counter() - started, 1)
    out = Path(args.out)
    out.with_suffix(".json").write_text(json.dumps(report, indent=1) + "\n")
    names = list(next(iter(report["models"].values()))["wer"])
    lines = [f"# Where target-only speech loses its words ({report['utterances']} held-out utterances)", "",
             f"`{report['command']}` ({report['wall_s']} s). Pooled pocketsphinx WER (unigram LM over the sentences); "
             f"the ceiling (true tokens through the codebook and Griffin-Lim) is **{report['ceiling_wer']}**.", "",
             "| model | teacher top-1 | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(names)]
    for path, row in report["models"].items():
        lines.append(f"| `{Path(path).name}` | {row['teacher_top1']} | "
                     + " | ".join(f"{row['wer'][n]:.3f}" for n in names) + " |")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
