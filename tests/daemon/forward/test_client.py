"""One batch posted (:mod:`gpuprofd.forward.client`) to a real aiohttp
server answering as a team server does, or as one that is not: what each
answer means for the node (acknowledged, retried, paused, refused)."""

from __future__ import annotations

import asyncio
import gzip
import socket
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from gpuprofd.forward import client
from gpuprofd.forward.client import Acked, Paused, Refused, Retry, compress, post

KEY = "node-key-123"
BODY = orjson.dumps({"v": 1, "node": "n", "events": [{"seq": 1, "kind": "run"}]})

Answer = Callable[[web.Request], Any]


class Server:
    """An aiohttp server whose ingest answers with :attr:`answer`; it keeps what it got."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.got: list[tuple[dict[str, str], bytes]] = []
        app = web.Application()
        app.router.add_post("/api/v1/ingest", self._ingest)
        self.server = TestServer(app, host="127.0.0.1")

    async def _ingest(self, request: web.Request) -> web.StreamResponse:
        self.got.append((dict(request.headers), await request.read()))
        out = self.answer(request)
        return await out if asyncio.iscoroutine(out) else out

    @property
    def url(self) -> str:
        return str(self.server.make_url("/api/v1/ingest"))


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[Answer], Any]]:
    started: list[Server] = []

    async def start(answer: Answer) -> Server:
        s = Server(answer)
        await s.server.start_server(auto_decompress=False)  # the body as sent
        started.append(s)
        return s

    yield start
    for s in started:
        await s.server.close()


async def _post(url: str) -> Acked:
    async with aiohttp.ClientSession() as session:
        return await post(session, url, KEY, await compress(BODY))


def _json(status: int, body: Any, **headers: str) -> Answer:
    return lambda _r: web.json_response(body, status=status, headers=headers)


async def test_200_is_acknowledged_and_the_batch_went_gzipped_with_the_key(serve: Any) -> None:
    s = await serve(_json(200, {"node": "n", "acked_seq": 41, "applied": 3, "skipped": 2}))
    assert await _post(s.url) == Acked(acked_seq=41, applied=3, skipped=2)
    ((headers, body),) = s.got
    assert headers["Authorization"] == f"Bearer {KEY}"
    assert headers["Content-Encoding"] == "gzip" and headers["Content-Type"] == "application/json"
    assert gzip.decompress(body) == BODY


async def test_200_not_as_a_team_server_answers_pauses(serve: Any) -> None:
    s = await serve(lambda _r: web.Response(text="<html>welcome</html>", content_type="text/html"))
    with pytest.raises(Paused, match=r"answered 200 but not as a gpuprof team server does"):
        await _post(s.url)


async def test_429_is_retried_after_what_the_server_said(serve: Any) -> None:
    s = await serve(_json(429, {"error": "slow down"}, **{"Retry-After": "7"}))
    with pytest.raises(Retry) as caught:
        await _post(s.url)
    assert type(caught.value) is Retry and caught.value.retry_after_s == 7.0
    assert "429: slow down" in str(caught.value)


async def test_a_retry_after_date_is_not_a_delay(serve: Any) -> None:
    s = await serve(
        _json(429, {"error": "later"}, **{"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"})
    )
    with pytest.raises(Retry) as caught:
        await _post(s.url)
    assert caught.value.retry_after_s is None  # the forwarder's own backoff then


async def test_503_is_retried_with_the_servers_reason(serve: Any) -> None:
    s = await serve(_json(503, {"error": "the database is unreachable: send the batch again"}))
    with pytest.raises(Retry) as caught:
        await _post(s.url)
    assert type(caught.value) is Retry and caught.value.retry_after_s is None
    assert str(caught.value) == (
        "the team server answered 503: the database is unreachable: send the batch again"
    )


@pytest.mark.parametrize("status", [401, 403])
async def test_a_refused_key_pauses_saying_how_to_fix_it(serve: Any, status: int) -> None:
    s = await serve(_json(status, {"error": "no valid API key"}))
    with pytest.raises(Paused) as caught:
        await _post(s.url)
    said = str(caught.value)
    assert said.startswith(f"the team server refused the API key ({status}: no valid API key)")
    assert "GPUPROF_API_KEY_FILE" in said and "nothing is lost meanwhile" in said
    assert caught.value.retry_after_s == client.PAUSED_RETRY_S


@pytest.mark.parametrize(
    "answer",
    [
        _json(404, {"error": "no such page"}),
        lambda _r: web.Response(status=405, text="method not allowed"),
        lambda _r: web.Response(status=302, headers={"Location": "/login"}),
    ],
    ids=["404", "405", "302"],
)
async def test_not_an_ingest_endpoint_pauses(serve: Any, answer: Answer) -> None:
    s = await serve(answer)
    with pytest.raises(Paused, match=r"is not a team server's ingest endpoint \((404|405|302)\)"):
        await _post(s.url)


async def test_400_naming_an_event_is_refused_with_its_index(serve: Any) -> None:
    s = await serve(_json(400, {"error": "not an integer", "field": "events[3].rows[0].step"}))
    with pytest.raises(Refused) as caught:
        await _post(s.url)
    exc = caught.value
    assert (exc.status, exc.event, exc.field) == (400, 3, "events[3].rows[0].step")
    assert str(exc) == "400: not an integer"


async def test_409_naming_an_events_run_is_refused_with_the_field(serve: Any) -> None:
    s = await serve(_json(409, {"error": "sent by another node", "field": "events[1].run"}))
    with pytest.raises(Refused) as caught:
        await _post(s.url)
    assert (caught.value.status, caught.value.event, caught.value.field) == (
        409,
        1,
        "events[1].run",
    )


async def test_400_without_a_field_refuses_the_whole_batch(serve: Any) -> None:
    s = await serve(_json(400, {"error": "the body is not JSON"}))
    with pytest.raises(Refused) as caught:
        await _post(s.url)
    assert (caught.value.status, caught.value.event) == (400, None)


async def test_400_on_the_batch_format_pauses(serve: Any) -> None:
    s = await serve(_json(400, {"error": "batch format 2 is not taken", "field": "v"}))
    with pytest.raises(Paused, match=r"does not take this node's batch format: batch format 2"):
        await _post(s.url)


async def test_413_is_refused_as_too_large(serve: Any) -> None:
    s = await serve(_json(413, {"error": "the body is larger than this server takes"}))
    with pytest.raises(Refused) as caught:
        await _post(s.url)
    assert (caught.value.status, caught.value.event) == (413, None)
    assert "larger than this server takes" in str(caught.value)


async def test_a_non_json_error_body_is_quoted(serve: Any) -> None:
    s = await serve(lambda _r: web.Response(status=502, text="Bad Gateway from nginx"))
    with pytest.raises(Retry, match=r"answered 502: Bad Gateway from nginx"):
        await _post(s.url)


async def test_no_server_listening_is_no_answer() -> None:
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(Retry, match=r"^no answer from http://127.0.0.1:\d+/api/v1/ingest") as c:
        await _post(f"http://127.0.0.1:{port}/api/v1/ingest")
    assert type(c.value) is Retry and c.value.retry_after_s is None


async def test_a_server_that_never_answers_is_no_answer(
    serve: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(client, "POST_TIMEOUT_S", 0.5)
    never = asyncio.Event()

    async def hang(_r: web.Request) -> web.Response:
        await never.wait()
        raise AssertionError("unreachable")

    s = await serve(hang)
    with pytest.raises(Retry, match=r"no answer from .*TimeoutError"):
        await _post(s.url)
    never.set()


async def test_a_connection_dropped_mid_answer_is_no_answer(serve: Any) -> None:
    async def drop(request: web.Request) -> web.Response:
        assert request.transport is not None
        request.transport.close()
        return web.Response(text="never seen")

    s = await serve(drop)
    with pytest.raises(Retry, match=r"no answer from"):
        await _post(s.url)


@pytest.mark.parametrize("size", [1000, 1_000_000])
async def test_compress_small_and_large_bodies(size: int) -> None:
    body = orjson.dumps({"rows": list(range(size // 8))})
    assert gzip.decompress(await compress(body)) == body
