"""The pieces of gpuprofd.web.auth that need no server: key files (hashes,
rotation, failing closed), the viewer password file, where a key is read from."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import argon2
import pytest

from gpuprofd.core.errors import BadInputError
from gpuprofd.web import auth


def test_a_key_file_holds_keys_and_digests(tmp_path: Path) -> None:
    f = tmp_path / "keys"
    digest = hashlib.sha256(b"second").hexdigest()
    f.write_text(f"# rotation: both valid\nfirst\n\n  sha256:{digest.upper()}  \n")
    keys = auth.ApiKeys([f])
    assert keys.accepts("first") and keys.accepts("second")
    assert not keys.accepts("third") and not keys.accepts("") and not keys.accepts(None)
    assert not keys.accepts(f"sha256:{digest}")  # a digest is not itself a key


def test_a_bad_digest_line_is_named(tmp_path: Path) -> None:
    f = tmp_path / "keys"
    f.write_text("ok\nsha256:abc\n")
    with pytest.raises(BadInputError, match=r"keys line 2: sha256: needs 64 hex digits"):
        auth.ApiKeys([f])


def test_keys_come_from_files_or_the_environment(tmp_path: Path) -> None:
    with pytest.raises(BadInputError, match="no API keys"):
        auth.ApiKeys([])
    with pytest.raises(BadInputError, match="cannot read the API key file"):
        auth.ApiKeys([tmp_path / "missing"])
    keys = auth.ApiKeys([], auth.env_keys({"GPUPROF_API_KEY": " from-env "}))
    assert keys.accepts("from-env") and auth.env_keys({}) == []


def test_a_changed_file_is_read_again_and_a_broken_one_refuses_all(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(auth, "KEY_FILE_CHECK_S", 0.0)
    f = tmp_path / "keys"
    f.write_text("old\nnew\n")
    keys = auth.ApiKeys([f])
    assert keys.accepts("old")
    f.write_text("new\n")
    os.utime(f, ns=(1, 1))  # a new stamp even within the file system's time resolution
    assert not keys.accepts("old") and keys.accepts("new")
    f.write_text("new\nsha256:zz\n")
    os.utime(f, ns=(2, 2))
    assert not keys.accepts("new")  # fail closed until fixed
    f.write_text("new\n")
    os.utime(f, ns=(3, 3))
    assert keys.accepts("new")


def test_the_viewer_password_file(tmp_path: Path) -> None:
    f = tmp_path / "viewer"
    f.write_text("s3cret\n")
    hashed = auth.viewer_hash(f)
    assert hashed.startswith("$argon2id$") and argon2.PasswordHasher().verify(hashed, "s3cret")
    f.write_text(hashed + "\n")
    assert auth.viewer_hash(f) == hashed  # a hash is taken as it is
    f.write_text("$argon2id$v=19$broken\n")
    with pytest.raises(BadInputError, match="broken argon2 hash"):
        auth.viewer_hash(f)
    f.write_text("\n")
    with pytest.raises(BadInputError, match="is empty"):
        auth.viewer_hash(f)


def test_proxies_are_addresses_or_networks() -> None:
    nets = auth.parse_proxies(["127.0.0.1", "10.0.0.0/8", "::1"])
    assert [str(n) for n in nets] == ["127.0.0.1/32", "10.0.0.0/8", "::1/128"]
    with pytest.raises(BadInputError, match="--trust-proxy 'proxy.local'"):
        auth.parse_proxies(["proxy.local"])


def test_a_login_goes_back_only_to_a_view_of_the_page() -> None:
    for view in ("#/run/12", "#/runs?name=x&status=running", "#/compare/1,2", "#/group/g%2F1", ""):
        assert auth.safe_next(view) == view
    for hostile in (
        "//evil.example/",
        "https://evil.example/",
        "/\\evil.example",
        "#/x\r\nSet-Cookie: a=b",
        "#/" + "x" * 501,
        "#notaview",
        None,
        ["#/run/1"],
    ):
        assert auth.safe_next(hostile) == ""
