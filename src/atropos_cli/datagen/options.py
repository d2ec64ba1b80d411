"""The settings of `atropos sft-gen` / `atropos dpo-gen`, declared once: their fields' docstrings are the commands'
`--help` and their defaults the flags' defaults (cli/options.py generates the options from them).

`SftOptions` / `DpoOptions` choose rollouts (Atropos' flags plus ours), `SftOutput` / `DpoOutput` say what is
written and how; the `--api-url` source has its own options (`api.client.ApiSourceOptions`).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["SelectOptions", "SftOptions", "DpoOptions", "OutputOptions", "SftOutput", "DpoOutput"]


class SelectOptions(BaseModel):
    """Filters shared by SFT and DPO selection (Atropos' flags plus ours)."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    allow_negative_scores: bool = False
    """Keep rollouts with score <= 0 (Atropos' flag)."""
    minimum_score_diff_max_min: float = 0.0
    """Keep a rollout only if its score exceeds the group minimum by more than this."""
    min_score: float | None = None
    """Drop rollouts scoring below this."""
    max_token_len: int | None = Field(default=None, ge=1)
    """Drop rollouts with more token ids than this (groups with tokens); registered with --api-url."""
    max_chars: int | None = Field(default=None, ge=1)
    """Drop rollouts whose prompt+completion text is longer."""
    dedupe: bool = True
    """Drop repeats of an identical prompt+completion (pair for DPO)."""
    num_seqs_to_save: int | None = Field(default=None, ge=1)
    """Stop after writing this many rows (default: all)."""


class SftOptions(SelectOptions):
    save_top_n_per_group: int = Field(default=3, ge=1)
    """Best rollouts kept per group."""


class DpoOptions(SelectOptions):
    minimum_score_diff_max_min: float = 0.5
    """A rejected answer must score more than this below the chosen one."""
    save_n_pairs_per_group: int = Field(default=3, ge=1)
    """Pairs made per group at most."""
    seed: int = 0
    """Seed of the (per-group) choice of rejected answers."""


class OutputOptions(BaseModel):
    """What a run writes, and how it treats its inputs."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    tokenizer: str | None = None
    """Tokenizer (model dir or shipped model) to decode groups that carry only tokens."""
    save_messages: bool = False
    """--format atropos: write messages instead of prefix/completion text (Atropos' flag)."""
    dry_run: bool = False
    """Select and print the summary without writing anything."""
    strict: bool = False
    """Make a corrupt line fatal (default: report file:line and skip it)."""
    append_to_previous: bool = False
    """Add rows to an existing dataset in --out."""
    overwrite: bool = False
    """Replace an existing dataset in --out."""

    @property
    def mode(self) -> Literal["new", "append", "overwrite"]:
        return "append" if self.append_to_previous else "overwrite" if self.overwrite else "new"


class SftOutput(OutputOptions):
    format: Literal["messages", "prompt-completion", "atropos"] = "messages"
    """messages | prompt-completion (TRL conversational) | atropos (legacy)."""


class DpoOutput(OutputOptions):
    format: Literal["preference", "atropos"] = "preference"
    """preference (TRL conversational prompt/chosen/rejected) | atropos."""
