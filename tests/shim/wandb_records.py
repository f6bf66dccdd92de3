"""Read back what an offline W&B run wrote: its ``run-<id>.wandb`` file
(W&B's record log: a 7-byte ``:W&B`` header, then LevelDB-log framed
``wandb_internal.Record`` protobufs in 32 KiB blocks), decoded with wandb's
own protobuf classes, and its table files under ``files/media``."""

from __future__ import annotations

import json
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from google.protobuf.message import DecodeError
from wandb.proto import wandb_internal_pb2 as pb

BLOCK = 32768
HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def frames(path: Path) -> Iterator[bytes]:
    """Each record's bytes, reassembled from its chunks; a chunk the writer
    has not finished yet (its bytes past the file's end) ends the list."""
    data = path.read_bytes()
    ident, _magic, _version = struct.unpack("<4sHB", data[:HEADER])
    assert ident == b":W&B", f"{path} is not a W&B record log"
    pos, parts = HEADER, b""
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER:  # the rest of a block is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + HEADER])
        if pos + HEADER + length > len(data):
            return
        chunk = data[pos + HEADER : pos + HEADER + length]
        pos += HEADER + length
        if kind == FULL:
            yield chunk
        elif kind == FIRST:
            parts = chunk
        elif kind == MIDDLE:
            parts += chunk
        elif kind == LAST:
            yield parts + chunk
            parts = b""


def _items(items: Any) -> dict[str, Any]:
    out = {}
    for item in items:
        key = "/".join(item.nested_key) if item.nested_key else item.key
        out[key] = json.loads(item.value_json)
    return out


@dataclass
class OfflineRun:
    """A finished offline run's history rows, summary and metric definitions."""

    history: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    metrics: list[dict[str, str]] = field(default_factory=list)
    files: Path | None = None

    def table(self, key: str) -> dict[str, Any]:
        """The last logged ``wandb.Table`` under *key*, as its JSON file."""
        assert self.files is not None
        found = sorted((self.files / "media" / "table").glob(f"{key}_*.table.json"))
        assert found, f"no table {key} under {self.files}"
        return json.loads(found[-1].read_text())


def read_run(wandb_dir: Path, timeout_s: float = 60.0) -> OfflineRun:
    """The one offline run under *wandb_dir* (``WANDB_DIR``), once its log
    ends with the run's ``exit`` record: wandb's service may still be
    writing it when ``run.finish()`` returns."""
    deadline = time.monotonic() + timeout_s
    while True:
        (log,) = wandb_dir.glob("wandb/offline-run-*/run-*.wandb")
        try:
            run, ended = _parse(log)
        except DecodeError:  # a record caught half written: read again
            if time.monotonic() >= deadline:
                raise
            ended = False
        if ended:
            return run
        assert time.monotonic() < deadline, f"{log} has no exit record after {timeout_s} s"
        time.sleep(0.1)


def _parse(log: Path) -> tuple[OfflineRun, bool]:
    run = OfflineRun(files=log.parent / "files")
    ended = False
    for raw in frames(log):
        rec = pb.Record()
        rec.ParseFromString(raw)
        kind = rec.WhichOneof("record_type")
        if kind == "history":
            run.history.append(_items(rec.history.item))
        elif kind == "summary":
            for item in rec.summary.update:
                key = "/".join(item.nested_key) if item.nested_key else item.key
                run.summary[key] = json.loads(item.value_json)
        elif kind == "metric":
            m = rec.metric
            run.metrics.append(
                {"name": m.name, "glob_name": m.glob_name, "step_metric": m.step_metric}
            )
        elif kind == "exit":
            ended = True
    return run, ended
