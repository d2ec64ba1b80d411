"""Durable state of the trajectory API: one SQLite database in WAL mode under `--state-dir`.

Sits under `service.py`. It holds what must survive a `kill -9`: every acknowledged group (as the exact JSON
bytes a batch will carry, so serving is a byte concatenation), trainer registration, env registrations, the
step counter and batches already formed but not yet served. Python memory keeps only small handles
(`QueuedGroup`), so RSS does not grow with queued tokens: payloads live in the database file, read back only
when a batch is served.

Every write commits before the HTTP answer goes out; concurrent group POSTs share one commit (group
commit). In WAL mode with `synchronous=NORMAL` a committed transaction survives the process being killed
(it is in the WAL file); `synchronous=FULL` (`--fsync`) also survives power loss. WAL checkpoints run in a
background thread so no request pays for one. A batch counts as served once it is read for a response.

Without a state dir the same schema lives in a temporary file that is deleted at exit (nothing survives a
restart), which keeps memory bounded the same way.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import sqlite3
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Store", "StoredState", "GROUP_QUEUED", "GROUP_BUFFERED"]

GROUP_QUEUED = 0
GROUP_BUFFERED = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS groups (
    gid INTEGER PRIMARY KEY,
    env_id INTEGER,
    size INTEGER NOT NULL,
    state INTEGER NOT NULL DEFAULT 0,
    batch_id INTEGER,
    payload BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS groups_batch ON groups(batch_id);
CREATE TABLE IF NOT EXISTS batches (batch_id INTEGER PRIMARY KEY, step INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS envs (env_id INTEGER PRIMARY KEY, info TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS kv (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


@dataclass
class StoredState:
    """Everything `load()` reads back at start."""

    kv: dict[str, Any] = field(default_factory=dict)
    envs: dict[int, dict[str, Any]] = field(default_factory=dict)
    groups: list[tuple[int, int | None, int, int]] = field(default_factory=list)  # gid, env_id, size, state
    # batch_id, [(gid, size)] of formed-but-unserved batches, oldest first
    batches: list[tuple[int, list[tuple[int, int]]]] = field(default_factory=list)


class Store:
    """SQLite-backed state; `path=None` means a throwaway temporary database."""

    def __init__(self, state_dir: str | Path | None, fsync: bool = False) -> None:
        self.durable = state_dir is not None
        self._tmpdir = None if self.durable else tempfile.mkdtemp(prefix="atropos-api-")
        root = Path(state_dir) if state_dir is not None else Path(self._tmpdir or ".")
        root.mkdir(parents=True, exist_ok=True)
        self.path = root / "api.sqlite3"
        # isolation_level=None: we open transactions ourselves, so one request is one commit.
        self.db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        sync = "FULL" if fsync else ("NORMAL" if self.durable else "OFF")
        self.db.execute(f"PRAGMA synchronous={sync}")
        self.db.execute("PRAGMA cache_size=-8000")  # 8 MB page cache: RSS stays flat however long the queue
        # Checkpoints (copying the WAL into the database file) run in a background thread, not inside a
        # request's commit: an inline checkpoint of a few MB is what made GET /batch's p99 spike.
        self.db.execute("PRAGMA wal_autocheckpoint=0")
        self.db.executescript(_SCHEMA)
        self._rows: list[tuple[int, int | None, int, int, bytes]] = []
        self._moved: list[int] = []
        self._waiters: list[asyncio.Future[None]] = []
        self._flush_handle: asyncio.TimerHandle | None = None
        self._stop = threading.Event()
        self._checkpointer = threading.Thread(target=self._checkpoint_loop, name="wal-checkpoint", daemon=True)
        self._checkpointer.start()

    def _checkpoint_loop(self, every_s: float = 0.5) -> None:
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        try:
            while not self._stop.wait(every_s):
                conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
        finally:
            conn.close()

    def close(self) -> None:
        self.flush()
        self._stop.set()
        self._checkpointer.join(5)
        self.db.close()
        if self._tmpdir:
            shutil.rmtree(self._tmpdir, ignore_errors=True)

    # ---- reads --------------------------------------------------------------------------------------
    def load(self) -> StoredState:
        state = StoredState()
        state.kv = {k: json.loads(v) for k, v in self.db.execute("SELECT key, value FROM kv")}
        state.envs = {int(i): json.loads(v) for i, v in self.db.execute("SELECT env_id, info FROM envs")}
        state.groups = list(
            self.db.execute("SELECT gid, env_id, size, state FROM groups WHERE batch_id IS NULL ORDER BY gid")
        )
        for (batch_id,) in self.db.execute("SELECT batch_id FROM batches ORDER BY batch_id").fetchall():
            rows = self.db.execute("SELECT gid, size FROM groups WHERE batch_id=? ORDER BY gid", (batch_id,))
            state.batches.append((batch_id, list(rows)))
        return state

    def max_gid(self) -> int:
        return self.db.execute("SELECT COALESCE(MAX(gid), 0) FROM groups").fetchone()[0]

    def max_batch_id(self) -> int:
        return self.db.execute("SELECT COALESCE(MAX(batch_id), 0) FROM batches").fetchone()[0]

    def payload(self, gid: int) -> bytes | None:
        row = self.db.execute("SELECT payload FROM groups WHERE gid=?", (gid,)).fetchone()
        return None if row is None else bytes(row[0])

    # ---- group commit -------------------------------------------------------------------------------
    async def add_groups_durably(
        self, rows: list[tuple[int, int | None, int, int, bytes]], moved: list[int], delay_s: float = 0.002
    ) -> None:
        """Insert rows in the next commit and return once it is done: concurrent POSTs share one commit
        (each commit costs ~0.25 ms, a large share of ingest), at the price of <= `delay_s` of latency."""
        loop = asyncio.get_running_loop()
        waiter = loop.create_future()
        self._rows.extend(rows)
        self._moved.extend(moved)
        self._waiters.append(waiter)
        if len(self._rows) >= 64:
            self.flush()
        elif self._flush_handle is None:
            self._flush_handle = loop.call_later(delay_s, self.flush)
        await waiter

    def flush(self) -> None:
        """Commit the rows waiting for a group commit (called before anything that reads or moves groups)."""
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        if not self._rows:
            return
        rows, moved, waiters = self._rows, self._moved, self._waiters
        self._rows, self._moved, self._waiters = [], [], []
        try:
            self.add_groups(rows, moved)
        except sqlite3.Error as exc:
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_exception(exc)
            return
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    # ---- writes (each one transaction) ----------------------------------------------------------------
    def add_groups(self, rows: list[tuple[int, int | None, int, int, bytes]], moved: list[int]) -> None:
        """Insert (gid, env_id, size, state, payload) rows and mark `moved` buffered groups as queued."""
        with self.db:
            self.db.execute("BEGIN")
            self.db.executemany("INSERT INTO groups(gid, env_id, size, state, payload) VALUES (?,?,?,?,?)", rows)
            if moved:
                self.db.executemany("UPDATE groups SET state=0 WHERE gid=?", [(g,) for g in moved])

    def form_batch(self, batch_id: int, gids: list[int], step: int) -> None:
        self.flush()
        with self.db:
            self.db.execute("BEGIN")
            self.db.execute("INSERT INTO batches(batch_id, step) VALUES (?,?)", (batch_id, step))
            self.db.executemany("UPDATE groups SET batch_id=? WHERE gid=?", [(batch_id, g) for g in gids])
            self._set_kv("step", step)

    def drop_groups(self, gids: list[int]) -> None:
        """Delete queued groups that will never be served (the staleness bound's drop mode)."""
        self.flush()
        with self.db:
            self.db.execute("BEGIN")
            self.db.executemany("DELETE FROM groups WHERE gid=?", [(g,) for g in gids])

    def pop_batch(self, batch_id: int) -> list[bytes]:
        """Read a formed batch's payloads (arrival order) and delete it: it is served."""
        with self.db:
            self.db.execute("BEGIN")
            rows = self.db.execute("SELECT payload FROM groups WHERE batch_id=? ORDER BY gid", (batch_id,)).fetchall()
            self.db.execute("DELETE FROM groups WHERE batch_id=?", (batch_id,))
            self.db.execute("DELETE FROM batches WHERE batch_id=?", (batch_id,))
        return [bytes(r[0]) for r in rows]

    def set_kv(self, key: str, value: Any) -> None:
        with self.db:
            self.db.execute("BEGIN")
            self._set_kv(key, value)

    def _set_kv(self, key: str, value: Any) -> None:
        self.db.execute("INSERT OR REPLACE INTO kv(key, value) VALUES (?,?)", (key, json.dumps(value)))

    def put_env(self, env_id: int, info: dict[str, Any]) -> None:
        with self.db:
            self.db.execute("BEGIN")
            self.db.execute("INSERT OR REPLACE INTO envs(env_id, info) VALUES (?,?)", (env_id, json.dumps(info)))

    def reset(self) -> None:
        self.flush()
        with self.db:
            self.db.execute("BEGIN")
            for table in ("groups", "batches", "envs", "kv"):
                self.db.execute(f"DELETE FROM {table}")
