"""The one exception family the library raises; only `atropos_cli.cli` turns them into printed errors and exit codes.

Every error carries a one-line `message` (what happened, with the offending value), a `hint` (the fix, or the
allowed values) and, where it applies, its context: `file` and `line` of a bad input record, the `url` of a
server, the `rollout` index, the `env` name. The CLI prints them (never a traceback) as::

    error: groups.jsonl:3: not valid JSON (Expecting value)
    hint: fix or delete that line, or read without --strict

Exit codes, the same for every command (docs/concepts.md, "Exit codes"):

    0    success
    1    a runtime failure: the command started and the work failed (a server unreachable or answering
         garbage, every group failing, an API refusing or timing out)
    2    a usage error: the command cannot run as given (an unknown flag or env, a bad value or config file,
         an input file that is missing or malformed, an output that already exists, a model that cannot load)
    130  interrupted (Ctrl-C); what was finished is kept
"""

from __future__ import annotations

from typing import Literal

__all__ = [
    "RankFailed",
    "AtroposWarning",
    "EXIT_RUNTIME",
    "EXIT_USAGE",
    "EXIT_INTERRUPTED",
    "AtroposError",
    "UsageError",
    "ConfigError",
    "EnvNotFoundError",
    "EnvLoadError",
    "InputError",
    "RecordError",
    "OutputExistsError",
    "ModelLoadError",
    "InferenceError",
    "ServerUnreachableError",
    "BadResponseError",
    "BadRequestError",
    "RetryableError",
    "EndpointError",
    "ApiError",
    "ApiRequestError",
    "ApiUnavailableError",
    "ApiBusy",
    "ApiConflict",
    "ApiNotFound",
    "ApiInvalid",
    "ApiWaitTimeout",
    "WireError",
    "PortUnavailableError",
    "EnvCodeError",
    "RunAborted",
    "JudgeOutputError",
]

EXIT_RUNTIME = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


