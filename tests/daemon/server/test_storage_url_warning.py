"""``gpuprofd serve`` warns that the database password is on the command line
only when the URL given there really carries one."""

from __future__ import annotations

import pytest

from gpuprofd.server.cli import storage_url_of
from gpuprofd.storage.url import has_password


@pytest.mark.parametrize(
    ("url", "secret"),
    [
        ("sqlite:///tmp/team.db", False),
        ("sqlite:////srv/gpuprof/team.db", False),
        ("sqlite:///odd:name@x.db", False),
        ("postgres://gpuprof@db.internal/gpuprof", False),
        ("postgres://gpuprof@db.internal/gpuprof?sslmode=require", False),
        ("postgres://gpuprof:s3cret@db.internal/gpuprof", True),
        ("postgres://db.internal/gpuprof?password=s3cret", True),
        ("postgres://db.internal/gpuprof?sslmode=require&SSLPassword=k", True),
    ],
)
def test_has_password_reads_the_url_parts(url: str, secret: bool) -> None:
    assert has_password(url) is secret


def test_a_sqlite_url_is_not_warned_of(capsys: pytest.CaptureFixture[str]) -> None:
    assert storage_url_of("sqlite:///tmp/team.db", None) == "sqlite:///tmp/team.db"
    assert capsys.readouterr().err == ""


def test_a_password_on_the_command_line_is_warned_of(capsys: pytest.CaptureFixture[str]) -> None:
    url = "postgres://gpuprof:s3cret@db.internal/gpuprof"
    assert storage_url_of(url, None) == url
    err = capsys.readouterr().err
    assert "password is on the command line" in err and "s3cret" not in err
