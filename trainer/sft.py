"""Supervised fine-tuning: chats in, a saved model out. The SFT path of `atropos train --sft DATA`.

Algorithm (reads top to bottom in `run_sft`):
1. read rows from jsonl/parquet files: a `messages` column (list of {role, content}, as `atropos sft-gen`
   writes it) or a `prompt`/`completion` pair (strings, or lists of messages in TRL's conversational form);
2. tokenize each chat with the tokenizer's chat template, segment by segment, so the ids are exactly what the
   inference backends see (prompt with generation header, then the completion, then EOS); labels are -100
   everywhere except on assistant turns (loss only on what the model says);
3. AdamW on fp32 master weights, linear warmup then cosine decay, gradient clipping, shuffled batches
   (seeded), right padding;
4. save with `save_pretrained` + the tokenizer (and optional intermediate checkpoints under
   `OUT/checkpoints/step-N`), plus `sft_config.json` so the run can be repeated.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from atropos_cli.errors import ConfigError, ModelLoadError, OutputExistsError, RecordError

__all__ = ["SFTConfig", "run_sft", "load_chats", "encode_chat"]

log = logging.getLogger(__name__)
IGNORE = -100


class SFTConfig(BaseModel):
    """Everything one SFT run needs; saved as `sft_config.json` beside the weights."""

    model_config = ConfigDict(extra="forbid")

    data: list[str] = Field(description="jsonl or parquet files with `messages` or `prompt`/`completion`")
    model: str = Field("atropos-tiny-arith", description="a shipped model's short name, a directory, or a hub id")
    out: str = Field(description="directory the trained model is saved to")
    epochs: float = Field(1.0, gt=0)
    max_steps: int | None = Field(None, ge=1, description="stop after this many steps (overrides epochs)")
    lr: float = Field(1e-4, gt=0)
    min_lr_ratio: float = Field(0.1, ge=0, le=1)
    warmup_steps: int = Field(0, ge=0)
    weight_decay: float = Field(0.0, ge=0)
    grad_clip: float = Field(1.0, gt=0)
    batch_size: int = Field(8, ge=1)
    seed: int = 0
    max_length: int = Field(1024, ge=2, description="longer chats are truncated (and counted)")
    save_every: int | None = Field(None, ge=1, description="also save OUT/checkpoints/step-N every N steps")
    log_every: int = Field(50, ge=1)
    device: str = "auto"
    threads: int | None = Field(None, ge=1, description="torch CPU threads; default: 1 for small models on CPU")
    overwrite: bool = False

    @field_validator("data", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        return [value] if isinstance(value, str | Path) else value


def _read_rows(path: Path) -> list[tuple[str, dict[str, Any]]]:
    """(where, row) pairs; `where` is `file:line` for jsonl and `file:row N` for parquet, for error messages."""
    if not path.is_file():
        raise ConfigError(f"SFT data file {str(path)!r} does not exist", hint="pass a jsonl or parquet file")
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return [(f"{path}:row {i}", row) for i, row in enumerate(pq.read_table(path).to_pylist())]
    rows = []
    with path.open() as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                rows.append((f"{path}:{number}", json.loads(line)))
            except json.JSONDecodeError as exc:
                raise RecordError(
                    f"not valid JSON ({exc.msg})", hint="fix or delete that line", file=str(path), line=number
                ) from None
    return rows


def _as_messages(value: Any, role: str) -> list[dict[str, Any]]:
    if isinstance(value, str):
        return [{"role": role, "content": value}]
    return list(value)


def _row_to_chat(where: str, row: dict[str, Any]) -> list[dict[str, Any]]:
    if "messages" in row:
        chat = row["messages"]
        chat = json.loads(chat) if isinstance(chat, str) else chat
    elif "prompt" in row and "completion" in row:
        chat = _as_messages(row["prompt"], "user") + _as_messages(row["completion"], "assistant")
    else:
        raise RecordError(
            f"{where}: row has neither 'messages' nor 'prompt'/'completion' (keys: {sorted(row)})",
            hint='write SFT data with `atropos sft-gen`, or give rows {"messages": [{role, content}, ...]}',
        )
    if not isinstance(chat, list) or not all(isinstance(m, dict) and "role" in m and "content" in m for m in chat):
        raise RecordError(
            f"{where}: messages must be a list of {{role, content}} dicts, got {chat!r:.120}",
            hint='write rows as sft-gen does: {"messages": [{"role": ..., "content": ...}, ...]}',
        )
    if not any(m["role"] == "assistant" for m in chat):
        raise RecordError(
            f"{where}: chat has no assistant message, so there is nothing to train on",
            hint="drop that row, or build the data with `atropos sft-gen`",
        )
    return chat


def load_chats(paths: list[str]) -> list[list[dict[str, Any]]]:
    """All chats of all files, in file order."""
    return [_row_to_chat(where, row) for path in paths for where, row in _read_rows(Path(path))]


def encode_chat(tokenizer: Any, chat: list[dict[str, Any]]) -> tuple[list[int], list[int]]:
    """(input ids, labels) of one chat; labels are the ids on assistant turns and -100 elsewhere.

    Each segment (text before an assistant turn, then the turn itself) is tokenized on its own, exactly as the
    backends tokenize a prompt and then generate the completion, so training and sampling see the same ids.
    """
    render = tokenizer.apply_chat_template
    ids: list[int] = []
    labels: list[int] = []
    done = ""
    for index, message in enumerate(chat):
        if message["role"] != "assistant":
            continue
        before = render(chat[:index], add_generation_prompt=True, tokenize=False) if index else ""
        after = render(chat[: index + 1], tokenize=False)
        if index and not before.startswith(done) or not after.startswith(before):
            raise RecordError(
                "the chat template does not render a chat as a prefix of its continuation",
                hint="SFT needs an append-only chat template (most templates are)",
            )
        prompt_ids = tokenizer.encode(before[len(done) :], add_special_tokens=False)
        answer_ids = tokenizer.encode(after[len(before) :], add_special_tokens=False)
        ids += prompt_ids + answer_ids
        labels += [IGNORE] * len(prompt_ids) + answer_ids
        done = after
    return ids, labels


def _resolve_device(name: str) -> str:
    import torch

    if name != "auto":
        return name
    if torch.cuda.is_available():
        return "cuda"
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return "mps"
    return "cpu"


def _load_model_and_tokenizer(name: str, device: str) -> tuple[Any, Any]:
    """The policy loader GRPO uses (fp32 weights + tokenizer), refusing a tokenizer without a chat template."""
    from atropos_cli.inference.tokenizer import load_tokenizer

    from .step.grpo import load_policy

    if load_tokenizer(name).chat_template is None:  # checked first: cheap, and before any weights load
        raise ModelLoadError(f"tokenizer of {name!r} has no chat template", hint="SFT on chats needs one")
    return load_policy(name, device)


def _lr_factor(step: int, warmup: int, total: int, min_ratio: float) -> float:
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def _batches(examples: list[tuple[list[int], list[int]]], config: SFTConfig, total_steps: int, pad_id: int):
    """Yield (input_ids, attention_mask, labels) tensors, reshuffling every epoch with a seeded generator."""
    import torch

    generator = torch.Generator().manual_seed(config.seed)
    step = 0
    while True:
        order = torch.randperm(len(examples), generator=generator).tolist()
        # drop the last partial batch (every step sees batch_size chats), unless the data is smaller than one
        for start in range(0, max(1, len(order) - config.batch_size + 1), config.batch_size):
            chunk = [examples[i] for i in order[start : start + config.batch_size]]
            width = max(len(ids) for ids, _ in chunk)
            ids = torch.full((len(chunk), width), pad_id, dtype=torch.long)
            labels = torch.full((len(chunk), width), IGNORE, dtype=torch.long)
            mask = torch.zeros((len(chunk), width), dtype=torch.long)
            for row, (x, y) in enumerate(chunk):
                ids[row, : len(x)] = torch.tensor(x)
                labels[row, : len(y)] = torch.tensor(y)
                mask[row, : len(x)] = 1
            yield ids, mask, labels
            step += 1
            if step >= total_steps:
                return


def _prepare_out(config: SFTConfig) -> Path:
    out = Path(config.out)
    if out.exists() and any(out.iterdir()) and not config.overwrite:
        raise OutputExistsError(f"output directory {str(out)!r} is not empty", hint="pass --overwrite")
    out.mkdir(parents=True, exist_ok=True)
    return out


def _save(model: Any, tokenizer: Any, path: Path) -> None:
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)


def _encode_all(tokenizer: Any, config: SFTConfig) -> list[tuple[list[int], list[int]]]:
    examples, truncated = [], 0
    for chat in load_chats(config.data):
        ids, labels = encode_chat(tokenizer, chat)
        truncated += len(ids) > config.max_length
        examples.append((ids[: config.max_length], labels[: config.max_length]))
    if truncated:  # counted, not silent: the log says how many chats lost their tail
        log.warning("truncated %d of %d chats to max_length=%d", truncated, len(examples), config.max_length)
    return examples


def run_sft(config: SFTConfig, on_log: Callable[[dict[str, float]], None] | None = None) -> Path:
    """Train `config.model` on `config.data` and save it to `config.out`; returns that directory.

    `on_log` receives {step, loss, lr, tokens_per_s, elapsed_s} every `log_every` steps (and at the end).
    """
    import torch

    out = _prepare_out(config)
    torch.manual_seed(config.seed)
    device = _resolve_device(config.device)
    model, tokenizer = _load_model_and_tokenizer(config.model, device)
    from atropos_cli.inference.local import set_cpu_threads

    set_cpu_threads(model, config.threads)
    examples = _encode_all(tokenizer, config)
    steps_per_epoch = max(1, len(examples) // config.batch_size)
    total = config.max_steps or max(1, math.ceil(config.epochs * steps_per_epoch))
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, betas=(0.9, 0.95), weight_decay=config.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: _lr_factor(s, config.warmup_steps, total, config.min_lr_ratio)
    )
    model.train()
    started, seen_tokens, running = time.perf_counter(), 0, 0.0
    for step, (ids, mask, labels) in enumerate(_batches(examples, config, total, tokenizer.pad_token_id), 1):
        ids, mask, labels = ids.to(device), mask.to(device), labels.to(device)
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        seen_tokens += int(mask.sum())
        running = loss.item() if step == 1 else 0.9 * running + 0.1 * loss.item()
        if on_log and (step % config.log_every == 0 or step == total):
            elapsed = time.perf_counter() - started
            on_log(
                {
                    "step": step,
                    "loss": round(running, 4),
                    "lr": float(scheduler.get_last_lr()[0]),
                    "tokens_per_s": round(seen_tokens / elapsed, 1),
                    "elapsed_s": round(elapsed, 1),
                }
            )
        if config.save_every and step % config.save_every == 0 and step < total:
            _save(model, tokenizer, out / "checkpoints" / f"step-{step:06d}")
    model.eval()
    _save(model, tokenizer, out)
    (out / "sft_config.json").write_text(json.dumps(config.model_dump(), indent=2) + "\n")
    return out
