"""What `atropos export ors` serves as tasks (`--train-tasks`): pydantic only, so the command's --help builds its
options without the server's imports."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["OrsTasks"]


class OrsTasks(BaseModel):
    model_config = ConfigDict(use_attribute_docstrings=True, extra="forbid")

    train_tasks: int = Field(default=1000, ge=1)
    """Tasks of the train split: the env's train stream's first N items."""
