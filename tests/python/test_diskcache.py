"""The PyTorch backend's disk cache (python/evt/diskcache.py) uses only a private folder: one of another user, one
that others may write, or a planted symlink is refused with a warning and nothing is read or written there."""
import logging
import os
import pwd
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                "python"))
from evt import diskcache  # noqa: E402
from evt import lib as L  # noqa: E402

pytestmark = pytest.mark.skipif(not L.has_interpreter(), reason="libevt has no CPU interpreter yet")

TEXT = "graph t {\n  %x: f32[4] = input()\n  %y: f32[4] = tanh(%x)\n  output %y\n}\n"


@pytest.fixture
def root(tmp_path, monkeypatch):
    monkeypatch.setenv("EVT_CACHE_DIR", str(tmp_path / "root"))
    monkeypatch.setenv("EVT_CACHE", "1")
    return tmp_path


def _store_and_load(caplog):
    g = L.Graph(TEXT, "t.evt")
    k = diskcache.key(TEXT)
    with caplog.at_level(logging.INFO, logger="evt"):
        diskcache.store(k, g, False)
        return diskcache.load(k, "t.evt")


def test_private_dir_is_created_0700_and_used(root, caplog):
    assert _store_and_load(caplog) is not None
    for d in (root / "root", root / "root" / "torch"):
        assert (os.stat(d).st_mode & 0o777) == 0o700, d


def test_group_writable_dir_is_refused(root, caplog):
    d = root / "root" / "torch"
    d.mkdir(parents=True)
    d.chmod(0o770)
    assert _store_and_load(caplog) is None
    assert not list(d.iterdir())
    assert any("writable" in r.getMessage() and r.levelno >= logging.WARNING for r in caplog.records)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a folder to another user")
def test_dir_of_another_user_is_refused(root, caplog):
    d = root / "root" / "torch"
    d.mkdir(parents=True, mode=0o700)
    nobody = pwd.getpwnam("nobody")
    os.chown(d, nobody.pw_uid, nobody.pw_gid)
    assert _store_and_load(caplog) is None
    assert not list(d.iterdir())
    assert any("owned by" in r.getMessage() for r in caplog.records)


def test_symlinked_dir_is_refused(root, caplog):
    (root / "elsewhere").mkdir()
    (root / "root").mkdir(mode=0o700)
    os.symlink(root / "elsewhere", root / "root" / "torch")
    assert _store_and_load(caplog) is None
    assert not list((root / "elsewhere").iterdir())
    assert any("symbolic link" in r.getMessage() for r in caplog.records)


def test_cache_root_without_home_is_per_user(monkeypatch):
    from evt import config
    for v in ("EVT_CACHE_DIR", "XDG_CACHE_HOME", "HOME"):
        monkeypatch.delenv(v, raising=False)
    assert config.cache_root() == f"/tmp/evt-cache-{os.getuid()}"
