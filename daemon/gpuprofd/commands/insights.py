"""``gpuprofctl insights [DB] [RUN_ID]``: a run's summary with every insight's detail."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
import orjson

from gpuprof.summary import format_summary, make_summary
from gpuprofd import dbread
from gpuprofd.commands.common import db_argument, echo_json, format_option, resolve_db

LIVE_NOTE = "run in progress: insights as of the daemon's last live update"


def load_summary(db: Path, run_id: int | None) -> dict[str, Any]:
    """The stored end-of-run summary, or one built from the stored insights."""
    conn = dbread.open_ro(db)
    try:
        run = dbread.get_run(conn, run_id, db)
        if run.get("summary"):
            try:
                return orjson.loads(run["summary"])
            except orjson.JSONDecodeError:
                pass  # damaged: rebuild below
        ctx = dbread.run_context(conn, run)
        notes = [LIVE_NOTE] if run["status"] == "running" else []
        return make_summary(
            run["id"], ctx, dbread.stored_insights(conn, run["id"]), str(db.absolute()), notes
        )
    finally:
        conn.close()


def split_args(db: Path | None, run_id: int | None) -> tuple[Path | None, int | None]:
    """``insights 3``: a lone all-digits argument that names no file is RUN_ID."""
    if run_id is None and db is not None and str(db).isascii() and str(db).isdigit():
        if not db.exists():
            return None, int(str(db))
    return db, run_id


@click.command("insights")
@db_argument
@click.argument("run_id", type=click.IntRange(1, 2**63 - 1), required=False)
@format_option
def insights_cmd(db: Path | None, run_id: int | None, fmt: str) -> None:
    """Show a run's insights (default: the latest run in DB).

    DB defaults to GPUPROF_DB or ./gpuprof.db. A lone all-digits argument
    that is not an existing file is RUN_ID: `gpuprofctl insights 3`.
    """
    db, run_id = split_args(db, run_id)
    summary = load_summary(resolve_db(db), run_id)
    if fmt == "json":
        echo_json(summary)
    else:
        click.echo(format_summary(summary, details=True))
