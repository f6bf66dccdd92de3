"""A run found by the name its training script gave, on each backend: the
name is looked up as it was stored (cleaned, cut to 200 characters)."""

from __future__ import annotations

import pytest

from gpuprof.protocol import MAX_RUN_NAME_CHARS, clean_run_name
from gpuprofd.core.errors import UnknownRunError
from gpuprofd.storage import reads
from gpuprofd.storage.writes import runsdb
from tests.daemon.storage.test_backends import open_store, run_row

#: What a script may pass to gpuprof.profile(): a terminal escape, a bell, a
#: line break and HTML; and a name past the stored length.
HOSTILE = "evil\x1b[31mRED\x07\r\nname<script>alert(1)</script>"
LONG = "x" * 10_000


async def test_a_run_is_found_by_the_name_it_was_given(storage_url: str) -> None:
    async with open_store(storage_url) as store:
        # stored as ingest stores a hello's name
        hostile = await runsdb.insert_run(store, run_row("k1", clean_run_name(HOSTILE)))
        long = await runsdb.insert_run(store, run_row("k2", clean_run_name(LONG)))
        assert (await reads.latest_run_named(store, HOSTILE))["id"] == hostile
        assert (await reads.latest_run_named(store, LONG))["id"] == long
        stored = "x" * MAX_RUN_NAME_CHARS
        assert (await reads.latest_run_named(store, stored))["id"] == long
        # an unknown long name is said in one line, not repeated whole
        with pytest.raises(UnknownRunError) as err:
            await reads.latest_run_named(store, "y" * 5000)
    message = str(err.value)
    assert message.startswith("no run named '" + "y" * 59 + "…' in ")
    assert len(message) < 600
