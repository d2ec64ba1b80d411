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
    "groups,width,kv_heads,ratio,dim,prompt,gen,bucket,dtype,tol",
    [
        (3, 4, 2, 7, 64, 130, 80, 64, torch.float32, 5e-3),  # Qwen2.5-0.5B's heads (TF32 dots on the GPU)
        (2, 3, 2, 2, 16, 64, 256, 128, torch.bfloat16, 2e-2),  # the shipped model's; bucket < generation block
        (2, 2, 1, 1, 32, 10, 20, 20, torch.bfloat16, 2e-2),  # no GQA
        (8, 8, 2, 7, 64, 600, 300, 256, torch.bfloat16, 2e-2),  # long prompts, many rows
    ],
)
def test_compiled_kernel_equals_attention_written_out(
    triton_cuda, groups, width, kv_heads, ratio, dim, prompt, gen, bucket, dtype, tol
):
    assert kernel_error(groups, width, kv_heads, ratio, dim, prompt, gen, bucket, dtype, triton_cuda) < tol


def test_kernel_in_the_engine_decodes_as_plain_attention_on_the_gpu(triton_cuda, monkeypatch):
    assert_same_decoding_either_way(monkeypatch, triton_cuda, questions=6, tol=1e-3)
