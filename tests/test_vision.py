"""Vision-language models (Qwen2.5-VL, a tiny shape of random weights built offline): the logprob contract on
image + text rows (the local backend's sampled-token logprobs, the trainer's, and transformers' eager forward of the
same tokens and image agree), the trainer placing an Atropos env's images in its rows, and bad input as one error."""

from __future__ import annotations

import asyncio
import base64
import io
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from atropos_cli.config import ServerConfig  # noqa: E402
from atropos_cli.errors import BadRequestError, InputError  # noqa: E402
from atropos_cli.families_vl import save_tiny  # noqa: E402
from atropos_cli.inference.base import SamplingParams  # noqa: E402
from atropos_cli.inference.local import LocalBackend  # noqa: E402
from atropos_cli.types import ScoredGroup  # noqa: E402

TOL = 1e-4  # fp32 on CPU: the same model, the same positions, different batch shapes


def png(shade: int, size: int = 4) -> str:
    """A data URL of a tiny PNG, as Atropos' multimodal envs send images."""
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (size, size), (shade, 255 - shade, 0)).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def chat(url: str) -> list[dict]:
    text = {"type": "text", "text": "Count the cubes."}
    return [{"role": "user", "content": [text, {"type": "image_url", "image_url": {"url": url}}]}]


@pytest.fixture(scope="module")
def vl_dir(tmp_path_factory) -> Path:
    return save_tiny(tmp_path_factory.mktemp("vl") / "tiny-vl")


@pytest.fixture(scope="module")
def backend(vl_dir) -> LocalBackend:
    return LocalBackend(ServerConfig(model_name=str(vl_dir), server_type="local", device="cpu"))


def eager_logprobs(backend: LocalBackend, ids: list[int], url: str, start: int) -> torch.Tensor:
    """transformers' own forward (its rope index from the token types), log-softmax at tokens[start:]."""
    vision = backend.vision.inputs([url])
    x = torch.tensor([ids])
    model = backend.model
    with torch.no_grad():
        logits = model(
            input_ids=x, pixel_values=vision.pixel_values, image_grid_thw=vision.image_grid_thw,
            mm_token_type_ids=(x == model.config.image_token_id).int(),
        ).logits[0].float()  # fmt: skip
    logp = torch.log_softmax(logits[start - 1 : -1], dim=-1)
    return logp.gather(1, x[0, start:, None])[:, 0]


def test_rollout_trainer_and_eager_logprobs_agree_on_image_rows(backend, vl_dir):
    url = png(40)
    generation = asyncio.run(backend.chat(chat(url), SamplingParams(n=3, max_tokens=12, seed=3)))
    prompt = generation.prompt_token_ids
    image_pad = backend.model.config.image_token_id
    assert prompt.count(image_pad) == 4  # a 4x4 image -> 56x56 -> 4x4 patches -> 2x2 merged tokens
    from atropos_cli.trainer.step.batching import prepare
    from atropos_cli.trainer.step.grpo import GRPOConfig, GRPOTrainer

    trainer = GRPOTrainer(GRPOConfig(model=str(vl_dir), out="unused", chunk_size=16))
    # the env's tokens as Atropos' multimodal envs give them: the chat without its image (tokenize_for_trainer)
    text_only = backend.chat_prompt_ids([{"role": "user", "content": "Count the cubes."}])
    rows = [text_only + list(c.token_ids) for c in generation.choices]
    group = ScoredGroup(
        tokens=rows, masks=[[-100] * len(text_only) + list(c.token_ids) for c in generation.choices],
        scores=[1.0, 0.0, -1.0], images=[url.split(",", 1)[1]] * 3,  # bare base64, as the envs store them
    )  # fmt: skip
    groups, vision = trainer.vision.expand([group])
    assert [t[: len(prompt)] for t in groups[0].tokens] == [prompt] * 3  # the image where the rollout had it
    samples = prepare(groups, True, False, 512, vision=vision).samples
    batches = trainer._micro_batches(samples)
    assert len(batches) == 3 and all(mb.pixel_values is not None for mb in batches)
    for choice, mb in zip(generation.choices, batches, strict=True):
        with torch.no_grad():
            got = trainer._logprobs(trainer.model, mb)[0][mb.loss_mask[0] == 1]
        ids = prompt + list(choice.token_ids)
        eager = eager_logprobs(backend, ids, url, len(prompt))
        sampled = torch.tensor(choice.logprobs)
        assert len(choice.token_ids) > 1 and got.shape == eager.shape == sampled.shape
        assert (sampled - eager).abs().max().item() < TOL, "rollout logprobs differ from the eager forward"
        assert (got - eager).abs().max().item() < TOL, "trainer logprobs differ from the eager forward"
    # the image matters: the same tokens with another image give other logprobs
    other = eager_logprobs(backend, prompt + list(generation.choices[0].token_ids), png(200, 8), len(prompt))
    assert (other - torch.tensor(generation.choices[0].logprobs)).abs().max().item() > 1e-3


