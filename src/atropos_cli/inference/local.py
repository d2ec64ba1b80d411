"""The in-process `transformers` backend (`server_type: local`): a causal LM sampled in a worker thread.

Flow: `chat(messages, params)` renders the chat template and tokenizes (or `complete(prompt)` takes text or
ids) -> a `_Job` goes to the `RequestBatcher` (`inference/batching.py`), which merges concurrent jobs into
one batch -> `_run_jobs` expands each job into `n` rows and samples them: on CUDA with the static engine
(`inference/engine.py`: prefix-shared block KV cache, CUDA-graph decode steps, continuous batching), on
CPU (and for top-logprobs requests) with `sample_rows` (`inference/sampler.py`: a loop over the model's
forward with a growing KV cache) -> `Generation` with prompt token ids, completion token ids and one logprob
per completion token.

Logprobs are what vLLM returns by default (`logprobs_mode="raw_logprobs"`): the log-softmax of the model's
raw logits at each step, before temperature and top-p, evaluated at the sampled token. They therefore equal
a plain forward pass of the same model over prompt + completion, which is what a trainer recomputes.
`token_ids` include the EOS token when the model stopped on its own (its text does not).

`reload(path)` loads new weights (and the tokenizer, when the directory has one) and swaps them in between
two batches; `version` counts swaps. torch and transformers are imported only when a backend is built.
"""

from __future__ import annotations

import contextlib
import random
import time
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from atropos_cli.config import ServerConfig
from atropos_cli.errors import BadRequestError, ConfigError, ModelLoadError
from atropos_cli.inference.base import Choice, Generation, SamplingParams, Usage
from atropos_cli.inference.batching import RequestBatcher
from atropos_cli.inference.engine import EngineShape, StaticEngine, engine_shape, kv_layout, supports
from atropos_cli.inference.sampler import RowRequest, RowResult, sample_rows
from atropos_cli.resources import resolve_model_path, shipped_models

__all__ = [
    "LocalBackend",
    "LocalChoice",
    "BadRequestError",
    "load_model",
    "resolve_device",
    "resolve_dtype",
    "set_cpu_threads",
]

DTYPES = ("auto", "float32", "bfloat16", "float16")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


class LocalChoice(Choice):
    """A choice plus the top-k alternatives per token, when asked for: [(token id, logprob), ...] per step."""

    top_logprobs: list[list[tuple[int, float]]] | None = None


@dataclass
class _Loaded:
    """What one batch reads at its start; replaced as a whole by `reload`, so a swap is atomic."""

    model: Any
    tokenizer: Any
    version: int
    path: str
    vision: Any = None  # a VL model's image side (`atropos_cli.vision.VisionProcessor`); None: text only


@dataclass
class _Job:
    prompt_ids: list[int]
    params: SamplingParams
    top_logprobs: int
    vision: Any = None  # the prompt's images (`atropos_cli.vision.VisionInputs`)


def resolve_device(name: str) -> str:
    """`auto` picks cuda, then mps, then cpu."""
    import torch

    if name != "auto":
        return name
    if torch.cuda.is_available():
        return "cuda"
    mps = getattr(torch.backends, "mps", None)
    return "mps" if mps is not None and mps.is_available() else "cpu"


def resolve_dtype(name: str, device: str) -> Any:
    """`auto` is bfloat16 on CUDA and float32 elsewhere (CPU matmuls in bf16 are slow and less exact)."""
    import torch

    if name not in DTYPES:
        raise ConfigError(f"unknown dtype {name!r}", hint=f"use one of: {', '.join(DTYPES)}")
    if name == "auto":
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    return getattr(torch, name)


def _looks_like_path(name: str) -> bool:
    return name.startswith(("/", ".", "~")) or name.count("/") > 1 or "\\" in name


