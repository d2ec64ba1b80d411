"""Envs of other frameworks (verifiers, Gymnasium, OpenEnv, ...) as our env classes.

Each module here is one framework's adapter, reached from `env.registry` by the prefix table `ADAPTERS`
(`vf:NAME` -> `atropos_cli.adapters.vf`), by a module-name string: adapters sit above `env` and `runs` in the
layers (docs/ARCHITECTURE.md). An adapter module defines:

- `CONFIG`: its env config class (an `EnvConfig` subclass); its own fields are the `--env.*` flags that
  `atropos process|serve|evaluate|train --help` lists under the prefix;
- `load_env_class(target: str) -> type[BaseEnv]`: the env class for `PREFIX:TARGET`, whose rollouts go
  through our inference router and come out as `ScoredGroup`s (tokens and masks from our backend).

The framework itself (verifiers, gymnasium, ...) is imported inside the functions that need it, so listing
the adapters' options in `--help` stays instant and a missing package is one error line with its install hint.
"""
