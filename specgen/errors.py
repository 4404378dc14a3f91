"""The exception hierarchy. The CLI maps every `SpecgenError` to exit code 2 and one `error:` line."""


class SpecgenError(Exception):
    """Base class of every error specgen raises on purpose."""


class InvalidRequest(SpecgenError, ValueError):
    """A request that cannot be served as given (bad argument, bad value, unknown method)."""


class ModelNotFound(SpecgenError, FileNotFoundError):
    """A model path or id that is not available offline."""


class VocabularyMismatch(SpecgenError, ValueError):
    """Target and draft disagree on the token vocabulary."""


class MissingExtra(SpecgenError, ImportError):
    """An optional dependency group (`pip install specgen[NAME]`) is needed."""


class NotAvailable(SpecgenError):
    """A feature that this version of specgen does not provide yet."""
