"""The exception family the library raises; only `atropos_cli.cli` turns them into printed errors and exit codes.

Every error carries a one-line `message` (what happened, with the offending value) and an optional `hint`
(the fix, or the allowed values). The CLI prints them as::

    error: unknown env 'gsm9k'
    hint: bundled envs: arithmetic, letter_counting, ...
"""

from __future__ import annotations

__all__ = [
    "AtroposError",
    "ConfigError",
    "EnvNotFoundError",
    "EnvLoadError",
    "RecordError",
    "InferenceError",
    "ServerUnreachableError",
    "BadResponseError",
    "OutputExistsError",
    "ModelLoadError",
]


class AtroposError(Exception):
    """Base class: a user-facing failure with a message and an optional hint."""

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message} (hint: {self.hint})"


class ConfigError(AtroposError):
    """A config file or flag is malformed, unknown or has a bad value."""

    exit_code = 2


class EnvNotFoundError(AtroposError):
    """No env matches the name or path the user gave."""

    exit_code = 2


class EnvLoadError(AtroposError):
    """An env file exists but cannot be imported (syntax error, missing class, import failure)."""

    exit_code = 2


class RecordError(AtroposError):
    """A record (group, line, row) is malformed; the message names the bad rollout or line."""


class InferenceError(AtroposError):
    """An inference request failed after its retries."""


class ServerUnreachableError(InferenceError):
    """No inference server answered at the configured URL(s)."""


class BadResponseError(InferenceError):
    """A server answered with something that is not a valid completion."""


class OutputExistsError(AtroposError):
    """An output path exists and neither --resume nor --overwrite was given."""

    exit_code = 2


class ModelLoadError(AtroposError):
    """A local model or tokenizer cannot be loaded."""

    exit_code = 2
