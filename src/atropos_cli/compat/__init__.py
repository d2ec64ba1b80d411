"""Compatibility layers for code written against other libraries' APIs.

`compat.atroposlib` mirrors atroposlib 0.4.0's module paths (`atroposlib.envs.base`,
`atroposlib.envs.server_handling.*`, `atroposlib.type_definitions`, `atroposlib.utils.*`, `atroposlib.envs.eval`,
plus HEAD's `atroposlib.envs.teacher_distillation_env`) on top of our own BaseEnv, router and ScoredGroup.
`atropos process|serve|evaluate env.py` makes the name `atroposlib` resolve to it (env/aliases.py); a script
run as `python env.py` reaches it after `sed -i 's/\\batroposlib\\b/atropos_cli.compat.atroposlib/g' env.py`.
"""
