from __future__ import annotations

from pathlib import Path

import pytest

from gpuprof import config


def test_socket_dir_precedence():
    env = {"GPUPROF_SOCKET": "/x/s", "XDG_RUNTIME_DIR": "/run/u"}
    assert config.socket_dir(env) == Path("/x/s")
    assert config.socket_dir({"XDG_RUNTIME_DIR": "/run/u"}).parent == Path("/run/u/gpuprof")
    assert config.socket_dir({}).parent.name.startswith("gpuprof-")


def test_each_database_gets_its_own_socket_dir():
    env = {"XDG_RUNTIME_DIR": "/run/u"}
    a = config.socket_dir(env, db=Path("/w/a/gpuprof.db"))
    b = config.socket_dir(env, db=Path("/w/b/gpuprof.db"))
    assert a != b and a.parent == b.parent == Path("/run/u/gpuprof")
    assert a == config.socket_dir({**env, "GPUPROF_DB": "/w/a/gpuprof.db"})
    assert len(config.ingest_endpoint(a)) < 60  # fits a Unix socket path comfortably


def test_db_path_relative_to_cwd():
    assert config.db_path({}, cwd=Path("/w")) == Path("/w/gpuprof.db")
    assert config.db_path({"GPUPROF_DB": "runs/a.db"}, cwd=Path("/w")) == Path("/w/runs/a.db")
    assert config.db_path({"GPUPROF_DB": "/abs.db"}, cwd=Path("/w")) == Path("/abs.db")


def test_gpu_rate():
    assert config.gpu_rate_usd_per_hour({}) is None
    assert config.gpu_rate_usd_per_hour({"GPUPROF_GPU_RATE": "2.5"}) == 2.5
    with pytest.raises(ValueError, match="GPUPROF_GPU_RATE"):
        config.gpu_rate_usd_per_hour({"GPUPROF_GPU_RATE": "-1"})


def test_nvml_backend_is_real_unless_mock_asked():
    assert config.nvml_backend({}) == "real"
    assert config.nvml_backend({"GPUPROF_NVML": "MOCK"}) == "mock"


def test_endpoint_too_long_says_what_to_do():
    assert config.ingest_endpoint(Path("/tmp/g")) == "ipc:///tmp/g/ingest.sock"
    with pytest.raises(ValueError, match="Set GPUPROF_SOCKET"):
        config.control_endpoint(Path("/tmp/" + "d" * 120))


def test_one_database_file_is_one_socket_dir_however_it_is_named(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "link").symlink_to(tmp_path)
    env = {"XDG_RUNTIME_DIR": "/run/u"}
    names = [tmp_path / "e.db", tmp_path / "sub" / ".." / "e.db", tmp_path / "link" / "e.db"]
    assert len({config.socket_dir(env, db=n) for n in names}) == 1
    assert config.db_path({"GPUPROF_DB": "../e.db"}, cwd=tmp_path / "sub") == tmp_path / "e.db"


def test_project_and_tags_from_the_environment():
    assert config.project({}) is None and config.tags({}) == {}
    assert config.project({"GPUPROF_PROJECT": "  "}) is None
    assert config.project({"GPUPROF_PROJECT": "x" * 100}) == "x" * 64
    env = {"GPUPROF_TAGS": "team=nlp,,flag, queue = a=b ,=nokey"}
    assert config.tags(env) == {"team": "nlp", "flag": "", "queue": "a=b"}
    many = ",".join(f"k{i}=v" for i in range(40))
    assert len(config.tags({"GPUPROF_TAGS": many})) == 16
