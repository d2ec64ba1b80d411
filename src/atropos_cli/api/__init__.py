"""The trajectory API (`atropos api`), wire-compatible with Atropos' `run-api`, and its client.

Modules, from the network inwards: `app.py` (FastAPI routes) -> `wire.py` (body limits, gzip, strict JSON,
group validation) -> `service.py` (registration, ingest, batches, status) -> `queue.py` (pure batching
rules) and `store.py` (SQLite WAL durability); `metrics.py` renders `/metrics`; `client.py` is what
`atropos serve` and trainers use to talk to any Atropos-compatible API. Nothing here is imported by
`atropos --help`.
"""
