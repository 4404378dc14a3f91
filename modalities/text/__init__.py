"""Text modality: drafters, tokenizer handling and text models; their corpus and trainers in `training/`.

`TextGenerator` is loaded on first access, so importing this package stays cheap."""


def __getattr__(name: str):
    if name == "TextGenerator":
        from specgen.modalities.text.generator import TextGenerator

        return TextGenerator
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
