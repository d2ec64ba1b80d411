"""Judge prompts and parsing for the RLAIF env: pointwise scores and pairwise verdicts.

The judge is asked to reason first and end with a fixed marker (`SCORE: N` from 0 to 10, or
`VERDICT: A|B|TIE`), so its reasoning can be stored with the group and the verdict parsed without guessing.
"""

from __future__ import annotations

import re

from atropos_cli.errors import JudgeOutputError

__all__ = ["JudgeOutputError", "pointwise_prompt", "pairwise_prompt", "parse_score", "parse_verdict", "pair_scores"]

_SCORE = re.compile(r"SCORE:\s*\**\s*(\d+(?:\.\d+)?)", re.IGNORECASE)
_VERDICT = re.compile(r"VERDICT:\s*\**\s*\[*\s*(A|B|TIE)\b", re.IGNORECASE)


def pointwise_prompt(rubric: str, prompt: str, response: str) -> str:
    return (
        f"You are grading a response against a rubric.\nRubric: {rubric}\n\n"
        f"Prompt:\n{prompt}\n\nResponse:\n{response}\n\n"
        "Explain your reasoning briefly, then end with a line 'SCORE: N' where N is an integer from 0 to 10."
    )


def pairwise_prompt(rubric: str, prompt: str, response_a: str, response_b: str) -> str:
    return (
        f"You are comparing two responses against a rubric.\nRubric: {rubric}\n\n"
        f"Prompt:\n{prompt}\n\nResponse A:\n{response_a}\n\nResponse B:\n{response_b}\n\n"
        "Explain your reasoning briefly, then end with a line 'VERDICT: A', 'VERDICT: B' or 'VERDICT: TIE'."
    )


def parse_score(text: str) -> float:
    """The last `SCORE: N` as a value in [0, 1] (N / 10); JudgeOutputError when missing or out of range."""
    found = _SCORE.findall(text)
    if not found or not 0 <= float(found[-1]) <= 10:
        raise JudgeOutputError(
            f"judge output has no 'SCORE: N' (0-10): {text[-120:]!r}", hint="the judge model ignored the format"
        )
    return float(found[-1]) / 10


def parse_verdict(text: str) -> str:
    """'A', 'B' or 'TIE' from the last `VERDICT:` line; JudgeOutputError when missing."""
    found = _VERDICT.findall(text)
    if not found:
        raise JudgeOutputError(
            f"judge output has no 'VERDICT: A|B|TIE': {text[-120:]!r}", hint="the judge model ignored the format"
        )
    return found[-1].upper()


def pair_scores(n: int, verdicts: dict[tuple[int, int], str]) -> list[float]:
    """Win rate per rollout over its comparisons (tie = half a win); pair (i, j) has i as response A."""
    wins = [0.0] * n
    games = [0] * n
    for (i, j), verdict in verdicts.items():
        games[i] += 1
        games[j] += 1
        if verdict == "A":
            wins[i] += 1
        elif verdict == "B":
            wins[j] += 1
        else:
            wins[i] += 0.5
            wins[j] += 0.5
    return [w / g if g else 0.5 for w, g in zip(wins, games, strict=True)]
