"""Keeping third-party chatter off the user's terminal unless `atropos --verbose` (or ATROPOS_VERBOSE=1).

What is quieted, and where: every `atropos` command starts with `quiet_third_party`, which sets the env vars
that huggingface_hub, transformers and datasets read at import (no progress bars, warnings and errors only),
before any of them is imported; `quiet_datasets` does the same around a hub load for library callers; and
`log_once` lets a third-party message repeated once per call through once (math-verify warns on every parse
that timeouts are off outside the main thread). Errors are never hidden.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["VERBOSE_ENV", "verbose", "quiet_third_party", "quiet_datasets", "log_once"]

VERBOSE_ENV = "ATROPOS_VERBOSE"


def verbose() -> bool:
    return os.environ.get(VERBOSE_ENV, "") not in ("", "0")


# Read by huggingface_hub (bars of downloads and of transformers/datasets), transformers and datasets at import.
_QUIET_ENV = {
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "TRANSFORMERS_VERBOSITY": "error",
    "DATASETS_VERBOSITY": "error",
    "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
}


def quiet_third_party(verbose_flag: bool) -> None:
    """`atropos [--verbose] CMD`: with --verbose (or ATROPOS_VERBOSE=1) nothing is hidden; otherwise no
    third-party progress bars or info logs. Values the user set in the environment are kept."""
    if verbose_flag:
        os.environ[VERBOSE_ENV] = "1"
    if verbose():
        return
    for key, value in _QUIET_ENV.items():
        os.environ.setdefault(key, value)


@contextmanager
def quiet_datasets() -> Iterator[None]:
    """No `datasets` progress bars or info logs inside the block (unless verbose); restored after."""
    if verbose():
        yield
        return
    import datasets

    bars_were_on = datasets.is_progress_bar_enabled()
    level = datasets.logging.get_verbosity()
    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    try:
        yield
    finally:
        datasets.logging.set_verbosity(level)
        if bars_were_on:
            datasets.enable_progress_bars()


class _Once(logging.Filter):
    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix
        self.seen = False

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.getMessage().startswith(self.prefix):
            return True
        if self.seen and not verbose():
            return False
        self.seen = True
        return True


def log_once(logger_name: str, prefix: str) -> None:
    """Let `logger_name`'s messages that start with `prefix` through once per process (every time if verbose)."""
    logger = logging.getLogger(logger_name)
    if not any(isinstance(f, _Once) and f.prefix == prefix for f in logger.filters):
        logger.addFilter(_Once(prefix))
