"""The service's refusals: an `ApiRequestError` with its HTTP status, message and hint (the app renders it)."""

from __future__ import annotations

from atropos_cli.errors import ApiRequestError


def invalid(message: str, hint: str | None = None) -> ApiRequestError:
    """A payload this server cannot read or serve (400)."""
    return ApiRequestError(message, 400, hint)


def not_found(message: str, hint: str | None = None) -> ApiRequestError:
    return ApiRequestError(message, 404, hint)


def unsupported(message: str, hint: str | None = None) -> ApiRequestError:
    """A call the Tinker API has but this server does not serve (422: the SDK retries 5xx)."""
    return ApiRequestError(message, 422, hint)


def full(message: str, hint: str | None = None) -> ApiRequestError:
    """No room (the training-slot limit): 422, which the SDK does not retry (it retries 408, 409, 429, 5xx)."""
    return ApiRequestError(message, 422, hint)
