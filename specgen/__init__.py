"""specgen: one draft-verify engine for text, image/video and speech tokens.

Nothing heavy happens at import: `import specgen` loads no torch, so the CLI answers `--help` fast.
The generators named in `__all__` are loaded on first attribute access.
"""

from specgen.errors import (  # noqa: F401  (re-exported)
    InvalidRequest,
    MissingExtra,
    ModelNotFound,
    NotAvailable,
    SpecgenError,
    VocabularyMismatch,
)

__version__ = "0.1.0"

# name -> (module, attribute, what provides it)
_LAZY = {
    "TextGenerator": ("specgen.modalities.text", "TextGenerator", "text modality"),
    "ImageGenerator": ("specgen.modalities.image", "ImageGenerator", "image modality"),
    "SpeechGenerator": ("specgen.modalities.speech", "SpeechGenerator", "speech modality"),
}

__all__ = ["SpecgenError", "InvalidRequest", "ModelNotFound", "VocabularyMismatch", "MissingExtra",
           "NotAvailable", *_LAZY]


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'specgen' has no attribute {name!r}")
    import importlib

    module_name, attr, what = _LAZY[name]
    module = importlib.import_module(module_name)
    try:
        return getattr(module, attr)
    except AttributeError:
        raise NotAvailable(f"{name} is not available in specgen {__version__} (the {what} is not built yet)") from None
