"""Drives `atropos serve-trainer` with the official tinker SDK (run by the SDK's own venv python).

    python drive.py SCENARIO STATE_FILE

prints one JSON object (the scenario's observations) on its last line. TINKER_BASE_URL / TINKER_API_KEY point
the SDK at the server, as a user would."""

from __future__ import annotations

import json
import sys

import tinker
from tinker import types

QUESTION = "<|user|>What is 2 + 3?<|end|><|assistant|>"


def sft_datum(tok, answer: str = "5") -> types.Datum:
    prompt = tok.encode(QUESTION, add_special_tokens=False)
    full = prompt + tok.encode(answer + "<|end|>", add_special_tokens=False)
    weights = [0.0] * (len(prompt) - 1) + [1.0] * (len(full) - len(prompt))
    return types.Datum(
        model_input=types.ModelInput.from_ints(full[:-1]),
        loss_fn_inputs={"target_tokens": full[1:], "weights": weights},
    )


def train(tc, datum, steps: int, lr: float = 1e-2) -> list[float]:
    out = []
    for _ in range(steps):
        fb = tc.forward_backward([datum], "cross_entropy").result()
        tc.optim_step(types.AdamParams(learning_rate=lr)).result()
        out.append(fb.metrics["loss:sum"])
    return out


def error_of(call) -> str:
    try:
        call()
    except Exception as exc:  # the SDK's exception, as a user sees it
        return f"{type(exc).__name__}: {exc}"
    return ""


def basic(sc, state: dict) -> dict:
    caps = sc.get_server_capabilities()
    model = caps.supported_models[0].model_name
    tc = sc.create_lora_training_client(base_model=model, rank=4).result()
    tok = tc.get_tokenizer()
    datum = sft_datum(tok)
    fwd = tc.forward([datum], "cross_entropy").result()
    losses = train(tc, datum, 4)
    ppo_inputs = dict(datum.loss_fn_inputs)
    n = len(datum.model_input.to_ints())
    ppo = types.Datum(
        model_input=datum.model_input,
        loss_fn_inputs={
            "target_tokens": ppo_inputs["target_tokens"],
            "logprobs": fwd.loss_fn_outputs[0]["logprobs"].tolist(),
            "advantages": [1.0] * n,
        },
    )
    metrics = {
        loss: tc.forward_backward([ppo], loss).result().metrics["loss:sum"]
        for loss in ("importance_sampling", "ppo", "cispo", "dro", "gspo")
    }
    tc.optim_step(types.AdamParams(learning_rate=0.0)).result()

    def mean_nll(data, logprobs):  # a custom loss: the SDK runs it client-side, over forward's logprobs
        loss = sum(-lp.mean() for lp in logprobs)
        return loss, {"mean_nll": float(loss)}

    custom = tc.forward_backward_custom([datum], mean_nll).result()
    tc.optim_step(types.AdamParams(learning_rate=0.0)).result()
    sampler = tc.save_weights_and_get_sampling_client().result()
    prompt = types.ModelInput.from_ints(tok.encode(QUESTION, add_special_tokens=False))
    res = sampler.sample(prompt, num_samples=4, sampling_params=types.SamplingParams(max_tokens=6, seed=3)).result()
    named = tc.save_weights_for_sampler("named").result().path
    with_prompt = (
        sc.create_sampling_client(model_path=named)
        .result()
        .sample(prompt, 1, types.SamplingParams(max_tokens=4, temperature=0.0), include_prompt_logprobs=True)
        .result()
    )
    return {
        "models": [m.model_name for m in caps.supported_models],
        "forward_logprobs": fwd.loss_fn_outputs[0]["logprobs"].tolist(),
        "losses": losses,
        "rl_losses": metrics,
        "custom": custom.metrics,
        "samples": [[s.tokens, s.logprobs, s.stop_reason] for s in res.sequences],
        "prompt_logprobs": with_prompt.prompt_logprobs,
        "prompt_len": len(prompt.to_ints()),
        "unknown_loss": error_of(lambda: tc.forward_backward([datum], "hinge").result()),
        "stable_loss": error_of(lambda: tc.forward_backward([datum], "stable_reinforce").result()),
        "short_inputs": error_of(
            lambda: tc.forward_backward(
                [types.Datum(model_input=datum.model_input, loss_fn_inputs={"target_tokens": [1], "weights": [1.0]})],
                "cross_entropy",
            ).result()
        ),
        "info": tc.get_info().model_dump(mode="json"),
    }


