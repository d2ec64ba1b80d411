"""`atropos inference` end to end: the FastAPI app over the shipped model, served by uvicorn on 127.0.0.1,
called with the `openai` package and raw httpx (real HTTP, real tokens and logprobs)."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest
import torch

from atropos_cli.config import ServerConfig
from atropos_cli.inference.local import LocalBackend
from atropos_cli.inference.server import create_app
from atropos_cli.resources import DEFAULT_MODEL, resolve_model_path
from atropos_cli.testing import free_port
from atropos_cli.testing.threaded import ThreadedServer

QUESTIONS = [[{"role": "user", "content": f"What is {a} + {b}?"}] for a, b in [(12, 7), (40, 2), (9, 9), (55, 31)]]


@pytest.fixture(scope="module")
def served():
    backend = LocalBackend(ServerConfig(server_type="local", model_name=DEFAULT_MODEL))
    with ThreadedServer(create_app(backend), lifespan="off") as server:
        yield server.url, backend


@pytest.fixture(scope="module")
def client(served):
    url, _ = served
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)


def test_health_and_models_say_which_model_and_version(served):
    url, backend = served
    health = httpx.get(f"{url}/health").json()
    assert health == {"status": "ok", "model": DEFAULT_MODEL, "version": backend.version}
    models = httpx.get(f"{url}/v1/models").json()
    assert models["data"][0]["id"] == DEFAULT_MODEL
    assert models["data"][0]["max_model_len"] == 256


def test_openai_chat_with_logprobs_and_token_ids(client, served):
    _, backend = served
    resp = client.chat.completions.create(
        model=DEFAULT_MODEL, messages=QUESTIONS[0], n=4, max_tokens=8, logprobs=True, top_logprobs=2, seed=7,
        extra_body={"return_token_ids": True},
    )  # fmt: skip
    assert len(resp.choices) == 4
    assert resp.model_extra["prompt_token_ids"] == backend.chat_prompt_ids(QUESTIONS[0])
    for choice in resp.choices:
        token_ids = choice.model_extra["token_ids"]
        content = choice.logprobs.content
        assert len(content) == len(token_ids) >= 1
        assert all(len(entry.top_logprobs) == 2 for entry in content)
        assert all(entry.logprob <= entry.top_logprobs[0].logprob + 1e-6 for entry in content)
        assert choice.message.content == backend.tokenizer.decode(
            [t for t in token_ids if t != backend.tokenizer.eos_token_id], skip_special_tokens=True
        )
    assert resp.usage.completion_tokens == sum(len(c.model_extra["token_ids"]) for c in resp.choices)


def test_http_logprobs_match_a_forward_pass(client, served):
    _, backend = served
    resp = client.chat.completions.create(
        model=DEFAULT_MODEL, messages=QUESTIONS[1], n=2, logprobs=True, extra_body={"return_token_ids": True}
    )
    prompt = resp.model_extra["prompt_token_ids"]
    assert len(resp.choices) == 2
    for choice in resp.choices:
        ids = prompt + choice.model_extra["token_ids"]
        with torch.no_grad():
            logits = backend._state.model(input_ids=torch.tensor([ids])).logits[0].float()
        expected = torch.log_softmax(logits, -1)[len(prompt) - 1 : -1].gather(
            1, torch.tensor(ids[len(prompt) :])[:, None]
        )
        got = [entry.logprob for entry in choice.logprobs.content]
        assert got == pytest.approx(expected[:, 0].tolist(), abs=1e-4)


def test_openai_completions_with_text_and_token_prompts(client, served):
    _, backend = served
    resp = client.completions.create(model=DEFAULT_MODEL, prompt="What is 3 + 4?", max_tokens=4, n=2, logprobs=1)
    assert len(resp.choices) == 2
    for choice in resp.choices:
        assert len(choice.logprobs.tokens) == len(choice.logprobs.token_logprobs) <= 4
    ids = backend.chat_prompt_ids(QUESTIONS[2])
    resp = client.completions.create(
        model=DEFAULT_MODEL, prompt=ids, max_tokens=8, temperature=0.0, extra_body={"return_token_ids": True}
    )
    assert resp.choices[0].model_extra["prompt_token_ids"] == ids
    assert resp.choices[0].finish_reason in ("stop", "length")


def test_a_streamed_chat_answer_is_the_whole_answer_as_openai_chunks(client):
    asked = {"model": DEFAULT_MODEL, "messages": QUESTIONS[0], "max_tokens": 6, "temperature": 0.0, "seed": 1}
    whole = client.chat.completions.create(**asked)
    chunks = list(client.chat.completions.create(**asked, stream=True, stream_options={"include_usage": True}))
    with_choices = [c for c in chunks if c.choices]
    assert with_choices[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in with_choices) == whole.choices[0].message.content
    assert with_choices[-1].choices[0].finish_reason == whole.choices[0].finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"frobnicate": 1}, "frobnicate"),
        ({"stream": "maybe"}, "stream"),
        ({"frequency_penalty": 0.5}, "frequency_penalty"),
        ({"n": 0}, "n"),
        ({"temperature": "hot"}, "temperature"),
    ],
)
def test_unsupported_or_bad_parameter_is_400_naming_it(served, extra, param):
    url, _ = served
    resp = httpx.post(f"{url}/v1/chat/completions", json={"messages": QUESTIONS[0], **extra})
    assert resp.status_code == 400
    error = resp.json()["error"]
    assert error["param"] == param
    assert repr(param) in error["message"]


def test_openai_client_sees_bad_request_for_unknown_parameter(client):
    with pytest.raises(openai.BadRequestError, match="unsupported parameter 'guided_json'"):
        client.chat.completions.create(
            model=DEFAULT_MODEL, messages=QUESTIONS[0], extra_body={"guided_json": {"type": "object"}}
        )


def test_prompt_longer_than_context_is_400(served):
    url, _ = served
    messages = [{"role": "user", "content": "7 " * 300}]
    resp = httpx.post(f"{url}/v1/chat/completions", json={"messages": messages})
    assert resp.status_code == 400
    assert "context of 256 tokens" in resp.json()["error"]["message"]


def test_bad_json_and_missing_messages_are_400(served):
    url, _ = served
    json_type = {"Content-Type": "application/json"}
    assert httpx.post(f"{url}/v1/chat/completions", content=b"{not json", headers=json_type).status_code == 400
    resp = httpx.post(f"{url}/v1/chat/completions", json={"n": 2})
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "messages"


def test_concurrent_http_requests_are_batched(served):
    url, backend = served

    async def burst():
        async with httpx.AsyncClient(base_url=url, timeout=60) as http:
            body = {"messages": QUESTIONS[3], "n": 4, "max_tokens": 8}
            return await asyncio.gather(*(http.post("/v1/chat/completions", json=body) for _ in range(16)))

    before = httpx.get(f"{url}/stats").json()
    responses = asyncio.run(burst())
    after = httpx.get(f"{url}/stats").json()
    assert all(r.status_code == 200 and len(r.json()["choices"]) == 4 for r in responses)
    assert after["rows"] - before["rows"] == 16 * 4
    assert after["batches"] - before["batches"] < 16


def _greedy_answers(client) -> list[str]:
    return [
        client.chat.completions.create(model=DEFAULT_MODEL, messages=q, temperature=0.0, max_tokens=8)
        .choices[0]
        .message.content
        for q in QUESTIONS
    ]


def test_reload_weights_swaps_the_model_and_bumps_the_version(client, served, tmp_path):
    from transformers import AutoModelForCausalLM

    url, backend = served
    shipped = Path(resolve_model_path(DEFAULT_MODEL))
    before, version = _greedy_answers(client), backend.version
    model = AutoModelForCausalLM.from_pretrained(shipped)
    torch.manual_seed(0)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.5)
    model.save_pretrained(tmp_path / "perturbed")  # weights only: the served tokenizer is kept
    resp = httpx.post(f"{url}/reload_weights", json={"path": str(tmp_path / "perturbed")})
    assert resp.status_code == 200 and resp.json()["version"] == version + 1
    assert httpx.get(f"{url}/health").json()["version"] == version + 1
    after = _greedy_answers(client)
    assert after != before
    restored = httpx.post(f"{url}/reload_weights", json={"path": str(shipped)})
    assert restored.json()["version"] == version + 2
    assert _greedy_answers(client) == before


def test_reload_weights_bad_input_is_400(served, tmp_path):
    url, backend = served
    version = backend.version
    missing = httpx.post(f"{url}/reload_weights", json={"path": str(tmp_path / "nope")})
    assert missing.status_code == 400 and "does not exist" in missing.json()["error"]["message"]
    assert httpx.post(f"{url}/reload_weights", json={}).json()["error"]["param"] == "path"
    shutil.copy2(Path(resolve_model_path(DEFAULT_MODEL)) / "tokenizer.json", tmp_path / "tokenizer.json")
    no_config = httpx.post(f"{url}/reload_weights", json={"path": str(tmp_path)})
    assert no_config.status_code == 400 and "config.json" in no_config.json()["error"]["message"]
    assert backend.version == version


def test_cli_serves_until_stopped_and_reports_bad_model(tmp_path):
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "atropos_cli.cli.app", "inference", "--port", str(port)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        deadline = time.time() + 90
        while True:
            assert proc.poll() is None, proc.stdout.read()
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.time() < deadline, "atropos inference did not come up"
            time.sleep(0.2)
        assert httpx.get(f"http://127.0.0.1:{port}/v1/models").json()["data"][0]["id"] == DEFAULT_MODEL
    finally:
        proc.terminate()
        proc.wait(timeout=20)

    from typer.testing import CliRunner

    from atropos_cli.cli.app import app

    result = CliRunner().invoke(app, ["inference", "--model", str(tmp_path / "missing"), "--port", "0"])
    assert result.exit_code == 2
    assert "does not exist" in result.output