def test_an_image_request_to_a_text_only_model_is_one_error():
    backend = LocalBackend(ServerConfig(model_name="atropos-tiny-arith", server_type="local", device="cpu"))
    with pytest.raises(BadRequestError, match="reads text only; the request has 1 image part"):
        asyncio.run(backend.chat(chat(png(10)), SamplingParams(n=1, max_tokens=2)))


def test_an_unreadable_image_is_one_error(backend):
    with pytest.raises(BadRequestError, match="cannot read image") as caught:
        asyncio.run(backend.chat(chat("data:image/png;base64,bm90IGFuIGltYWdl"), SamplingParams(max_tokens=2)))
    assert "data URL" in caught.value.hint
    with pytest.raises(BadRequestError, match="is a URL"):
        asyncio.run(backend.chat(chat("http://127.0.0.1:9/x.png"), SamplingParams(max_tokens=2)))


def test_image_rows_for_a_text_only_trainer_are_refused():
    from atropos_cli.trainer.step.vision_rows import refuse_images

    group = ScoredGroup(tokens=[[1, 2, 3]], masks=[[-100, 2, 3]], scores=[1.0], images=["aGk="])
    with pytest.raises(InputError, match="reads text only; the batch has 1 rollout"):
        refuse_images([group], "atropos-tiny-arith")


def test_atropos_models_lists_the_vision_language_family_and_its_paths():
    from typer.testing import CliRunner

    from atropos_cli.cli.app import app

    result = CliRunner().invoke(app, ["models"], env={"COLUMNS": "500"})
    assert result.exit_code == 0, result.output
    row = next(line for line in result.output.splitlines() if line.split()[:1] == ["qwen2_5_vl"])
    assert "Qwen2.5-VL-3B" in row and "patch merger" in row and "mrope" in row
    assert "loop sampler: the static engine refuses this model (a vision-language model" in row
    assert "each image row its own micro-batch" in row


def test_image_rows_through_the_trajectory_api_reach_the_trainer_with_their_images(trajectory_api, vl_dir):
    """An env posts a group with images; the trainer's batch from `GET /batch` holds them, and the VL trainer's
    rows get their image tokens and pixels from it."""
    from atropos_cli.api.client import ApiClient, TrainerRegistration
    from atropos_cli.inference.tokenizer import load_tokenizer
    from atropos_cli.trainer.step.vision_rows import VisionRows
    from atropos_cli.vision import VisionProcessor

    api = trajectory_api()
    tokenizer = load_tokenizer(str(vl_dir))
    turns = [{"role": "user", "content": "Count."}]
    prompt = tokenizer.apply_chat_template(turns, add_generation_prompt=True, return_dict=False)
    rows = [list(prompt) + [40, 41, 42], list(prompt) + [43, 44]]
    url = png(90)
    group = ScoredGroup(
        tokens=rows, masks=[[-100] * len(prompt) + r[len(prompt) :] for r in rows], scores=[1.0, -1.0],
        images=[url, url.split(",", 1)[1]],
    )  # fmt: skip

    async def round_trip() -> list[dict]:
        async with ApiClient(api.url) as client:
            await client.register(TrainerRegistration(batch_size=2))
            await client.post_groups([group])
            return await client.get_batch() or []

    (got,) = [ScoredGroup.model_validate(g) for g in asyncio.run(round_trip())]
    assert got.images == group.images
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(vl_dir)
    (expanded,), vision = VisionRows(VisionProcessor.load(str(vl_dir), config), tokenizer).expand([got])
    pads = [t.count(config.image_token_id) for t in expanded.tokens]
    assert pads == [4, 4] and [v.images for v in vision[0]] == [1, 1]
    assert all(m[: len(prompt) + 6] == [-100] * (len(prompt) + 6) for m in expanded.masks)  # never trained


