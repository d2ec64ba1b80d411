"""Data-parallel replicas under `atropos serve-trainer --nproc-per-node N`: every rank holds the base model and
every training client's slot; rank 0 serves HTTP and samples, and each training call it runs is run by all.

Where it sits: `cli/serve_trainer.py` starts N ranks through torchrun's launcher (trainer/scale/launch.py); each
joins the process group (trainer/scale/distributed.py: NCCL on GPUs, one per rank; gloo on CPU). Rank 0 wraps
its `Host` in `Replicated`: a call that changes a slot (add, remove, load, forward_backward, optim_step) is
broadcast, in the order the service's one training worker makes them, to the other ranks, which sit in
`follow` applying each to their own `Host`. So every replica stays identical:

- `forward_backward` splits the datums between ranks (whole datums, balanced by tokens: `assign_groups`); each
  rank accumulates the gradients of its share, and rank 0 gathers the outputs back into request order. The
  Tinker losses are sums over datums, so the sum of the ranks' gradients is the one-rank gradient.
- `optim_step` sums the gradients over ranks (all-reduce), then every rank takes the same AdamW step.
- everything else (checkpoints, merged weights for the sampler, reads) uses rank 0's replica, which equals
  every other one.
"""

from __future__ import annotations

from typing import Any

from atropos_cli.tinker.slots import Host

__all__ = ["Replicated", "follow"]

# The Host calls that change a replica: rank 0 broadcasts them, each rank applies them (`_apply`).
MIRRORED = ("add", "remove", "load_trainable", "load_optimizer", "forward_backward", "optim_step")
STOP = "stop"


class Replicated:
    """Rank 0's view: the Host API, with every state-changing call run on all ranks."""

    def __init__(self, host: Host, dist: Any) -> None:
        self.host, self.dist = host, dist

    def __getattr__(self, name: str) -> Any:
        if name in MIRRORED:
            return lambda *args, **kwargs: self._everywhere(name, args, kwargs)
        return getattr(self.host, name)  # reads: rank 0's replica is every replica

    def _everywhere(self, op: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        self.dist.broadcast((op, args, kwargs))
        return _apply(self.host, self.dist, op, args, kwargs)

    def stop(self) -> None:
        """The other ranks leave `follow` (the server is shutting down)."""
        self.dist.broadcast((STOP, (), {}))


def follow(host: Host, dist: Any) -> None:
    """A rank other than 0: apply rank 0's calls to this replica until it stops. A refused request (bad input)
    is refused on every rank alike and rank 0 answers it; any other failure ends this rank, and the launcher
    then stops the service, so replicas never drift apart."""
    from atropos_cli.errors import ApiRequestError

    while True:
        op, args, kwargs = dist.broadcast(None)
        if op == STOP:
            return
        try:
            _apply(host, dist, op, args, kwargs)
        except ApiRequestError:
            continue


def _apply(host: Host, dist: Any, op: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if op == "forward_backward":
        return _forward_backward(host, dist, *args, **kwargs)
    if op == "optim_step":
        _sum_gradients(host, dist, args[0])
    return getattr(host, op)(*args, **kwargs)


def _forward_backward(
    host: Host, dist: Any, name: str, data: list[Any], loss: str, config: dict[str, float], backward: bool
) -> tuple[list[Any], dict[str, float]]:
    from atropos_cli.trainer.scale.distributed import assign_groups

    share = assign_groups([len(d.tokens) for d in data], dist.world)[dist.rank]
    outputs: list[Any] = []
    total, error = 0.0, None
    if share:
        try:
            outputs, metrics = host.forward_backward(name, [data[i] for i in share], loss, config, backward)
            total = metrics["loss:sum"]
        except Exception as exc:  # every rank must reach the gather; the error is raised after it
            error = exc
    parts = dist.gather((share, outputs, total, None if error is None else f"{type(error).__name__}: {error}"))
    if error is not None:
        raise error
    failed = [message for *_, message in parts if message]
    if failed:
        raise RuntimeError(f"forward_backward failed on another rank: {failed[0]}")
    ordered: list[Any] = [None] * len(data)
    for indices, outs, _, _ in parts:
        for i, out in zip(indices, outs, strict=True):
            ordered[i] = out
    return ordered, {"loss:sum": sum(part[2] for part in parts)}


def _sum_gradients(host: Host, dist: Any, name: str) -> None:
    """Each trained tensor's gradient summed over ranks (a rank that had no datums adds zeros); a tensor no
    rank has a gradient for keeps none, as on one rank."""
    import torch
    import torch.distributed as tdist

    params = host.get(name).params
    device = params[0].device if params else "cpu"
    has = torch.tensor([p.grad is not None for p in params], dtype=torch.int32, device=device)
    tdist.all_reduce(has, op=tdist.ReduceOp.MAX, group=dist.group)
    works = []
    for p, anyone in zip(params, has.tolist(), strict=True):
        if not anyone:
            continue
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        works.append(tdist.all_reduce(p.grad, group=dist.group, async_op=True))
    for work in works:
        work.wait()
