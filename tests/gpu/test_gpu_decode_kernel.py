"""The engine's Triton decode-attention kernel compiled for the GPU (not the interpreter the CPU suite uses):
against attention written out by hand, and inside the engine against the plain attention path."""

from __future__ import annotations

import pytest
import torch

from atropos_cli.inference import decode_attention as kernel
from test_decode_attention import assert_same_decoding_either_way, kernel_error


@pytest.fixture
def triton_cuda(cuda: str) -> str:
    if not kernel.available():
        pytest.fail("triton does not import here: CUDA builds of torch bring it")
    return cuda


@pytest.mark.parametrize(
    "groups,width,kv_heads,ratio,dim,prompt,gen,bucket,dtype,tol,window,sinks",
    [
        (3, 4, 2, 7, 64, 130, 80, 64, torch.float32, 5e-3, None, False),  # Qwen2.5-0.5B's heads (TF32 dots)
        (2, 3, 2, 2, 16, 64, 256, 128, torch.bfloat16, 2e-2, None, False),  # the shipped model's; bucket < block
        (2, 2, 1, 1, 32, 10, 20, 20, torch.bfloat16, 2e-2, None, False),  # no GQA
        (8, 8, 2, 7, 64, 600, 300, 256, torch.bfloat16, 2e-2, None, False),  # long prompts, many rows
        (8, 8, 1, 4, 256, 700, 300, 256, torch.bfloat16, 2e-2, 512, False),  # Gemma-3-1B's heads and window
        (8, 8, 8, 8, 64, 300, 200, 256, torch.bfloat16, 2e-2, 128, True),  # gpt-oss's heads, window and sinks
    ],
)
def test_compiled_kernel_equals_attention_written_out(
    triton_cuda, groups, width, kv_heads, ratio, dim, prompt, gen, bucket, dtype, tol, window, sinks
):
    error = kernel_error(groups, width, kv_heads, ratio, dim, prompt, gen, bucket, dtype, triton_cuda, window, sinks)
    assert error < tol


def test_kernel_in_the_engine_decodes_as_plain_attention_on_the_gpu(triton_cuda, monkeypatch):
    assert_same_decoding_either_way(monkeypatch, triton_cuda, questions=6, tol=1e-3)
