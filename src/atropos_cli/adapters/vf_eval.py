"""`python -m atropos_cli.adapters.vf_eval ARGS...`: verifiers' own `vf-eval ARGS...`, with the harness programs of
seats in the subprocess runtime run on this interpreter (offline: `vf_runtime`) instead of a `uv` environment.
Point it at `atropos inference` (docs/envs-verifiers.md)."""

from __future__ import annotations


def main() -> None:
    from atropos_cli.adapters.vf_runtime import run_programs_here

    run_programs_here()
    from verifiers.v1.cli.eval.main import main as vf_eval

    vf_eval()


if __name__ == "__main__":
    main()
