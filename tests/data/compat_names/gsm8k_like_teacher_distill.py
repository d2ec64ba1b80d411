"""Atropos main's gsm8k_server_teacher_distill.py pattern: `class X(GSM8kEnv, TeacherDistillationEnv)` (the
base env's positional super().__init__ lands in TeacherDistillationEnv), TeacherDistillationConfig with
teacher_enabled and teacher_top_k, the teacher's server from `teacher_config_init()`."""

from atroposlib.envs.base import APIServerConfig
from atroposlib.envs.teacher_distillation_env import TeacherDistillationConfig, TeacherDistillationEnv
from gsm8k_like_server import GSM8kLikeEnv

TOKENIZER = "atropos-tiny-arith"


class GSM8kLikeTeacherDistillEnv(GSM8kLikeEnv, TeacherDistillationEnv):
    name = "gsm8k_like_teacher_distill"
    env_config_cls = TeacherDistillationConfig

    @classmethod
    def config_init(cls):
        config = TeacherDistillationConfig(
            tokenizer_name=TOKENIZER,
            group_size=4,
            use_wandb=False,
            total_steps=2,
            max_token_length=128,
            teacher_enabled=True,
            teacher_top_k=2,
        )
        return config, APIServerConfig(model_name="policy", base_url="http://localhost:9001/v1", api_key="x")

    @classmethod
    def teacher_config_init(cls):
        return APIServerConfig(
            base_url="http://localhost:9003/v1",
            model_name="mock-teacher",
            api_key="",
            server_type="vllm",
            tokenizer_name=TOKENIZER,
            timeout=1200,
        )


if __name__ == "__main__":
    GSM8kLikeTeacherDistillEnv.cli()
