"""Error types users see. Each carries a message meant to be printed as one clear line."""


class NextokError(Exception):
    """Base class: the CLI prints `error: <message>` and exits non-zero; the server maps to 4xx."""


class ModelLoadError(NextokError):
    """Missing, corrupt or unsupported model file or checkpoint."""


class ModelNotFoundError(ModelLoadError):
    """A --model value that is neither a path nor a known alias."""


class InvalidRequestError(NextokError, ValueError):
    """A request the engine refuses: empty prompt, too long, bad sampling values."""