def test_atropos_inference_serves_chats_with_images_for_a_vision_language_model(backend):
    import httpx

    from atropos_cli.inference.server import create_app
    from atropos_cli.testing.threaded import ThreadedServer

    body = {"messages": chat(png(70)), "n": 2, "max_tokens": 6, "logprobs": True, "seed": 1, "return_token_ids": True}
    with ThreadedServer(create_app(backend), lifespan="off") as server:
        reply = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60).json()
    assert reply["prompt_token_ids"].count(backend.model.config.image_token_id) == 4
    for choice in reply["choices"]:
        assert len(choice["token_ids"]) == len(choice["logprobs"]["content"]) >= 1


def test_a_vl_directory_without_its_image_processor_and_packing_are_refused_with_a_hint(vl_dir, tmp_path, backend):
    import shutil

    from atropos_cli.errors import ConfigError, ModelLoadError
    from atropos_cli.trainer.step.grpo import packing_mode

    bare = tmp_path / "bare"
    shutil.copytree(vl_dir, bare, ignore=shutil.ignore_patterns("preprocessor_config.json"))
    with pytest.raises(ModelLoadError, match="has no loadable image processor") as caught:
        LocalBackend(ServerConfig(model_name=str(bare), server_type="local", device="cpu"))
    assert "preprocessor_config.json" in caught.value.hint
    with pytest.raises(ConfigError, match="packing is not supported for vision-language models"):
        packing_mode(backend.model, True, "cpu")
    assert packing_mode(backend.model, None, "cuda") == "off"  # padded rows on CUDA too


def test_image_rows_of_many_prompts_sample_in_one_batch_as_each_prompt_alone(backend):
    """Three prompts (two images of different sizes, different prompt lengths, one text-only prompt), two choices
    each, in one batched decode: every row gets the tokens and logprobs it gets alone, and its logprobs are an
    eager forward's of prompt + completion with the model's own positions (so no row reads another's image)."""
    from atropos_cli.inference.sampler import RowRequest, sample_rows
    from atropos_cli.vision import VisionInputs, positions

    model, vision = backend.model, backend.vision
    urls = [png(40), png(200, 112)]
    texts = ["Count the cubes.", "Say which colour this picture is and why, in a few words."]
    prompts: list[tuple[list[int], VisionInputs | None]] = []
    for url, text in zip(urls, texts, strict=True):
        turns = [{"role": "user", "content": [{"type": "text", "text": text}, {"type": "image", "image": url}]}]
        pixels = vision.inputs([url])
        prompts.append((vision.expand(backend.chat_prompt_ids(turns), pixels), pixels))
    prompts.append((backend.chat_prompt_ids([{"role": "user", "content": "Hi."}]), None))
    assert len({len(ids) for ids, _ in prompts}) == 3 and prompts[1][0].count(model.config.image_token_id) == 16

    def rows(which: list[int]) -> list[RowRequest]:
        return [RowRequest(prompts[p][0], 8, seed=10 * p + c, vision=prompts[p][1]) for p in which for c in range(2)]

    together = sample_rows(model, backend.tokenizer, rows([0, 1, 2]))
    alone = [r for p in range(3) for r in sample_rows(model, backend.tokenizer, rows([p]))]
    for i, (got, want) in enumerate(zip(together, alone, strict=True)):
        assert got.token_ids == want.token_ids, f"row {i} sampled other tokens in the batch"
        assert max(abs(a - b) for a, b in zip(got.logprobs, want.logprobs, strict=True)) < 1e-5
        ids, pixels = prompts[i // 2]
        x = torch.tensor([ids + got.token_ids])
        images = (
            {} if pixels is None else {"pixel_values": pixels.pixel_values, "image_grid_thw": pixels.image_grid_thw}
        )
        with torch.no_grad():
            logits = model(input_ids=x, position_ids=positions(model, x, pixels), **images).logits[0].float()
        eager = torch.log_softmax(logits[len(ids) - 1 : -1], dim=-1).gather(1, x[0, len(ids) :, None])[:, 0]
        assert (eager - torch.tensor(got.logprobs)).abs().max().item() < TOL, f"row {i} differs from eager"
