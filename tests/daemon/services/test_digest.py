"""The team server's digest: the period's totals, the three costliest
findings with their fix and runs, in Slack blocks (names escaped) or JSON,
posted to a real HTTP receiver; sent once per period even when two
replicas (two stores on one database) look at once; a failed post is given
back and sent at the next look. On SQLite and the real Postgres."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from gpuprofd.services.digest import Digest, body, period_end_ns
from tests.daemon.storage.test_backends import open_store
from tests.daemon.storage.test_rollups import UNTIL, _fixture

WEEK_S = 7 * 86400


class Receiver:
    """A webhook receiver: keeps each JSON body; answers *status*."""

    def __init__(self) -> None:
        self.got: list[dict[str, Any]] = []
        self.status = 200

    async def handle(self, request: web.Request) -> web.Response:
        self.got.append(await request.json())
        return web.Response(status=self.status)


@pytest.fixture
async def receiver() -> AsyncIterator[tuple[Receiver, str]]:
    r = Receiver()
    app = web.Application()
    app.router.add_post("/hook", r.handle)
    server = TestServer(app)
    await server.start_server()
    try:
        yield r, str(server.make_url("/hook"))
    finally:
        await server.close()


def test_periods_end_on_multiples_of_their_length() -> None:
    assert period_end_ns(UNTIL + 1, WEEK_S) == UNTIL
    assert period_end_ns(UNTIL - 1, WEEK_S) == UNTIL - WEEK_S * 10**9


async def test_the_digest_is_sent_once_by_two_replicas(storage_url: str, receiver: Any) -> None:
    rec, url = receiver
    async with open_store(storage_url) as one, open_store(storage_url) as two:
        await _fixture(one)
        a, b = Digest(one, url, WEEK_S, "json"), Digest(two, url, WEEK_S, "json")
        sent = await asyncio.gather(*(d.tick(UNTIL + 1) for d in (a, b, a, b)))
        assert sorted(sent) == [False, False, False, True]
        assert await b.tick(UNTIL + 5) is False  # later in the same period: already sent
    (got,) = rec.got
    assert got["event"] == "gpuprof.digest"
    assert got["period_end_s"] == UNTIL / 1e9
    lines = got["text"].splitlines()
    assert (
        lines[0] == "3 runs, 90.0 GPU-hours ($352); 9.0 GPU-hours lost to what gpuprof found, 10%."
    )
    assert lines[1] == (
        "dataloader_stall: 5.6 GPU-hours in 2 runs (pretrain, sft). "
        "Fix: Raise DataLoader num_workers"
    )
    assert lines[2] == "gpu_idle_between_steps: 3.4 GPU-hours in 1 runs (pretrain)"
    assert [r["run_name"] for r in got["runs"]["dataloader_stall"]] == ["pretrain", "sft"]


async def test_a_failed_post_is_sent_at_the_next_look(storage_url: str, receiver: Any) -> None:
    rec, url = receiver
    async with open_store(storage_url) as store:
        await _fixture(store)
        digest = Digest(store, url, WEEK_S)
        rec.status = 500
        assert await digest.tick(UNTIL + 1) is False
        rec.status = 200
        assert await digest.tick(UNTIL + 2) is True
    assert len(rec.got) == 2
    slack = rec.got[1]
    assert slack["blocks"][0]["type"] == "header"
    assert slack["text"].startswith("gpuprof: the team's GPU-hours: 3 runs, 90.0 GPU-hours")


def test_slack_blocks_escape_names() -> None:
    out = {
        "totals": {"runs": 1, "gpu_hours": 1.0, "usd": None, "lost_gpu_hours": 0.5,
                   "lost_share": 0.5},
        "findings": [{"rule": "dataloader_stall", "lost_gpu_hours": 0.5, "runs": 1, "fix": None}],
    }  # fmt: skip
    runs = {"dataloader_stall": [{"id": 1, "run_name": "<!channel> & <http://x|y>"}]}
    text = body(out, runs, "slack")["blocks"][2]["text"]["text"]
    assert "&lt;!channel&gt; &amp; &lt;http://x|y&gt;" in text and "<!" not in text
