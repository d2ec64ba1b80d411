"""atroposlib.envs.teacher_distillation_env (Atropos' last main): `TeacherDistillationEnv`.

A BaseEnv whose groups also carry a teacher's view of each rollout, with main's constructor
`(config, server_configs, teacher_server_configs=None, slurm=False, testing=False)`. With
`--env.teacher_enabled true`, every group that passes atroposlib's checks sends each sequence to the teacher
server (`teacher_server_configs=`, else `--teacher.base_url`, `--teacher.model_name`,
`--teacher.server_type` (vllm: prompt logprobs through /generate), `--teacher.tokenizer_name`, ... or YAML
`teacher:`, or `teacher_config_init()`), and the prompt logprobs it returns (`--env.teacher_top_k K`, default
0: the selected token only; per group `group_overrides["teacher_top_k"]`) land in `distill_token_ids` /
`distill_logprobs` ([sequence][position][k]; position 0 is empty). As in main, K <= -1,
`group_overrides["skip_teacher_top_k"]`, a failed teacher call or a length mismatch leave both None for the
group (the last two logged). `atropos train --distill-beta B` trains on them. Unlike atroposlib, `process` and
`evaluate` use the teacher too.

Main's own `gsm8k_server_teacher_distill.py` mixes in an env whose `__init__(config, server_configs,
slurm=True, testing=False)` calls `super().__init__(config, server_configs, slurm, testing)` positionally:
a bool where the teacher configs go is read as that older order, and the teacher configs our runner resolved
reach this class even though the subclass's `__init__` does not take them (atroposlib passes them as a
keyword there, and fails). The teacher must share the env's tokenizer (the teacher's `tokenizer_name`, else
its `model_name`): a different vocabulary, or one that cannot be loaded, is a ConfigError at start.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from contextvars import ContextVar
from typing import Any

from pydantic import Field

from atropos_cli.compat.atroposlib.envs._manager_flags import manager_kwargs
from atropos_cli.compat.atroposlib.envs.base import BaseEnv, BaseEnvConfig
from atropos_cli.compat.atroposlib.envs.server_handling.server_manager import (
    APIServerConfig,
    ServerManager,
    as_server_configs,
)
from atropos_cli.config import ServerConfig
from atropos_cli.errors import ConfigError

__all__ = ["TeacherDistillationEnv", "TeacherDistillationConfig"]

logger = logging.getLogger(__name__)
_resolved_teachers: ContextVar[list[APIServerConfig] | None] = ContextVar("resolved_teachers", default=None)


class TeacherDistillationConfig(BaseEnvConfig):
    teacher_enabled: bool = Field(
        default=False, description="Whether to fetch teacher prompt logprobs for distillation."
    )
    teacher_top_k: int = Field(
        default=0,
        ge=-1,
        description="Extra prompt logprobs per position beyond the selected token (0: selected token only; "
        "-1: no teacher call)",
    )


class TeacherDistillationEnv(BaseEnv):
    env_config_cls = TeacherDistillationConfig
    teacher_namespace = "teacher"

    def __init__(
        self,
        config: Any,
        server_configs: Any,
        teacher_server_configs: Any = None,
        slurm: bool = False,
        testing: bool = False,
    ) -> None:
        if isinstance(teacher_server_configs, bool):  # (config, servers, slurm, testing): BaseEnv's order
            teacher_server_configs, slurm, testing = None, teacher_server_configs, slurm
        super().__init__(config, server_configs, slurm=slurm, testing=testing)
        if teacher_server_configs is None:
            teacher_server_configs = _resolved_teachers.get() or self.teacher_config_init()
        self.teacher_server_configs = as_server_configs(teacher_server_configs) if teacher_server_configs else []
        self.teacher_server: ServerManager | None = None
        if getattr(config, "teacher_enabled", False):
            if not self.teacher_server_configs:
                raise ConfigError(
                    "teacher_enabled is set but no teacher server is configured",
                    hint="pass --teacher.base_url URL (and --teacher.server_type vllm), YAML teacher:, "
                    "teacher_config_init() or teacher_server_configs=",
                )
            self._check_tokenizer(self.teacher_server_configs[0])
            self.teacher_server = ServerManager(self.teacher_server_configs)

    @classmethod
    def teacher_config_init(cls) -> Any:
        """The teacher's default server(s); None: given by `--teacher.*` flags or YAML `teacher:`."""
        return None

    @classmethod
    def teacher_defaults(cls) -> list[ServerConfig]:
        configs = cls.teacher_config_init()
        return [ServerConfig(**c.model_dump()) for c in as_server_configs(configs)] if configs else []

    @classmethod
    def build(cls, config: Any, servers: list[ServerConfig], teacher: Sequence[ServerConfig] = ()) -> BaseEnv:
        server_configs = [APIServerConfig(**s.model_dump()) for s in servers]
        token = _resolved_teachers.set([APIServerConfig(**s.model_dump()) for s in teacher] or None)
        try:
            return cls(config=config, server_configs=server_configs, **manager_kwargs(cls))
        finally:
            _resolved_teachers.reset(token)

    def _check_tokenizer(self, teacher: APIServerConfig) -> None:
        name = teacher.model_name if teacher.tokenizer_name in ("", "none", None) else teacher.tokenizer_name
        student = self.config.tokenizer_name
        if self.tokenizer is None or name in (student, getattr(self.tokenizer, "name_or_path", None)):
            return
        from atropos_cli.inference.tokenizer import load_tokenizer

        try:
            vocab = load_tokenizer(name).get_vocab()
        except Exception as exc:
            raise ConfigError(
                f"cannot load the teacher's tokenizer {name!r} to check it matches the env's {student!r}",
                hint="set --teacher.tokenizer_name to the teacher's tokenizer (distillation needs the student's)",
            ) from exc
        if vocab != self.tokenizer.get_vocab():
            raise ConfigError(
                f"the teacher's tokenizer {name!r} differs from the env's {student!r}",
                hint="distillation compares token ids: use a teacher that shares the student's tokenizer",
            )

    async def _fetch_teacher_for_sequence(self, token_ids: list[int], top_k: int) -> tuple[list, list]:
        assert self.teacher_server is not None
        view = await self.teacher_server.get_logprobs(input_ids=list(token_ids), top_k=top_k, max_tokens=1)
        return view["prompt_topk_token_ids"], view["prompt_topk_logprobs"]

    async def attach_teacher(self, group: dict) -> None:
        """Fill distill_token_ids / distill_logprobs of one group from the teacher (None where main leaves none)."""
        if self.teacher_server is None:
            return
        overrides = group.get("group_overrides") or {}
        top_k = int(overrides.get("teacher_top_k", self.config.teacher_top_k))
        group["distill_token_ids"] = group["distill_logprobs"] = None
        if not group.get("tokens") or overrides.get("skip_teacher_top_k") or top_k <= -1:
            return
        fetched = await asyncio.gather(
            *(self._fetch_teacher_for_sequence(seq, top_k) for seq in group["tokens"]), return_exceptions=True
        )
        for i, result in enumerate(fetched):
            if isinstance(result, BaseException):
                logger.warning(
                    "teacher logprobs failed for sequence %d (%s): no distill data for this group", i, result
                )
                return
            if len(result[0]) != len(result[1]):
                logger.warning("teacher top-k ids and logprobs differ in length for sequence %d: no distill data", i)
                return
        group["distill_token_ids"] = [ids for ids, _ in fetched]  # type: ignore[misc]
        group["distill_logprobs"] = [lps for _, lps in fetched]  # type: ignore[misc]

    async def handle_send_to_api(
        self,
        scored_data: Any,
        item: Any = None,
        do_send_to_api: bool = True,
        abort_on_any_max_length_exceeded: bool = True,
    ) -> None:
        for group in scored_data if isinstance(scored_data, list) else [scored_data]:
            if group is not None:
                await self.attach_teacher(group)
        await super().handle_send_to_api(scored_data, item, do_send_to_api, abort_on_any_max_length_exceeded)
