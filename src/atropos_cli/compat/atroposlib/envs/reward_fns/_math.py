"""The math-answer check accuracy_reward and cascading_r1_math_reward share (atroposlib 0.4.0's rules).

`verify_answer(content, gold, tolerance)`: a GSM8K gold (`... #### 42`) is cut to its final answer; the
content's first LaTeX answer (a `\\boxed{}` first, no bare numbers) is parsed by math-verify and checked
against `\\boxed{gold}`; when that does not decide and the gold is a number, the content's first `\\boxed{...}`
(else its `#### N`) is compared numerically within `tolerance`.
"""

from __future__ import annotations

import logging
import re
from typing import Any

logger = logging.getLogger(__name__)

__all__ = ["final_answer", "verify_answer", "THINK_END"]

THINK_END = "</think>"
_BOXED = r"\\boxed\{([^}]+)\}"


def _number(text: str) -> float:
    return float(text.replace(",", "").strip())


def final_answer(text: str) -> str:
    """The answer after `####`, else inside the first `\\boxed{}`, else the text."""
    if "####" in text and (found := re.search(r"####\s*(.*?)(?:\s*$|\n)", text)):
        return found.group(1).strip()
    if "\\boxed{" in text and (found := re.search(_BOXED, text)):
        return found.group(1).strip()
    return text


def _gold_number(gold: Any) -> float | None:
    if isinstance(gold, int | float):
        return gold
    if isinstance(gold, str):
        text = gold.replace("\\boxed{", "").replace("}", "") if "\\boxed{" in gold else gold
        try:
            return _number(text)
        except ValueError:
            return None
    return None


def _math_verify(content: str, gold: Any) -> bool | None:
    from latex2sympy2_extended import NormalizationConfig
    from math_verify import LatexExtractionConfig, parse, verify

    normalization = NormalizationConfig(
        nits=False, malformed_operators=False, basic_latex=True, equations=True, boxed="all", units=True
    )
    config = LatexExtractionConfig(
        normalization_config=normalization, boxed_match_priority=0, try_extract_without_anchor=False
    )
    answer = parse(content, extraction_config=[config], extraction_mode="first_match")
    if not answer:
        return None
    gold_text = gold if isinstance(gold, str) and "\\boxed" in gold else f"\\boxed{{{gold}}}"
    gold_parsed = parse(gold_text, extraction_mode="first_match", extraction_config=[LatexExtractionConfig()])
    return verify(answer, gold_parsed) if gold_parsed else None


def verify_answer(content: str, gold: Any, tolerance: float = 1e-6) -> bool:
    if isinstance(gold, str) and "####" in gold:
        gold = final_answer(gold)
    gold_value = _gold_number(gold)
    try:
        decided = _math_verify(content, gold)
        if decided is not None:
            return bool(decided)
    except ImportError:
        raise
    except Exception as exc:
        logger.warning("Exception in primary parsing: %s", exc)
    if gold_value is None:
        return False
    try:
        boxed = re.findall(_BOXED, content)
        if boxed:
            try:
                return abs(_number(boxed[0]) - gold_value) < tolerance
            except ValueError:
                pass
        if "####" in content and (found := re.search(r"####\s*([\d\.]+)", content)):
            return abs(_number(found.group(1)) - gold_value) < tolerance
    except Exception as exc:
        logger.warning("Exception in regex parsing: %s", exc)
    return False
