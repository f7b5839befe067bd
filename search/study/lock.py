"""One lock per study, held by one worker at a time while it checks the budget and creates its next
trial, so that workers sharing a study never run more than its budget, however many start at once.

Why a lock, not a counter: what counts in the budget is decided late (a duplicate or a skip costs
nothing, an interrupted trial is re-run) and Optuna's trial states are the truth about it; a
separate counter would have to mirror every one of those transitions, crashes included. Under the
lock a worker counts the trials that count (finished or running), creates its trial and lets the
sampler write the config's params, then releases it: the next worker sees that trial as running
(it counts) with its params (the sampler does not propose it again).

Where the lock lives:
- a server database (PostgreSQL, MySQL): a row of `flagsearch_study_locks` in the study's own
  database, locked with SELECT ... FOR UPDATE on a connection of its own. The server drops the lock
  when that connection ends, so a worker that dies holding it does not block the others.
- SQLite: an flock on a file beside the database. SQLite's own write lock cannot serve: Optuna
  writes the new trial on another connection while the lock is held.
"""

from __future__ import annotations

import fcntl
import random
import threading
import time
from pathlib import Path
from typing import IO

import sqlalchemy as sa
from sqlalchemy.engine import Connection, RootTransaction

LOCK_TABLE = "flagsearch_study_locks"
_METADATA = sa.MetaData()
_LOCKS = sa.Table(LOCK_TABLE, _METADATA, sa.Column("study_name", sa.String(512), primary_key=True))


class StudyLock:
    """Cross-process mutex for one study of one storage URL. Re-entrant release (idempotent)."""

    def __init__(self, storage_url: str, study_name: str):
        self.study_name = study_name
        self._local = threading.Lock()  # in-process callers (threads, an in-memory database)
        self._file: IO[bytes] | None = None
        self._conn: Connection | None = None
        self._tx: RootTransaction | None = None
        url = sa.engine.make_url(storage_url)
        self._engine: sa.Engine | None = None
        self._path: Path | None = None
        if url.get_backend_name() == "sqlite":
            if url.database and url.database != ":memory:":
                self._path = Path(url.database + ".lock")
        else:
            self._engine = sa.create_engine(storage_url, pool_size=1, max_overflow=0, pool_pre_ping=True)
            _ensure_row(self._engine, study_name)
        self._held = False

    def acquire(self) -> None:
        self._local.acquire()
        try:
            if self._path is not None:
                self._file = self._path.open("ab")
                fcntl.flock(self._file.fileno(), fcntl.LOCK_EX)
            elif self._engine is not None:
                self._conn = self._engine.connect()
                self._tx = self._conn.begin()
                self._conn.execute(sa.select(_LOCKS.c.study_name).where(_LOCKS.c.study_name == self.study_name)
                                   .with_for_update())
        except BaseException:
            self._drop()
            self._local.release()
            raise
        self._held = True

    def release(self) -> None:
        """Release if held (the trial loop releases early, once the trial exists; again at the end)."""
        if not self._held:
            return
        self._held = False
        try:
            if self._tx is not None:
                self._tx.commit()
        finally:
            self._drop()
            self._local.release()

    def _drop(self) -> None:
        if self._file is not None:
            self._file.close()  # closing drops the flock
            self._file = None
        if self._conn is not None:
            self._conn.close()
            self._conn, self._tx = None, None

    def __enter__(self) -> StudyLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def close(self) -> None:
        self.release()
        if self._engine is not None:
            self._engine.dispose()


def _ensure_row(engine: sa.Engine, study_name: str) -> None:
    """The lock table and this study's row. Workers that start together race to create both: the
    losers see an error, and the next attempt finds what the winner made."""
    for attempt in range(6):
        try:
            _METADATA.create_all(engine, checkfirst=True)
            with engine.begin() as conn:
                present = conn.execute(sa.select(_LOCKS.c.study_name)
                                       .where(_LOCKS.c.study_name == study_name)).first()
                if present is None:
                    conn.execute(_LOCKS.insert().values(study_name=study_name))
            return
        except sa.exc.DBAPIError:
            if attempt == 5:
                raise
            time.sleep(0.2 + random.random() * (attempt + 1))

