"""Blackjack: a multi-turn text game against a dealer simulator; the final outcome is the reward.

Each item is a seeded shuffled deck, so every rollout of a group plays the same cards (GRPO compares
decisions, not luck). Turn loop: the env shows the model its cards and the dealer's up-card; the model
answers `hit` or `stand` (the last of those words in its reply counts); on `hit` the env deals a card and
asks again, until the model stands, busts, or `--env.max_turns` replies have been given (then it stands).
The dealer then draws to 17. A reply with neither word forfeits the hand.

Reward: +1 win, 0 push, -1 loss (bust or forfeit included). Parts: `correct` (1 on a win: what evaluate's
pass@k counts), `invalid` (1 when the hand was forfeited), `turns`.

Messages are kept per turn (system, user observation, assistant move, ...). Tokens: when a tokenizer is
known, `atropos_cli.env.multiturn.TokenTrace` builds them turn by turn and the next prompt is sent as token ids
(`server.completion(prompt=ids)`), so the trained tokens are exactly the sampled ones; masks cover only the
model's turns and logprobs come from the backend. Without a tokenizer the game runs over chat and the group
has messages and scores only.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

from atropos_cli.config import EnvConfig
from atropos_cli.env.multiturn import MultiTurnEnv, ScoredPlay, TokenTrace
from atropos_cli.types import Message

from ._shared.items import procedural_items

RANKS = ("A", "2", "3", "4", "5", "6", "7", "8", "9", "10", "J", "Q", "K")
_MOVE = re.compile(r"\b(hit|stand)\b", re.IGNORECASE)
SYSTEM = (
    "You are playing blackjack against the dealer. Get closer to 21 than the dealer without going over. "
    "Each turn, answer with one word: hit or stand."
)


class BlackjackConfig(EnvConfig):
    max_turns: int = 5
    eval_size: int = 100


def hand_total(cards: list[str]) -> int:
    total = sum(11 if c == "A" else 10 if c in ("J", "Q", "K") else int(c) for c in cards)
    aces = cards.count("A")
    while total > 21 and aces:
        total, aces = total - 10, aces - 1
    return total


@dataclass
class BlackjackGame:
    """The simulator: a seeded deck, the player's and dealer's hands, the dealer's fixed policy."""

    seed: str
    deck: list[str] = field(default_factory=list)
    player: list[str] = field(default_factory=list)
    dealer: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.deck = [rank for rank in RANKS for _ in range(4)]
        random.Random(self.seed).shuffle(self.deck)
        self.player = [self.deck.pop(), self.deck.pop()]
        self.dealer = [self.deck.pop(), self.deck.pop()]

    def observation(self) -> str:
        return (
            f"Your cards: {', '.join(self.player)} (total {hand_total(self.player)}). "
            f"Dealer shows: {self.dealer[0]}. Hit or stand?"
        )

    def hit(self) -> str:
        card = self.deck.pop()
        self.player.append(card)
        return card

    def finish(self) -> float:
        """Dealer draws to 17; +1 / 0 / -1 for the player."""
        player = hand_total(self.player)
        if player > 21:
            return -1.0
        while hand_total(self.dealer) < 17:
            self.dealer.append(self.deck.pop())
        dealer = hand_total(self.dealer)
        return 1.0 if dealer > 21 or player > dealer else 0.0 if player == dealer else -1.0


def parse_move(text: str) -> str | None:
    found = _MOVE.findall(text)
    return found[-1].lower() if found else None


class BlackjackEnv(MultiTurnEnv):
    name: ClassVar[str] = "blackjack"
    version: ClassVar[str] = "1"
    description: ClassVar[str] = (
        "multi-turn game vs a dealer simulator (procedural, offline); reward +1 win / 0 push / -1 loss"
    )
    env_config_cls = BlackjackConfig

    @classmethod
    def config_init(cls) -> tuple[EnvConfig, list[Any]]:
        return BlackjackConfig(group_size=8, max_token_length=64), []

    def items(self, split: str) -> Iterator[dict[str, Any]]:
        eval_size = self.config.eval_size  # type: ignore[attr-defined]
        for item_id, key in procedural_items(self.config.seed, split, eval_size):
            yield {"id": item_id, "deck_seed": key}

    async def play(self, item: dict[str, Any]) -> ScoredPlay:
        """One hand: alternate model moves and simulator observations until the hand is over."""
        game = BlackjackGame(item["deck_seed"])
        messages: list[Message] = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": game.observation()},
        ]
        tokenizer = self.tokenizer
        trace = TokenTrace(tokenizer) if tokenizer is not None else None
        prompt_ids = trace.start(messages) if trace else None
        finish_reason, invalid, turns = None, 0.0, 0
        while True:
            choice = await self.reply(messages, prompt_ids)
            finish_reason, turns = choice.finish_reason, turns + 1
            if trace:
                trace.add_reply(choice.text, choice.token_ids, choice.logprobs, choice.finish_reason)
            messages.append({"role": "assistant", "content": choice.text})
            move = parse_move(choice.text)
            if move is None:
                score, invalid = -1.0, 1.0
                break
            if move == "stand" or turns >= self.config.max_turns:  # type: ignore[attr-defined]
                score = game.finish()
                break
            card = game.hit()
            if hand_total(game.player) > 21:
                score = game.finish()
                messages.append(
                    {"role": "user", "content": f"You drew {card} and busted with {hand_total(game.player)}."}
                )
                break
            observation = {"role": "user", "content": f"You drew {card}. {game.observation()}"}
            messages.append(observation)
            prompt_ids = trace.add_messages([observation]) if trace else None
        parts = {"correct": 1.0 if score > 0 else 0.0, "invalid": invalid, "turns": float(turns)}
        return ScoredPlay(messages, score, parts, trace, finish_reason)
