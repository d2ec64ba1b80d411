"""`python -m atropos_cli ...`: the same CLI as `atropos`, for launchers that start modules (torchrun -m)."""

from atropos_cli.cli.app import main

main()
