"""Keeping third-party chatter off the user's terminal unless `atropos --verbose` (or ATROPOS_VERBOSE=1).

What is quieted, and where: `datasets`' download/"Generating train split" bars and info logs
(`quiet_datasets`, around every hub load), transformers' loading bars and info logs (`quiet_transformers`,
before a model or tokenizer loads), and a third-party log message repeated once per call (`log_once`:
math-verify warns on every parse that timeouts are off outside the main thread). Errors are never hidden.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["VERBOSE_ENV", "verbose", "set_verbose", "quiet_datasets", "quiet_transformers", "log_once"]

VERBOSE_ENV = "ATROPOS_VERBOSE"


def verbose() -> bool:
    return os.environ.get(VERBOSE_ENV, "") not in ("", "0")


def set_verbose(on: bool) -> None:
    """`atropos --verbose`: an env var, so worker processes and threads see it too."""
    if on:
        os.environ[VERBOSE_ENV] = "1"


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


def quiet_transformers() -> None:
    """No transformers loading bars or info/warning logs (unless verbose); errors still show."""
    if verbose():
        return
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()


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
