"""Speech tokens: the acoustic tokenizer and vocoder (`codec`), the text-conditioned speech token models
(`models`, with the corpus' voices and alphabet in `voices`) and `SpeechGenerator` (`generator`); the offline
corpus, the trainers and the quality measures in `training/`."""


def __getattr__(name: str):
    if name == "SpeechGenerator":  # loaded on first use: importing the package stays cheap
        from specgen.modalities.speech.generator import SpeechGenerator

        return SpeechGenerator
    raise AttributeError(f"module 'specgen.modalities.speech' has no attribute {name!r}")
