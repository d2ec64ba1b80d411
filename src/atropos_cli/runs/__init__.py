"""Running an env: `rollout` (concurrent group collection), `process` (offline into a run dir), `evaluate`
(+ `metrics`, `report`), `serve` (online against a trajectory API), `rundir` (the output-directory contract)."""
