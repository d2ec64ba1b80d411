"""The JSON bodies of the Tinker API as this server reads and writes them (tinker SDK 0.38.0's shapes).

Requests ignore fields this server does not use (the SDK adds new ones over time); what it needs is typed and
checked, and a body that does not fit is a 400 naming the field. `forward_backward` bodies and the results of
`forward_backward`/`sample` are protobuf (`protowire.py`).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from atropos_cli.tinker.errors import invalid

# The losses the SDK names (tinker.types.LossFnType). `stable_reinforce` needs stability records of sampled
# sequences and `custom` a loss uploaded with create_custom_loss: neither is served (a 422 says so).
SERVED_LOSSES = ("cross_entropy", "importance_sampling", "ppo", "cispo", "dro", "gspo")
SDK_LOSSES = (*SERVED_LOSSES, "stable_reinforce", "custom")


class Request(BaseModel):
    model_config = ConfigDict(extra="ignore", protected_namespaces=())


def parse(model: type[Request], body: Any, what: str) -> Any:
    """`body` (decoded JSON) as `model`, or a 400 naming the first bad field."""
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "body"
        raise invalid(f"{what}: {where}: {err['msg']}", hint="send the body the tinker SDK sends") from None


class CreateSession(Request):
    tags: list[str] = []
    user_metadata: dict[str, Any] | None = None
    sdk_version: str = ""


class SessionRef(Request):
    session_id: str


class LoraConfig(Request):
    rank: int = Field(ge=0, le=1024)
    seed: int | None = None
    train_unembed: bool = True
    train_mlp: bool = True
    train_attn: bool = True


class CreateModel(Request):
    session_id: str
    model_seq_id: int
    base_model: str
    user_metadata: dict[str, Any] | None = None
    lora_config: LoraConfig | None = None


class ModelRef(Request):
    model_id: str


class AdamParams(Request):
    learning_rate: float = Field(default=1e-4, ge=0)
    beta1: float = Field(default=0.9, ge=0, lt=1)
    beta2: float = Field(default=0.95, ge=0, lt=1)
    eps: float = Field(default=1e-12, gt=0)
    weight_decay: float = Field(default=0.0, ge=0)
    grad_clip_norm: float = Field(default=0.0, ge=0)
    type: Literal["adam", "adamw"] | None = None


class OptimStep(Request):
    model_id: str
    seq_id: int | None = None
    adam_params: AdamParams | None = None
    optimizer_params: dict[str, Any] | None = None


class SaveWeights(Request):
    model_id: str
    path: str | None = None
    seq_id: int | None = None
    sampling_session_seq_id: int | None = None


class LoadWeights(Request):
    model_id: str | None = None
    seq_id: int | None = None
    session_id: str | None = None
    model_seq_id: int | None = None
    base_model: str | None = None
    path: str
    optimizer: bool = False


class CreateSamplingSession(Request):
    session_id: str
    sampling_session_seq_id: int = 0
    base_model: str | None = None
    model_path: str | None = None


class EncodedText(Request):
    type: Literal["encoded_text"] = "encoded_text"
    tokens: list[int]


class ModelInput(Request):
    chunks: list[dict[str, Any]]

    def tokens(self) -> list[int]:
        out: list[int] = []
        for chunk in self.chunks:
            if chunk.get("type", "encoded_text") != "encoded_text":
                raise invalid(f"{chunk.get('type')!r} chunks are not supported", hint="send token chunks")
            out.extend(parse(EncodedText, chunk, "prompt chunk").tokens)
        return out


class SamplingParams(Request):
    max_tokens: int | None = Field(default=None, ge=0)
    seed: int | None = None
    stop: str | list[str] | list[int] | None = None
    temperature: float = Field(default=1.0, ge=0)
    top_k: int = -1
    top_p: float = Field(default=1.0, gt=0, le=1)


class Sample(Request):
    num_samples: int = Field(default=1, ge=1, le=1024)
    prompt: ModelInput
    sampling_params: SamplingParams
    base_model: str | None = None
    model_path: str | None = None
    sampling_session_id: str | None = None
    seq_id: int | None = None
    prompt_logprobs: bool | None = None
    topk_prompt_logprobs: int = Field(default=0, ge=0)
    topk_sample_logprobs: int = Field(default=0, ge=0)
    target_prompt_logprobs: Any = None
    prompt_alt_tokens_k: int = 0
    record_stability_info: bool | None = None


class RetrieveFuture(Request):
    request_id: str
    allow_metadata_only: bool = False