def load_model(name: str, device: str, dtype: str) -> _Loaded:
    """Load tokenizer + model from a shipped short name, a directory or a hub id, with errors that say why."""
    from atropos_cli.inference.tokenizer import load_tokenizer

    path = resolve_model_path(name)
    if not Path(path).exists() and _looks_like_path(path):
        shipped = ", ".join(shipped_models()) or "none"
        raise ModelLoadError(
            f"model path {path!r} does not exist", hint=f"pass a saved model directory or a shipped model: {shipped}"
        )
    if Path(path).is_dir() and not (Path(path) / "config.json").is_file():
        raise ModelLoadError(f"directory {path!r} has no config.json", hint="save the model with save_pretrained")
    if Path(path).is_dir() and not any((Path(path) / f).is_file() for f in TOKENIZER_FILES):
        raise ModelLoadError(
            f"directory {path!r} has no tokenizer files ({', '.join(TOKENIZER_FILES[:2])})",
            hint="save one beside the weights with tokenizer.save_pretrained(DIR)",
        )
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:
        raise ModelLoadError(
            f"cannot load {name!r}: transformers is not installed", hint='pip install "atropos[local]"'
        ) from None
    hf_logging.disable_progress_bar()  # "Loading weights" bars would interleave with our own progress output
    tokenizer = load_tokenizer(path)
    torch_device = resolve_device(device)
    try:
        model, vision = pretrained(path, resolve_dtype(dtype, torch_device))
    except OSError as exc:
        raise ModelLoadError(
            f"cannot load model {name!r}: not a local directory, and the Hugging Face hub is unreachable "
            f"(offline?) or has no such repo ({type(exc).__name__})",
            hint="pass a local directory (a saved model), or a shipped model: " + ", ".join(shipped_models()),
        ) from None
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    # transformers' stubs type the self argument of the decorated `.to()` wrongly
    return _Loaded(model.to(torch_device).eval(), tokenizer, 0, path, vision)  # type: ignore[arg-type]


