"""Measured rounds kept as each one finishes, for the commands that have no study to store them in
(`search ab`, `search regress`, `search baseline save`): a run killed at any moment (SIGKILL, the OOM
killer, a lost machine) or interrupted resumes from its stored rounds when the same command runs again.

One JSON file per run (`OUT/rounds.json`), rewritten after every finished round with the same atomic,
scrubbed write as every trial's result.json (search/store/results.py write_json_atomic): a kill mid-write
leaves the previous rounds whole. The file names what the run measures (`run_key`: both sides' engines,
flags, env and model, the workloads, the measurement, the plan); the same command finds its own rounds,
another comparison is refused by name rather than mixed in. A run that ended (its plan done, settled, or
a side that did not start) is marked complete, and the next run of the command measures afresh.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from search.store.results import ResultsError, format_version, read_json, scrub, write_json_atomic

FORMAT_NAME = "flagsearch-rounds"
FORMAT_VERSION = 1
FILE_NAME = "rounds.json"


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict) or hasattr(value, "items"):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def run_key(**parts: Any) -> dict[str, Any]:
    """What a run measures, as it reads back from its file: scrubbed of secrets (the file is) and through
    JSON (tuples become lists), so that the same command gives an equal key in the next process."""
    return json.loads(json.dumps(scrub(_plain(parts)), default=str, sort_keys=True))  # type: ignore[no-any-return]


@dataclass(frozen=True)
class RoundFile:
    """One run's file of finished rounds. `what` names the run in messages ("A/B", "baseline")."""

    path: Path
    key: dict[str, Any]
    what: str

    def resume(self) -> dict[str, Any] | None:
        """The stored run to go on from: None when there is no file or its run ended. A file of another
        run's unfinished rounds is an error naming the file and what differs (never overwritten)."""
        if not self.path.exists():
            return None
        data = read_json(self.path)
        if not isinstance(data, dict):
            raise ResultsError(f"{self.path}: not a rounds file (a JSON {type(data).__name__})")
        format_version(data.get("format"), FORMAT_NAME, FORMAT_VERSION, str(self.path))
        if data.get("complete"):
            return None
        key = data.get("key")
        stored: dict[str, Any] = key if isinstance(key, dict) else {}
        if stored != self.key:
            differ = sorted(k for k in set(stored) | set(self.key) if stored.get(k) != self.key.get(k))
            raise ResultsError(f"{self.path}: holds {data.get('rounds', 0)} unfinished round(s) of another "
                               f"{self.what} ({', '.join(differ)} differ): run that command again to finish it, "
                               "give another --out, or delete the file to start over")
        return data

    def save(self, rounds: int, payload: dict[str, Any], complete: bool = False) -> None:
        """Store the run so far (`rounds` finished); `complete` once it ended."""
        write_json_atomic(self.path, {"format": f"{FORMAT_NAME}/{FORMAT_VERSION}", "what": self.what,
                                      "complete": complete, "rounds": rounds, "key": self.key, **payload})
