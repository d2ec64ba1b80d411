"""The shipped tiny model in tinker-cookbook terms, through the cookbook's own extension points: a renderer for its
chat template (`renderers.register_renderer("atropos_tiny", ...)`; the cookbook ships renderers for hub model
families only) and the cookbook's arithmetic env with operands in the model's range (0..30, one turn: the model
was trained on the bundled `arithmetic` env's questions). Imported by cookbook_run.py.

The tiny model's template: <|user|>TEXT<|end|><|assistant|>TEXT<|end|> (<|end|> is its EOS)."""

from __future__ import annotations

from functools import partial

import chz
import numpy as np
import tinker
from tinker_cookbook import renderers
from tinker_cookbook.recipes.math_rl.arithmetic_env import ArithmeticDataset, ArithmeticEnv
from tinker_cookbook.renderers.base import (
    Message,
    ParseTermination,
    RenderContext,
    RenderedMessage,
    Renderer,
    ensure_text,
    parse_response_for_stop_token,
)
from tinker_cookbook.rl.problem_env import ProblemGroupBuilder
from tinker_cookbook.rl.types import RLDatasetBuilder
from tinker_cookbook.tokenizer_utils import get_tokenizer

END = "<|end|>"


class TinyArithRenderer(Renderer):
    @property
    def has_extension_property(self) -> bool:
        return True

    def _chunk(self, text: str) -> tinker.types.EncodedTextChunk:
        return tinker.types.EncodedTextChunk(tokens=self.tokenizer.encode(text, add_special_tokens=False))

    def render_message(self, message: Message, ctx: RenderContext) -> RenderedMessage:
        header = self._chunk(f"<|{message['role']}|>")
        return RenderedMessage(header=header, output=[self._chunk(ensure_text(message["content"]) + END)])

    def get_stop_sequences(self) -> list[int]:
        return [self.tokenizer.convert_tokens_to_ids(END)]

    def parse_response(self, response: list[int]) -> tuple[Message, ParseTermination]:
        return parse_response_for_stop_token(response, self.tokenizer, self.get_stop_sequences()[0])


RENDERER = "atropos_tiny"
renderers.register_renderer(RENDERER, lambda tokenizer, image_processor=None: TinyArithRenderer(tokenizer))


class SmallOperandDataset(ArithmeticDataset):
    """The cookbook's arithmetic dataset, operands drawn from 0..max_operand; every batch asks the same
    `batch_size` problems (a fixed set, so that a few steps on a CPU show the reward climbing)."""

    max_operand = 30

    def get_batch(self, index: int) -> list[ProblemGroupBuilder]:
        return super().get_batch(0)

    def _make_env_group_builder(self, rng: np.random.RandomState) -> ProblemGroupBuilder:
        x, y = rng.randint(0, self.max_operand + 1), rng.randint(0, self.max_operand + 1)
        return ProblemGroupBuilder(
            env_thunk=partial(ArithmeticEnv, x, y, convo_prefix=None, renderer=self.renderer), num_envs=self.group_size
        )


@chz.chz
class SmallOperandBuilder(RLDatasetBuilder):
    batch_size: int
    group_size: int
    n_batches: int
    model_name_for_tokenizer: str
    renderer_name: str = RENDERER

    async def __call__(self) -> tuple[SmallOperandDataset, None]:
        tokenizer = get_tokenizer(self.model_name_for_tokenizer)
        dataset = SmallOperandDataset(
            batch_size=self.batch_size,
            renderer=renderers.get_renderer(self.renderer_name, tokenizer=tokenizer),
            group_size=self.group_size,
            n_batches=self.n_batches,
            include_fewshot=False,
        )
        return dataset, None
