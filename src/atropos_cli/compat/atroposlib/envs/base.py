"""atroposlib.envs.base: `BaseEnv`, `BaseEnvConfig`, `ScoredDataGroup`, `ScoredDataItem`, `EvalHandlingEnum`.

`BaseEnv` here IS our BaseEnv (`atropos_cli.env.base`) with atroposlib's constructor
`(config, server_configs, slurm=False, testing=False)`, its attributes and hooks. Our runners drive it:
`atropos process|evaluate|serve env.py`, and `Env.cli()` (`python env.py process|serve|evaluate`) runs the
same code. After `postprocess_histories`, each group goes through `handle_send_to_api` (atroposlib's checks:
group size, identical scores, max length; missing messages synthesised when `include_messages`) and then
`wandb_log`, as in atroposlib's process loop; the runner writes what survives (jsonl, parquet, HTML) and, in
serve, posts it to the trajectory API.
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Sequence
from typing import Any, ClassVar

from pydantic import ConfigDict, Field

from atropos_cli.compat.atroposlib.envs._logging import WandbHooks
from atropos_cli.compat.atroposlib.envs._manager_flags import manager_kwargs
from atropos_cli.compat.atroposlib.envs._records import EvalHandlingEnum, ScoredDataGroup, ScoredDataItem
from atropos_cli.compat.atroposlib.envs._tokenizer import with_atroposlib_defaults
from atropos_cli.compat.atroposlib.envs.server_handling.server_baseline import ReasoningConfig
from atropos_cli.compat.atroposlib.envs.server_handling.server_manager import (
    APIServer,
    APIServerConfig,
    ServerBaseline,
    ServerManager,
    ServerManagerConfig,
    as_server_configs,
)
from atropos_cli.compat.atroposlib.type_definitions import Item
from atropos_cli.config import EnvConfig, ServerConfig
from atropos_cli.env.base import BaseEnv as _OurBaseEnv
from atropos_cli.env.base import record_filtered
from atropos_cli.errors import ConfigError

__all__ = [
    "BaseEnv",
    "BaseEnvConfig",
    "ScoredDataGroup",
    "ScoredDataItem",
    "EvalHandlingEnum",
    "APIServer",
    "APIServerConfig",
    "ServerBaseline",
    "ServerManager",
    "ServerManagerConfig",
    "Item",
]

logger = logging.getLogger("atropos_cli.compat.atroposlib")
# the groups handle_send_to_api accepted for the group being finished in this task (see after_group)
_accepted: contextvars.ContextVar[list | None] = contextvars.ContextVar("atroposlib_accepted", default=None)
# atroposlib's own defaults where ours differ (ours: no hub tokenizer by default, no W&B, keep messages)
PROCESS_DEFAULTS = {"ensure_scores_are_not_same": False, "include_messages": True, "use_wandb": True}


class BaseEnvConfig(EnvConfig):
    """atroposlib's BaseEnvConfig: every field and default of its §2.2 table (plus ours: seed, temperature...)."""

    model_config = ConfigDict(extra="ignore", use_enum_values=False)

    eval_handling: EvalHandlingEnum = Field(  # type: ignore[assignment]  # an enum where ours has its names
        default=EvalHandlingEnum.STOP_TRAIN, description="How to handle evals"
    )
    tokenizer_name: str = Field(
        default="NousResearch/DeepHermes-3-Llama-3-3B-Preview", description="Hugging Face tokenizer to use."
    )
    use_wandb: bool = Field(default=True, description="Whether to use wandb")
    ensure_scores_are_not_same: bool = Field(default=True, description="Drop groups whose scores are all equal")
    include_messages: bool = Field(default=False, description="Include messages in the output")
    max_reasoning_tokens: int | None = Field(default=None, ge=1024, le=32000)


