"""``profile(webhook=URL)`` against a real local HTTP server (aiohttp's
test server): the Slack and JSON bodies, a server that never answers, a
500, and a closed port. The training loop and the post run in a worker
thread (``asyncio.to_thread``) while the server answers on the test's loop."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

import gpuprof
from gpuprof_shim import webhook as webhooks

from .training import train

FINDINGS = [
    {"rule": "cost", "severity": "LOW", "title": "Estimated cost: not estimated", "fix": ""},
    {
        "rule": "dataloader_stall",
        "severity": "HIGH",
        "title": "Dataloader stall <b>& CPU pegged</b>",
        "detail": "loader wait 31 ms of 50 ms",
        "fix": "num_workers=4",
        "evidence": {},
        "gain_ms_per_iteration": 10.0,
        "gain_pct": 20.0,
        "gain_speedup_max": 1.25,
        "gain_run_s": 30.0,
        "gain_usd": None,
        "gain_iteration_ms": 50.0,
        "gain_method": "the loader wait, removed",
        "gain_label": "the loader stall",
    },
    {  # worth more than the HIGH one: listed first
        "rule": "high_step_variance",
        "severity": "MED",
        "title": "Step compute time is erratic",
        "fix": "",
        "gain_ms_per_iteration": 20.0,
        "gain_pct": 40.0,
        "gain_speedup_max": 1.67,
        "gain_run_s": 60.0,
        "gain_usd": None,
        "gain_iteration_ms": 50.0,
        "gain_method": "the slow steps' time above the median",
        "gain_label": "the slow steps",
    },
]
#: What a Slack webhook's URL path looks like: its secret.
SECRET_PATH = "/services/T000/B000/s3cr3t"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Hook:
    """A local server recording each request's body and headers."""

    def __init__(self) -> None:
        self.bodies: list[Any] = []
        self.headers: list[dict[str, str]] = []
        self.answer: Handler = self.ok

    async def ok(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.bodies.append(orjson.loads(await request.read()))
        self.headers.append(dict(request.headers))
        return await self.answer(request)


@pytest.fixture
async def hook() -> AsyncIterator[tuple[Hook, str]]:
    recorder = Hook()
    app = web.Application()
    app.router.add_post(SECRET_PATH, recorder.handle)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    yield recorder, str(server.make_url(SECRET_PATH))
    await server.close()


def run_profile(socket_dir, url: str, **options: Any) -> gpuprof.Profiler:
    with gpuprof.profile(
        "hook-run", socket_dir=socket_dir, autostart=False, webhook=url, **options
    ) as prof:
        train(3)
    return prof


async def test_slack_body_has_the_header_each_finding_and_the_report_command(
    hook, make_daemon, socket_dir
):
    server, url = hook
    make_daemon(summary_extra={"insights": FINDINGS})
    prof = await asyncio.to_thread(run_profile, socket_dir, url)
    (body,) = server.bodies
    assert server.headers[0]["Content-Type"] == "application/json"
    assert body["text"] == (
        "gpuprof · hook-run  (3 steps, median 12.0 ms): 3 findings; "
        "fixing the slow steps: up to 1.7× faster (~60 s)"
    )
    header, top, med, high, low, report = body["blocks"]
    assert header == {
        "type": "header",
        "text": {
            "type": "plain_text",
            "text": "gpuprof · hook-run  (3 steps, median 12.0 ms)",
            "emoji": False,
        },
    }
    # ranked by what fixing each is worth, the top fix's worth first; severity still shown
    assert top["text"]["text"] == "Fixing the slow steps: up to 1.7× faster (~60 s)"
    assert med["text"]["text"] == (
        ":large_orange_circle: *MED*  Step compute time is erratic"
        "\n_Worth: up to 1.7× faster: 20.0 of 50.0 ms per iteration (40%), ~60 s of this run_"
    )
    # a run's strings are escaped for Slack's mrkdwn: no markup of theirs gets through
    assert high["text"]["text"] == (
        ":red_circle: *HIGH*  Dataloader stall &lt;b&gt;&amp; CPU pegged&lt;/b&gt;"
        "\n_Worth: up to 1.2× faster: 10.0 of 50.0 ms per iteration (20%), ~30 s of this run_"
        "\n_Fix:_ num_workers=4"
    )
    assert low["text"]["text"] == "*LOW*  Estimated cost: not estimated"
    assert report["elements"][0]["text"] == (
        f"Full report: `gpuprofctl insights {socket_dir / 'fake.db'} 7`"
    )
    assert prof.summary is not None and prof.summary["steps"] == 3


async def test_json_body_is_the_summary(hook, make_daemon, socket_dir):
    server, url = hook
    make_daemon(summary_extra={"insights": FINDINGS})
    prof = await asyncio.to_thread(run_profile, socket_dir, url, webhook_format="json")
    (body,) = server.bodies
    assert body["event"] == "gpuprof.run_end"
    assert body["summary"] == prof.summary
    assert body["text"].splitlines()[0] == "gpuprof · hook-run  (3 steps, median 12.0 ms)"


async def test_a_server_that_never_answers_is_given_up_after_the_timeout(
    hook, fake_daemon, socket_dir, caplog, monkeypatch
):
    server, url = hook
    answered = asyncio.Event()

    async def never(request: web.Request) -> web.Response:
        await answered.wait()  # until the test ends
        return web.Response(text="late")

    server.answer = never
    monkeypatch.setattr(webhooks, "TIMEOUT_S", 0.5)
    with caplog.at_level(logging.WARNING, logger="gpuprof.shim"):
        prof = await asyncio.to_thread(run_profile, socket_dir, url)
    answered.set()
    assert len(server.bodies) == 1  # it was sent, and the run ended without the answer
    assert hook_lines(caplog) == [
        f"gpuprof: webhook to {origin(url)} failed: no answer within 0.5 s"
    ]
    assert prof.summary is not None


async def test_a_500_is_one_line(hook, fake_daemon, socket_dir, caplog):
    server, url = hook

    async def fail(request: web.Request) -> web.Response:
        return web.Response(status=500, text="boom")

    server.answer = fail
    with caplog.at_level(logging.WARNING, logger="gpuprof.shim"):
        prof = await asyncio.to_thread(run_profile, socket_dir, url)
    assert hook_lines(caplog) == [
        f"gpuprof: webhook to {origin(url)} failed: HTTP 500 Internal Server Error"
    ]
    assert prof.summary is not None and len(server.bodies) == 1


def test_an_unreachable_host_is_one_line(fake_daemon, socket_dir, caplog):
    with socket.socket() as s:  # a port nothing listens on any more
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}{SECRET_PATH}"
    with caplog.at_level(logging.WARNING, logger="gpuprof.shim"):
        prof = run_profile(socket_dir, url)
    (line,) = hook_lines(caplog)
    assert line.startswith(f"gpuprof: webhook to http://127.0.0.1:{port} failed: ")
    assert "refused" in line.lower()
    assert prof.summary is not None and prof.summary["steps"] == 3


def test_only_the_first_rank_posts(fake_daemon, socket_dir, monkeypatch, caplog):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with caplog.at_level(logging.WARNING, logger="gpuprof.shim"):
        run_profile(socket_dir, "http://127.0.0.1:9/nothing-listens")
    assert hook_lines(caplog) == []  # rank 1 did not even try


def test_slack_body_keeps_within_slack_limits():
    many = [{"severity": "MED", "title": f"finding {i}", "fix": ""} for i in range(80)]
    body = webhooks.slack_body({"run_name": "r", "steps": 1, "insights": many})
    assert len(body["blocks"]) <= webhooks.SLACK_MAX_BLOCKS
    assert body["blocks"][-1]["elements"][0]["text"] == "… and 34 more findings"
    assert body["text"] == "gpuprof · r  (1 step): 80 findings"


def hook_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    lines = [r.getMessage() for r in caplog.records if "webhook" in r.getMessage()]
    assert all(SECRET_PATH not in line for line in lines)  # the path is the secret
    return lines


def origin(url: str) -> str:
    return url.split(SECRET_PATH)[0]