class AtroposError(Exception):
    """Base class: a user-facing failure with a message, a hint and where it happened (exit code 1)."""

    exit_code = EXIT_RUNTIME

    def __init__(
        self,
        message: str,
        hint: str | None = None,
        *,
        file: str | None = None,
        line: int | None = None,
        url: str | None = None,
        rollout: int | None = None,
        env: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.file, self.line, self.url, self.rollout, self.env = file, line, url, rollout, env

    @property
    def where(self) -> str | None:
        """The context as one prefix: `file:line`, the url, `rollout N`, `env NAME` (None when none is set)."""
        parts = []
        if self.env is not None:
            parts.append(f"env {self.env}")
        if self.file is not None:
            parts.append(f"{self.file}:{self.line}" if self.line is not None else str(self.file))
        if self.url is not None:
            parts.append(self.url)
        if self.rollout is not None:
            parts.append(f"rollout {self.rollout}")
        return ", ".join(parts) or None

    @property
    def text(self) -> str:
        """The message with its context in front: what the CLI prints after `error:`."""
        return f"{self.where}: {self.message}" if self.where else self.message

    def __str__(self) -> str:
        return self.text if not self.hint else f"{self.text} (hint: {self.hint})"


# --- exit code 2: the command cannot run as given --------------------------------------------------------


class UsageError(AtroposError):
    """A flag, a combination of flags or an argument is wrong."""

    exit_code = EXIT_USAGE


class ConfigError(UsageError):
    """A config file or flag is malformed, unknown or has a bad value."""


class EnvNotFoundError(UsageError):
    """No env matches the name or path the user gave."""


class EnvLoadError(UsageError):
    """An env file exists but cannot be imported (syntax error, missing class, import failure)."""


class InputError(UsageError):
    """An input path the user gave is missing, empty or not rollouts."""


class RecordError(InputError):
    """A record (group, line, row) is malformed; `file`/`line` or the message name it."""


class OutputExistsError(UsageError):
    """An output path exists and neither --resume nor --overwrite was given."""


class ModelLoadError(UsageError):
    """A local model or tokenizer cannot be loaded."""


# --- exit code 1: the work started and failed ------------------------------------------------------------


class InferenceError(AtroposError):
    """An inference request failed after its retries."""


class ServerUnreachableError(InferenceError):
    """No inference server answered at the configured URL(s)."""


class BadResponseError(InferenceError):
    """A server answered with something that is not a valid completion."""


class BadRequestError(InferenceError):
    """The request cannot be served as asked (prompt too long, no chat template, bad role): HTTP 400."""


class RetryableError(InferenceError):
    """A failure worth retrying (maybe on another server): 429, 5xx, a timeout, or no connection."""

    def __init__(
        self,
        message: str,
        *,
        url: str,
        kind: Literal["connection", "timeout", "status"],
        status: int | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message, "check that the server at this URL is up and serving the model", url=url)
        self.kind = kind
        self.status = status
        self.retry_after = retry_after


class EndpointError(InferenceError):
    """One vLLM endpoint call failed: `endpoint` and `status` (None when the server could not be reached)."""

    def __init__(self, endpoint: str, status: int | None, detail: str) -> None:
        shown = f"HTTP {status}" if status is not None else "no response"
        super().__init__(
            f"{endpoint} failed: {shown} {detail!r}", hint="see OUT/vllm.log for the vLLM server's own messages"
        )
        self.endpoint, self.status, self.detail = endpoint, status, detail


class ApiError(AtroposError):
    """The trajectory API (ours or Atropos' run-api) failed a request; `status` is its HTTP status, if any."""

    status: int | None = None


class ApiRequestError(ApiError):
    """The API refused a request (4xx): retrying the same request cannot help."""

    def __init__(self, message: str, status: int, hint: str | None = None, *, url: str | None = None) -> None:
        super().__init__(message, hint, url=url)
        self.status = status


class ApiUnavailableError(ApiError):
    """The API could not be reached (or stayed busy) for longer than the client's `max_wait_s`."""


class ApiBusy(ApiError):
    """The queue is full: the client should retry later (HTTP 503 + Retry-After)."""

    status = 503


class ApiConflict(ApiError):
    """The request is valid but the server is not in a state to accept it (HTTP 409)."""

    status = 409


class ApiNotFound(ApiError):
    """An id that does not exist (HTTP 404)."""

    status = 404


class ApiInvalid(ApiError):
    """A well-formed request that this run can never serve, e.g. a group larger than the batch (HTTP 422)."""

    status = 422


class ApiWaitTimeout(ApiError):
    """The trajectory API served no batch for too long."""


class WireError(ApiError):
    """A request the API refuses at its HTTP edge: `status`, the message, and `reason` (the metrics label)."""

    status: int

    def __init__(self, status: int, message: str, reason: str, hint: str | None = None) -> None:
        super().__init__(message, hint)
        self.status = status
        self.reason = reason


class PortUnavailableError(AtroposError):
    """A server cannot listen on its host:port (taken by another process, or not an address of this machine)."""


class EnvCodeError(AtroposError):
    """An env hook raised something that is not an AtroposError: a bug (or an unmet need) in the env's code."""


class RunAborted(AtroposError):
    """The run cannot continue (server unreachable, or every group failing the same way)."""


class EmptyDrawsError(RunAborted):
    """Too many draws in a row had nothing to train on; every rank of a many-GPU run sees the same draws and
    stops at the same one."""


class RankFailed(AtroposError):
    """A process of a many-GPU run died or exited with an error; the launcher stopped every other rank."""


class PeerLost(AtroposError):
    """A rank of a many-GPU run lost a peer rank (its connection reset): the launcher, which stops every rank,
    names the rank that failed and how, so this rank exits without an error line of its own (`quiet`)."""

    quiet = True


class JudgeOutputError(AtroposError):
    """The judge's answer had no parseable score or verdict (after the retries)."""


class AtroposWarning(UserWarning):
    """A warning of ours: the CLI prints it as one `warning:` line (never Python's warning format)."""
