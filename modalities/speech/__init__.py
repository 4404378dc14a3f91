"""Speech tokens: the offline corpus (`data`), the acoustic tokenizer and vocoder (`codec`), the text-conditioned
speech token models and their trainer (`models`, `train`) and `SpeechGenerator` (`generator`)."""


def __getattr__(name: str):
    if name == "SpeechGenerator":  # loaded on first use: importing the package stays cheap
        from specgen.modalities.speech.generator import SpeechGenerator

        return SpeechGenerator
    raise AttributeError(f"module 'specgen.modalities.speech' has no attribute {name!r}")
