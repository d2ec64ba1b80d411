"""atroposlib.type_definitions: the typed dicts env code annotates with (names and keys as in atroposlib)."""

from __future__ import annotations

from typing import Any, Literal

from typing_extensions import TypedDict

Content = Any  # str, or a list of OpenAI content parts
Item = Any
number = int | float
UUID = str


class Message(TypedDict):
    role: Literal["system", "user", "assistant", "tool"]
    content: Content
    reward: float | None


class AgentStep(TypedDict, total=False):
    step: int
    messages: list[Message]
    reward: float


AgentHistory = dict[str, list[AgentStep]]


class Observation(TypedDict):
    raw: dict[str, Any]
    rendered: Content


class GameStep(TypedDict):
    step: int
    agent: str | None
    observation: Observation
    action: str | None
    reward: float | dict[str, float] | None
    done: bool
    info: dict[str, Any] | None


GameHistory = list[GameStep]