def tenants(sc, state: dict) -> dict:
    """Two LoRA clients and one full fine-tune on one base: each trains on its own answer; a fourth is refused."""
    model = sc.get_server_capabilities().supported_models[0].model_name
    a = sc.create_lora_training_client(base_model=model, rank=4, seed=1).result()
    b = sc.create_lora_training_client(base_model=model, rank=8, seed=2).result()
    full = sc.create_lora_training_client(base_model=model, rank=0).result()
    tok = a.get_tokenizer()
    da, db, dfull = sft_datum(tok, "5"), sft_datum(tok, "7"), sft_datum(tok, "9")
    before = {k: c.forward([d], "cross_entropy").result().metrics["loss:sum"] for k, c, d in
              (("a", a, da), ("b", b, db), ("full", full, dfull))}  # fmt: skip
    for _ in range(6):  # interleaved: requests of different clients alternate on the server
        futures = [c.forward_backward([d], "cross_entropy") for c, d in ((a, da), (b, db), (full, dfull))]
        [f.result() for f in futures]
        [c.optim_step(types.AdamParams(learning_rate=lr)).result() for c, lr in ((a, 2e-2), (b, 2e-2), (full, 2e-3))]
    after = {k: c.forward([d], "cross_entropy").result().metrics["loss:sum"] for k, c, d in
             (("a", a, da), ("b", b, db), ("full", full, dfull))}  # fmt: skip
    a_on_b = a.forward([db], "cross_entropy").result().metrics["loss:sum"]
    b_on_b_base = before["b"]
    return {
        "before": before,
        "after": after,
        "a_on_b": a_on_b,
        "b_before": b_on_b_base,
        "info": [c.get_info().model_dump(mode="json") for c in (a, b, full)],
        "fourth": error_of(lambda: sc.create_lora_training_client(base_model=model, rank=4).result()),
        "after_close": after_close(sc, model),
    }


def after_close(sc, model: str) -> float:
    """Closing a ServiceClient frees its session's slots: a new client then fits, and trains."""
    sc.close("success")
    other = tinker.ServiceClient()
    tc = other.create_lora_training_client(base_model=model, rank=4).result()
    return tc.forward([sft_datum(tc.get_tokenizer())], "cross_entropy").result().metrics["loss:sum"]


def resume_save(sc, state: dict) -> dict:
    model = sc.get_server_capabilities().supported_models[0].model_name
    tc = sc.create_lora_training_client(base_model=model, rank=4).result()
    tok = tc.get_tokenizer()
    datum = sft_datum(tok)
    train(tc, datum, 3)
    path = tc.save_state("ckpt").result().path
    sampler_path = tc.save_weights_for_sampler("ckpt").result().path
    loss = tc.forward([datum], "cross_entropy").result().metrics["loss:sum"]
    prompt = types.ModelInput.from_ints(tok.encode(QUESTION, add_special_tokens=False))
    greedy = (
        sc.create_sampling_client(model_path=sampler_path)
        .result()
        .sample(prompt, 1, types.SamplingParams(max_tokens=4, temperature=0.0))
        .result()
    )
    return {"path": path, "sampler_path": sampler_path, "loss": loss, "greedy": greedy.sequences[0].tokens}


def resume_load(sc, state: dict) -> dict:
    tc = sc.create_training_client_from_state_with_optimizer(state["path"]).result()
    tok = tc.get_tokenizer()
    datum = sft_datum(tok)
    loss = tc.forward([datum], "cross_entropy").result().metrics["loss:sum"]
    prompt = types.ModelInput.from_ints(tok.encode(QUESTION, add_special_tokens=False))
    greedy = (
        sc.create_sampling_client(model_path=state["sampler_path"])
        .result()
        .sample(prompt, 1, types.SamplingParams(max_tokens=4, temperature=0.0))
        .result()
    )
    after = train(tc, datum, 1)
    missing = error_of(lambda: sc.create_training_client_from_state(state["path"] + "-gone").result())
    return {"loss": loss, "greedy": greedy.sequences[0].tokens, "trains": after, "missing": missing}


def replicas(sc, state: dict) -> dict:
    """A LoRA client and a full fine-tune, each two steps on three datums of unequal lengths, on this server (a
    --nproc-per-node one: the datums split between its ranks) and on state["single"] (one rank): the losses,
    gradient norms and the logprobs after, of both."""
    return {"ranks": train_replicas(sc), "single": train_replicas(tinker.ServiceClient(base_url=state["single"]))}


def train_replicas(sc) -> dict:
    model = sc.get_server_capabilities().supported_models[0].model_name
    out: dict = {}
    for rank in (4, 0):
        tc = sc.create_lora_training_client(base_model=model, rank=rank, seed=5).result()
        data = [sft_datum(tc.get_tokenizer(), answer) for answer in ("5", "17", "123")]
        losses, norms = [], []
        for _ in range(2):
            fb = tc.forward_backward(data, "cross_entropy").result()
            step = tc.optim_step(types.AdamParams(learning_rate=1e-2 if rank else 1e-3)).result()
            losses.append(fb.metrics["loss:sum"])
            norms.append(step.metrics["grad_norm:mean"])
        after = tc.forward(data, "cross_entropy").result()
        out[str(rank)] = {"losses": losses, "norms": norms,
                          "logprobs": [o["logprobs"].tolist() for o in after.loss_fn_outputs]}  # fmt: skip
    return out


def auth(sc, state: dict) -> dict:
    return {"models": [m.model_name for m in sc.get_server_capabilities().supported_models]}


SCENARIOS = {
    "basic": basic,
    "tenants": tenants,
    "resume_save": resume_save,
    "resume_load": resume_load,
    "auth": auth,
    "replicas": replicas,
}

if __name__ == "__main__":
    scenario, state_file = sys.argv[1], sys.argv[2]
    with open(state_file) as f:
        state = json.load(f)
    result = SCENARIOS[scenario](tinker.ServiceClient(), state)
    print(json.dumps(result))
