"""The environment contract and how an env is found and set up: `base` (BaseEnv, SimpleEnv), `registry`
(names, entry points, files), `loading` (CLI args -> a ready env + its servers), `multiturn` (exact tokens
across turns), `sandbox` (untrusted code), `scaffold` (`atropos init-env`)."""
