"""Where top and watch find the live feed, and the one-line errors when they
cannot: no gpuprofd, one serving no dashboard, bad credentials' files."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuprofd.commands.feedopts import read_password, resolve_feed
from gpuprofd.core.errors import EXIT_BAD_INPUT, EXIT_NO_DAEMON, BadInputError
from gpuprofd.ctl import main


def test_no_daemon_is_exit_3_saying_where_it_looked(
    sock_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["top", "--socket-dir", str(sock_dir), "--once"]) == EXIT_NO_DAEMON
    err = capsys.readouterr().err
    assert err.startswith(f"gpuprofctl: error: no gpuprofd answering on {sock_dir}")
    assert main(["watch", "3", "--socket-dir", str(sock_dir)]) == EXIT_NO_DAEMON


def test_a_daemon_without_a_dashboard_is_said_so(
    daemons, sock_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    daemons.start_ready(sock_dir, tmp_path / "g.db", "--http", "off")
    assert main(["top", "--socket-dir", str(sock_dir), "--once"]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert "serves no dashboard (started with --http off)" in err and "\n" == err[-1]
    assert err.count("\n") == 1


def test_the_daemon_of_a_database_and_its_dashboard(
    daemons, sock_dir: Path, tmp_path: Path
) -> None:
    daemons.start_ready(sock_dir, tmp_path / "g.db", "--http", "127.0.0.1:0")
    target = resolve_feed(None, sock_dir, None, None, None, 2.0)
    assert target.url.startswith("http://127.0.0.1:") and target.creds.api_key is None


def test_credentials_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "password"
    f.write_text("\n  s3cret  \n")
    assert read_password(f) == "s3cret"
    f.write_text("$argon2id$v=19$m=65536,t=3,p=4$abc$def\n")
    with pytest.raises(BadInputError, match="holds a password hash"):
        read_password(f)
    f.write_text("\n")
    with pytest.raises(BadInputError, match="is empty"):
        read_password(f)
    with pytest.raises(BadInputError, match="cannot read the viewer password file"):
        read_password(tmp_path / "missing")
    keys = tmp_path / "key"
    keys.write_text("# the team's key\nk-123\n")
    monkeypatch.delenv("GPUPROF_API_KEY", raising=False)
    monkeypatch.delenv("GPUPROF_API_KEY_FILE", raising=False)
    target = resolve_feed(None, None, "http://server:8000/", keys, None, 1.0)
    assert (target.url, target.creds.api_key) == ("http://server:8000", "k-123")
    monkeypatch.setenv("GPUPROF_API_KEY", "from-env")
    assert resolve_feed(None, None, "http://server:8000", None, None, 1.0).creds.api_key == (
        "from-env"
    )
    with pytest.raises(BadInputError, match="is not a team server URL"):
        resolve_feed(None, None, "server:8000", None, None, 1.0)


def test_a_key_file_without_a_server_is_a_usage_error(
    sock_dir: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    key = tmp_path / "key"
    key.write_text("k\n")
    code = main(["top", "--socket-dir", str(sock_dir), "--api-key-file", str(key)])
    assert code == 2 and "--api-key-file goes with --server URL" in capsys.readouterr().err