class BaseEnv(WandbHooks, _OurBaseEnv):
    name: ClassVar[str | None] = None  # type: ignore[assignment]
    env_config_cls: ClassVar[type[EnvConfig]] = BaseEnvConfig
    server_cls: ClassVar[Any] = APIServer

    def __init__(self, config: Any, server_configs: Any, slurm: bool = False, testing: bool = False) -> None:
        reasoning = ReasoningConfig(
            enabled=config.thinking_mode, effort=config.reasoning_effort, max_tokens=config.max_reasoning_tokens
        )
        server = ServerManager(
            server_configs, server_class=self.server_cls, slurm=slurm, testing=testing, reasoning_config=reasoning
        )
        super().__init__(config, server)
        self._init_state()
        if config.tokenizer_name and config.tokenizer_name != "none":
            from atropos_cli.inference.tokenizer import load_tokenizer

            self.tokenizer = load_tokenizer(config.tokenizer_name)
        self.max_num_workers = config.max_num_workers
        if self.max_num_workers == -1:
            self.max_num_workers = config.max_num_workers_per_node * len(self.server.servers)

    def _init_state(self) -> None:
        self.items_sent_this_step = 0
        self.eval_runner = None
        self.workers_added_list: list = []
        self.succeeded_task_duration: list = []
        self.failed_task_duration: list = []
        self.task_duration: list = []
        self.mainloop_timings: list = []
        self.task_successful: list = []
        self.last_loop_time = None
        self.last_completed_item = None
        self.workers: set = set()
        self.eval_workers: set = set()
        self.backlog: list = []
        self.rollouts_for_wandb: list = []
        self.running_items: dict = {}
        self.wandb_project = None
        self.wandb_group = None
        self.curr_step = 0
        self.max_token_len = -1
        self.completion_lengths: list = []
        self.wandb_prepend = None
        self.checkpoint_dir = ""
        self.checkpoint_interval = -1
        self.jsonl_writer = None
        self.process_mode = False

    # -- the tokenizer is loaded eagerly, as in atroposlib, and env code may replace it; either way its
    # apply_chat_template returns ids by default, as under the transformers 4 atroposlib runs on ------------
    @property
    def tokenizer(self) -> Any:
        return with_atroposlib_defaults(_OurBaseEnv.tokenizer.fget(self))  # type: ignore[attr-defined]

    @tokenizer.setter
    def tokenizer(self, value: Any) -> None:
        self._tokenizer, self._tokenizer_loaded = value, True

    # -- what the loader asks -----------------------------------------------------------------------------
    @classmethod
    def config_init(cls) -> tuple[Any, Any]:
        return cls.env_config_cls(), ServerBaseline()

    @classmethod
    def mode_defaults(cls, mode: str) -> dict[str, Any]:
        return dict(PROCESS_DEFAULTS) if mode == "process" else {"use_wandb": True} if mode == "evaluate" else {}

    @classmethod
    def server_defaults(cls, servers: Any) -> list[ServerConfig]:
        """A list or one APIServerConfig: those servers. A bare ServerBaseline: one server with its fields and
        no URL yet, so `--openai.*` flags (or the local model, with none) complete it."""
        if isinstance(servers, ServerBaseline) and not isinstance(servers, ServerConfig):
            return [ServerConfig(**servers.model_dump())]
        return [
            ServerConfig(**s.model_dump(exclude=set(s.model_dump()) - set(ServerConfig.model_fields)))
            for s in as_server_configs(servers)
        ]

    @classmethod
    def build(cls, config: EnvConfig, servers: list[ServerConfig], teacher: Sequence[ServerConfig] = ()) -> BaseEnv:
        if teacher:
            raise ConfigError(
                f"{cls.__name__} takes no teacher server (--teacher.* / YAML teacher:)",
                hint="subclass atroposlib.envs.teacher_distillation_env.TeacherDistillationEnv to distill",
            )
        return cls(
            config=config, server_configs=[APIServerConfig(**s.model_dump()) for s in servers], **manager_kwargs(cls)
        )

    # -- atroposlib's hooks ---------------------------------------------------------------------------
    async def after_group(self, result: Any, item: Item) -> Any:
        """atroposlib's process step after postprocess_histories: handle_send_to_api, then wandb_log; the
        groups it accepted (collected per task: groups of other items may be in flight) go to the runner."""
        token = _accepted.set([])
        try:
            if result:
                await self.handle_send_to_api(
                    result, item, do_send_to_api=False, abort_on_any_max_length_exceeded=False
                )
                await self.wandb_log()
            return list(_accepted.get() or [])
        finally:
            _accepted.reset(token)

    async def handle_send_to_api(
        self,
        scored_data: Any,
        item: Item = None,
        do_send_to_api: bool = True,
        abort_on_any_max_length_exceeded: bool = True,
    ) -> None:
        """atroposlib's per-group checks; the groups that pass are kept (and posted when do_send_to_api)."""
        from atropos_cli.compat.atroposlib.envs._send import check_group, post_groups

        was_list = isinstance(scored_data, list)
        valid = []
        for group in scored_data if was_list else [scored_data]:
            skipped = "a None in the list of groups" if group is None else None
            skipped = skipped or check_group(self, group, abort_on_any_max_length_exceeded)
            if skipped:
                record_filtered(skipped)
                continue
            await self.add_rollouts_for_wandb(group, item)
            valid.append(group)
        sink = _accepted.get()
        if sink is not None:
            sink.extend(valid)
        if valid and do_send_to_api:
            self.items_sent_this_step += len(valid)
            await post_groups(self, valid if was_list or len(valid) > 1 else valid[0])

    async def get_next_item(self) -> Item:
        raise NotImplementedError(f"{type(self).__name__} must implement get_next_item()")

    async def evaluate(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must implement evaluate()")

    async def setup(self) -> None:
        raise NotImplementedError(f"{type(self).__name__} must implement setup()")

    async def _run_evaluate(self) -> Any:
        await self.setup()
        return await self.evaluate()

    @classmethod
    def cli(cls) -> None:
        """`python env.py serve|process|evaluate [--env.* --openai.* --slurm --testing --config FILE]`."""
        from atropos_cli.compat.atroposlib.envs._cli import run_cli

        run_cli(cls)
