"""`atropos train --nproc-per-node N`: start N copies of the same command through torchrun's launcher.

Where it sits: `cli/train.py` calls `launch(...)` when N > 1 and this process is not itself a rank; each rank
then runs `python -m atropos_cli train <the same flags>` with torchrun's environment and joins the process
group (distributed.py). On one node the rendezvous is local (`--standalone`); for several nodes the user runs
torchrun with its own rendezvous flags instead. When a rank dies or fails, torchrun stops every other rank and
this raises `RankFailed` naming the first rank that failed and how, so a run never hangs on a dead peer.
"""

from __future__ import annotations

import logging
import os

from atropos_cli.errors import RankFailed

from ..config import AUTO_THREADS

__all__ = ["launch"]

MONITOR_INTERVAL_S = 0.5  # how often the launcher checks its ranks (a dead one stops the run this fast)


def launch(nproc: int, argv: list[str], verbose: bool = False, engines: int = 0) -> None:
    """Run `python -m atropos_cli *argv` on `nproc` local ranks; returns when all succeeded. The last `engines`
    ranks run rollout engines (`--inference-gpus`): a failure names the role too."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run

    if not verbose:  # torchrun's agent logs every start/stop at WARNING; our ranks say what matters
        for name in list(logging.root.manager.loggerDict):  # its loggers set their own level: each one, by name
            if name.startswith(("torch.distributed.run", "torch.distributed.elastic", "torch.distributed.launcher")):
                logging.getLogger(name).setLevel(logging.CRITICAL)
    if "OMP_NUM_THREADS" not in os.environ:  # the cores shared out (a CUDA rank then takes fewer: host_threads)
        os.environ["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // nproc))
        os.environ[AUTO_THREADS] = "1"
    args = get_args_parser().parse_args(
        [
            "--standalone",
            f"--nproc-per-node={nproc}",
            "--max-restarts=0",
            f"--monitor-interval={MONITOR_INTERVAL_S}",
            "-m",
            "atropos_cli",
            *argv,
        ]
    )
    try:
        run(args)
    except SignalException:  # Ctrl-C: the ranks finished their step and saved one checkpoint (distributed.py)
        raise KeyboardInterrupt from None
    except ChildFailedError as exc:
        rank, failure = exc.get_first_failure()
        if failure.signal_name() != "<N/A>" and failure.exitcode < 0:
            how = f"was killed by {failure.signal_name()}"
        else:
            how = f"exited with code {failure.exitcode}"
        role = " (it ran a rollout engine)" if int(rank) >= nproc - engines else ""
        error = RankFailed(
            f"rank {rank} of {nproc} (pid {failure.pid}) {how}{role}; the other ranks were stopped",
            hint="rank errors are printed above; a kill without one is often the out-of-memory killer "
            "(check dmesg), and --resume continues from the last checkpoint",
        )
        if failure.exitcode > 0:
            error.exit_code = failure.exitcode
        raise error from None
