"""atroposlib.envs.teacher_distillation_env (Atropos' last main): `TeacherDistillationEnv`.

A BaseEnv whose groups also carry a teacher's view of each rollout: with `--env.teacher_enabled true`, every
sequence that passes atroposlib's checks is sent to the teacher server (`--teacher.base_url`,
`--teacher.model_name`, `--teacher.server_type` (vllm: prompt logprobs through /generate),
`--teacher.tokenizer_name`, ... or YAML `teacher:`, or `teacher_config_init()`), and its top-k prompt
logprobs (`--env.teacher_top_k`, per group `group_overrides["teacher_top_k"]`; `skip_teacher_top_k` skips a
group) land in `distill_token_ids` / `distill_logprobs` ([sequence][position][k]; position 0 is empty).
`atropos train --distill-beta B` trains on them. Unlike atroposlib, `process` and `evaluate` may use a
teacher too. The teacher must share the env's tokenizer: a different vocabulary is a ConfigError at start.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import Field

from atropos_cli.compat.atroposlib.envs.base import BaseEnv, BaseEnvConfig
from atropos_cli.compat.atroposlib.envs.server_handling.server_manager import (
    APIServerConfig,
    ServerManager,
    as_server_configs,
)
from atropos_cli.config import ServerConfig
from atropos_cli.errors import ConfigError

__all__ = ["TeacherDistillationEnv", "TeacherDistillationConfig"]


class TeacherDistillationConfig(BaseEnvConfig):
    teacher_enabled: bool = Field(default=False, description="Attach the teacher's top-k logprobs to each group")
    teacher_top_k: int = Field(default=1, ge=1, description="Teacher logprobs kept per position")


class TeacherDistillationEnv(BaseEnv):
    env_config_cls = TeacherDistillationConfig

    def __init__(
        self,
        config: Any,
        server_configs: Any,
        slurm: bool = False,
        testing: bool = False,
        teacher_server_configs: Any = None,
    ) -> None:
        super().__init__(config, server_configs, slurm=slurm, testing=testing)
        configs = teacher_server_configs if teacher_server_configs is not None else self.teacher_config_init()
        self.teacher_server_configs = as_server_configs(configs) if configs else []
        self.teacher_server: ServerManager | None = None
        if getattr(config, "teacher_enabled", False):
            if not self.teacher_server_configs:
                raise ConfigError(
                    "teacher_enabled is set but no teacher server is configured",
                    hint="pass --teacher.base_url URL (and --teacher.server_type vllm), or YAML teacher:",
                )
            self._check_tokenizer(self.teacher_server_configs[0])
            self.teacher_server = ServerManager(self.teacher_server_configs)

    @classmethod
    def teacher_config_init(cls) -> APIServerConfig | list[APIServerConfig] | None:
        """The teacher's default server(s); None: given by `--teacher.*` flags or YAML `teacher:`."""
        return None

    @classmethod
    def teacher_defaults(cls) -> list[ServerConfig]:
        configs = cls.teacher_config_init()
        return [ServerConfig(**c.model_dump()) for c in as_server_configs(configs)] if configs else []

    @classmethod
    def build(cls, config: Any, servers: list[ServerConfig], teacher: Sequence[ServerConfig] = ()) -> BaseEnv:
        server_configs = [APIServerConfig(**s.model_dump()) for s in servers]
        teachers = [APIServerConfig(**s.model_dump()) for s in teacher] or None
        return cls(config=config, server_configs=server_configs, teacher_server_configs=teachers)

    def _check_tokenizer(self, teacher: APIServerConfig) -> None:
        name = teacher.tokenizer_name
        if name in ("none", "", self.config.tokenizer_name) or self.tokenizer is None:
            return
        from atropos_cli.inference.tokenizer import load_tokenizer

        if load_tokenizer(name).get_vocab() != self.tokenizer.get_vocab():
            raise ConfigError(
                f"the teacher's tokenizer {name!r} differs from the env's {self.config.tokenizer_name!r}",
                hint="distillation compares token ids: use a teacher that shares the student's tokenizer",
            )

    async def attach_teacher(self, group: dict) -> None:
        """Fill distill_token_ids / distill_logprobs of one group from the teacher."""
        overrides = group.get("group_overrides") or {}
        if self.teacher_server is None or overrides.get("skip_teacher_top_k"):
            return
        k = int(overrides.get("teacher_top_k") or self.config.teacher_top_k)
        ids, lps = [], []
        for tokens in group["tokens"]:
            view = await self.teacher_server.get_logprobs(input_ids=list(tokens), top_k=k)
            ids.append([row[:k] for row in view["prompt_topk_token_ids"]])
            lps.append([row[:k] for row in view["prompt_topk_logprobs"]])
        group["distill_token_ids"], group["distill_logprobs"] = ids, lps

    async def handle_send_to_api(
        self,
        scored_data: Any,
        item: Any = None,
        do_send_to_api: bool = True,
        abort_on_any_max_length_exceeded: bool = True,
    ) -> None:
        for group in scored_data if isinstance(scored_data, list) else [scored_data]:
            if group is not None and group.get("tokens"):
                await self.attach_teacher(group)
        await super().handle_send_to_api(scored_data, item, do_send_to_api, abort_on_any_max_length_exceeded)