def pretrained(path: str, dtype: Any) -> tuple[Any, Any]:
    """(model, its image side or None) from a directory or hub id: a causal LM, or a vision-language model
    (AutoModelForImageTextToText with the image processor saved beside it). OSError when neither is reachable."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    from atropos_cli.vision import VisionProcessor, is_vision_config

    config = AutoConfig.from_pretrained(path)
    if not is_vision_config(config):
        return AutoModelForCausalLM.from_pretrained(path, dtype=dtype), None
    model = AutoModelForImageTextToText.from_pretrained(path, dtype=dtype)
    return model, VisionProcessor.load(path, model.config)


def set_cpu_threads(model: Any, num_threads: int | None) -> None:
    """On CPU, a small model runs fastest on ONE thread: its matmuls are too small to split, and on a shared
    machine extra OpenMP threads spin-wait for busy cores (measured 10-30x slower on 2 contended cores)."""
    import torch

    if model.device.type != "cpu":
        return
    if num_threads is None:
        small = sum(p.numel() for p in model.parameters()) < 50_000_000
        num_threads = 1 if small else torch.get_num_threads()
    torch.set_num_threads(num_threads)


MAX_ENGINES = 3  # static engines kept at once (each holds its own KV blocks and CUDA graphs)
ROOMY = 4  # a batch may run on a kept engine with up to this many times its group slots (no new compile)


class LocalBackend:
    """InferenceBackend over an in-process transformers model; concurrent calls are batched."""

    def __init__(
        self,
        config: ServerConfig,
        max_batch_size: int = 128,
        max_wait_s: float = 0.002,
        num_threads: int | None = None,
        model: tuple[Any, Any] | None = None,
        vision: Any = None,
    ) -> None:
        """`model`: (model, tokenizer) already in memory (the Tinker service's sampler weights), instead of
        loading `config.model_name`; `vision`: such a model's image side (`atropos_cli.vision.VisionProcessor`)."""
        self.config = config
        self.model_name = config.model_name
        self._state = (
            _Loaded(model[0], model[1], 0, config.model_name, vision)
            if model is not None
            else load_model(config.model_name, config.device, config.dtype)
        )
        self.device = str(self._state.model.device)
        set_cpu_threads(self._state.model, num_threads)
        # static engines by (model, group width, group slots), least recently used first (`_engine`)
        self._engines: OrderedDict[tuple[int, int, int], StaticEngine] = OrderedDict()
        self.generate_s = 0.0  # seconds spent sampling (the one-command loop's generation share)
        self.engine_builds = 0  # static engines built (each a compile of the decode step and new CUDA graphs)
        self._batcher: RequestBatcher[_Job, list[RowResult]] = RequestBatcher(
            self._run_jobs, lambda job: job.params.n, max_batch_size=max_batch_size, max_wait_s=max_wait_s
        )

    # -- what callers read -------------------------------------------------------------------------------
    @property
    def tokenizer(self) -> Any:
        return self._state.tokenizer

    @property
    def model(self) -> Any:
        """The model the next batch samples from."""
        return self._state.model

    @property
    def vision(self) -> Any:
        """The model's image side (`atropos_cli.vision.VisionProcessor`), or None for a text-only model."""
        return self._state.vision

    @property
    def tokenizer_name(self) -> str:
        return self._state.path

    @property
    def version(self) -> int:
        return self._state.version

    @property
    def max_model_len(self) -> int:
        config = self._state.model.config.get_text_config()  # a VL model's: its text stack's
        return int(getattr(config, "max_position_embeddings", None) or self.tokenizer.model_max_length)

    @property
    def batcher(self) -> RequestBatcher[_Job, list[RowResult]]:
        return self._batcher

    # -- requests --------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def expecting(self, rows: int, tokens_per_row: int) -> Iterator[None]:
        """A producer is about to send `rows` rows of up to `tokens_per_row` tokens each (one training step's
        rollouts): they become one engine batch. The batch cap grows to `rows` (it never shrinks: the engine's
        shape follows it, and a new shape is a new compile) as far as their KV cache fits (`rows_that_fit`),
        and the batcher waits for them (`RequestBatcher.expecting`)."""
        fit = min(rows, self.rows_that_fit(tokens_per_row))
        self._batcher.max_batch_size = max(self._batcher.max_batch_size, fit)
        with self._batcher.expecting(rows):
            yield

    def rows_that_fit(self, tokens_per_row: int, share: float = 0.5) -> int:
        """How many rows of `tokens_per_row` tokens the engine's KV cache can hold in `share` of the device's free
        memory (CUDA); unbounded elsewhere (the CPU path's cache grows with the batch, as the model's would) and
        for an engine that holds no model here (the colocated vLLM pages its own cache and admits what fits)."""
        import torch

        model = self._state.model
        if model is None or model.device.type != "cuda":
            return 1 << 30
        config = model.config.get_text_config()  # a VL model's: its text stack's
        heads, dim = kv_layout(config)
        per_token = 2 * config.num_hidden_layers * heads * dim * model.dtype.itemsize  # K and V, every layer
        free, _ = torch.cuda.mem_get_info(model.device)
        return max(1, int(free * share) // (per_token * max(1, tokens_per_row)))

    def chat_prompt_ids(self, messages: list[dict[str, Any]]) -> list[int]:
        """Token ids of the chat rendered with the model's template, ending with the assistant header."""
        from jinja2 import TemplateError

        tokenizer = self.tokenizer
        if tokenizer.chat_template is None:
            raise BadRequestError(
                f"model {self.model_name!r} has no chat template", hint="use the completions endpoint"
            )
        try:
            text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        except TemplateError as exc:
            raise BadRequestError(
                f"the chat template rejected the messages: {exc}",
                hint="check the roles and order of the env's messages against the model's chat template",
            ) from None
        return list(tokenizer.encode(text, add_special_tokens=False))

    async def chat(self, messages: list[dict[str, Any]], params: SamplingParams, top_logprobs: int = 0) -> Generation:
        from atropos_cli.vision import message_images

        images = message_images(messages)
        if not images:
            return await self._generate(self.chat_prompt_ids(messages), params, top_logprobs)
        vision = self._state.vision
        if vision is None:  # as vLLM answers a text-only model: an error, never the images silently dropped
            raise BadRequestError(
                f"model {self.model_name!r} reads text only; the request has {len(images)} image part(s)",
                hint="train a vision-language model (atropos models lists the family), or send text only",
            )
        pixels = vision.inputs(images, BadRequestError)
        ids = vision.expand(self.chat_prompt_ids(messages), pixels, BadRequestError)
        return await self._generate(ids, params, top_logprobs, pixels)

    async def complete(self, prompt: str | list[int], params: SamplingParams, top_logprobs: int = 0) -> Generation:
        if isinstance(prompt, str):
            ids = list(self.tokenizer.encode(prompt, add_special_tokens=True))
        else:
            ids = list(prompt)
            vocab = len(self.tokenizer)
            bad = [t for t in ids if not 0 <= t < vocab]
            if bad:
                raise BadRequestError(
                    f"prompt token id {bad[0]!r} is outside the vocabulary (0..{vocab - 1})",
                    hint="tokenize the prompt with this model's tokenizer",
                )
        return await self._generate(ids, params, top_logprobs)

    async def _generate(
        self, prompt_ids: list[int], params: SamplingParams, top_logprobs: int, vision: Any = None
    ) -> Generation:
        limit = self.max_model_len
        if not prompt_ids:
            raise BadRequestError("the prompt is empty", hint="send at least one token")
        if len(prompt_ids) >= limit:
            raise BadRequestError(
                f"prompt is {len(prompt_ids)} tokens but model {self.model_name!r} has a context of {limit} tokens",
                hint=f"shorten the prompt to at most {limit - 1} tokens",
            )
        rows = await self._batcher.submit(_Job(prompt_ids, params, top_logprobs, vision))
        choices = [self._choice(i, row, params) for i, row in enumerate(rows)]
        completion_tokens = sum(len(r.token_ids) for r in rows)
        return Generation(
            model=self.model_name,
            choices=choices,
            prompt_token_ids=prompt_ids,
            usage=Usage(
                prompt_tokens=len(prompt_ids),
                completion_tokens=completion_tokens,
                total_tokens=len(prompt_ids) + completion_tokens,
            ),
        )

    def _choice(self, index: int, row: RowResult, params: SamplingParams) -> LocalChoice:
        return LocalChoice(
            index=index,
            text=row.text,
            finish_reason=row.finish_reason,
            token_ids=row.token_ids,
            logprobs=row.logprobs if params.logprobs else None,
            top_logprobs=row.top_logprobs,
        )

    def _run_jobs(self, jobs: list[_Job]) -> list[list[RowResult]]:
        """In the model thread: one batched sampling pass over every row of every job."""
        rows = self._rows(jobs)
        started = time.perf_counter()
        results = self._sample(rows)
        self.generate_s += time.perf_counter() - started
        out, start = [], 0
        for job in jobs:
            out.append(results[start : start + job.params.n])
            start += job.params.n
        return out

    def _rows(self, jobs: list[_Job]) -> list[RowRequest]:
        """Each job's `n` choices as rows: its budget capped by the context, seeds base_seed + choice index."""
        rows: list[RowRequest] = []
        for job in jobs:
            budget = self.max_model_len - len(job.prompt_ids)
            max_new = min(job.params.max_tokens or budget, budget)
            base_seed = job.params.seed if job.params.seed is not None else random.getrandbits(62)
            for choice in range(job.params.n):
                rows.append(
                    RowRequest(
                        prompt_ids=job.prompt_ids,
                        max_new_tokens=max_new,
                        temperature=job.params.temperature,
                        top_p=job.params.top_p,
                        stop=[s if isinstance(s, str) else self.tokenizer.decode([s]) for s in job.params.stop or []],
                        seed=base_seed + choice,
                        top_logprobs=job.top_logprobs,
                        vision=job.vision,
                    )
                )
        return rows

    def _sample(self, rows: list[RowRequest]) -> list[RowResult]:
        """The rows sampled by this backend's engine (the static engine on CUDA, `sample_rows` elsewhere)."""
        state = self._state  # read once: a reload during this batch takes effect at the next one
        fast = state.model.device.type == "cuda" and supports(state.model)  # False for a VL model
        if fast and not any(r.top_logprobs for r in rows):
            return self._engine(state, rows).run(rows, swap=self._swap_point(state.model))
        return sample_rows(state.model, state.tokenizer, rows)

    def _swap_point(self, model: Any) -> Any:
        """What the static engine calls between decode steps to take new weights in place (returning their
        version), or None: this backend's weights change only between batches (`reload`)."""
        return None

    def _engine(self, state: _Loaded, rows: list[RowRequest]) -> StaticEngine:
        """The static engine for this batch (`engine_shape`: group width, group slots for the batch rounded up
        to a power of two rows, at most `max_batch_size`, block lengths). Engines are kept per (width, group
        slots), the MAX_ENGINES most recently used, and a batch runs on a kept one with room for it (`_roomy`):
        a loop whose batches vary in size (a step's first group alone, then the rest; an async engine fed as
        rollouts come back) reuses them instead of rebuilding one on every switch (a build is a compile of the
        decode step and new CUDA graphs: seconds to a minute). A kept engine whose blocks are too short for the
        batch is rebuilt with blocks that fit both (they only grow: alternating lengths do not rebuild)."""
        shape = engine_shape(rows, self._batcher.max_batch_size)
        key = (id(state.model), shape.width, shape.groups)
        kept = self._roomy(key, shape)
        if kept is not None:
            return kept
        engine = self._engines.pop(key, None)
        if engine is not None:  # this size's engine, with blocks too short for the batch
            old = engine.shape
            grown = (max(old.prompt_len, shape.prompt_len), max(old.gen_len, shape.gen_len))
            shape = EngineShape(shape.width, shape.groups, *grown)
            del engine  # free its cache and graphs before allocating the new ones
        for stale in [k for k in self._engines if k[0] != key[0]]:  # engines of a model a reload replaced
            del self._engines[stale]
        while len(self._engines) >= MAX_ENGINES:
            self._engines.popitem(last=False)
        self._engines[key] = engine = StaticEngine(state.model, state.tokenizer, shape)
        self.engine_builds += 1
        return engine

    def _roomy(self, key: tuple[int, int, int], shape: EngineShape) -> StaticEngine | None:
        """A kept engine that holds this batch at once: the same model and group width, at least the batch's
        group slots but at most ROOMY times as many (idle slots still cost each decode step), blocks that fit.
        The exact shape first, else the smallest such."""
        model_id, width, groups = key
        fits = [
            (k, e)
            for k, e in self._engines.items()
            if k[:2] == (model_id, width) and groups <= k[2] <= ROOMY * groups
            and e.shape.prompt_len >= shape.prompt_len and e.shape.gen_len >= shape.gen_len
        ]  # fmt: skip
        if not fits:
            return None
        k, engine = min(fits, key=lambda item: item[0][2])
        self._engines.move_to_end(k)
        return engine

    # -- weights ---------------------------------------------------------------------------------------
    def reload(self, path: str) -> int:
        """Load weights from `path` (a saved model directory) and swap them in; returns the new version."""
        directory = Path(resolve_model_path(path))
        if not directory.is_dir():
            raise ModelLoadError(f"checkpoint directory {str(path)!r} does not exist", hint="pass a saved model dir")
        if not (directory / "config.json").is_file():
            raise ModelLoadError(f"directory {str(path)!r} has no config.json", hint="save it with save_pretrained")
        has_tokenizer = any((directory / f).is_file() for f in TOKENIZER_FILES)
        if has_tokenizer:
            fresh = load_model(str(directory), self.config.device, self.config.dtype)
        else:  # weights only: this model's tokenizer and image side stay
            from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

            auto = AutoModelForCausalLM if self._state.vision is None else AutoModelForImageTextToText
            model = auto.from_pretrained(directory, dtype=self._state.model.dtype)
            state = self._state
            fresh = _Loaded(model.to(state.model.device).eval(), state.tokenizer, 0, str(directory), state.vision)
        fresh.version = self._state.version + 1
        self._state = fresh  # one attribute store: atomic for the batch thread
        return fresh.version

    async def areload(self, path: str) -> int:
        """`reload` in the model thread, so the swap lands between two batches."""
        return await self._batcher.run_in_worker(self.reload, path)

    async def aclose(self) -> None:
        await self._batcher.aclose()
