"""The profile store: measured entries, one JSON file each, safe to share and to kill.

An entry is keyed by a JSON-able dict (model signature, mesh, devices, template, combination for
a segment profile; shape and layouts for a resharding cost). Its file name is a hash of the key,
and it is written to a temporary name in the same directory, flushed, fsynced, then renamed into
place: a reader sees a whole entry or none, a run killed with ``kill -9`` loses at most the entry
it was writing, and two runs sharing a store (a multirun sweep) can only write the same entry
twice, each time whole. Nothing is ever appended to or rewritten in place (an entry a later run
measures again, one the profiling shortcuts left untimed or stopped early, is replaced whole).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path


def key_id(key: dict) -> str:
    return hashlib.sha1(json.dumps(key, sort_keys=True).encode()).hexdigest()


class ProfileStore:
    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def _path(self, key: dict) -> Path:
        return self.root / f"{key_id(key)}.json"

    def get(self, key: dict) -> dict | None:
        try:
            entry = json.loads(self._path(key).read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None
        return entry if entry.get("key") == key else None

    def __contains__(self, key: dict) -> bool:
        return self.get(key) is not None

    def put(self, key: dict, value: dict) -> dict:
        entry = {"key": key, **value}
        path = self._path(key)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        with open(tmp, "w") as f:
            json.dump(entry, f, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        return entry

    def __len__(self) -> int:
        return sum(1 for _ in self.root.glob("*.json"))
