import textwrap

import pytest


@pytest.fixture
def write(tmp_path):
    """write("a/b.py", code) -> Path; code is dedented."""

    def _write(rel, text, mode="w"):
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(text, bytes):
            p.write_bytes(text)
        else:
            p.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
        return p

    return _write


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture(autouse=True, scope="session")
def _own_cache(tmp_path_factory):
    """The tests' result cache is their own (never the user's ~/.cache/ampfix)."""
    import os

    os.environ["AMPFIX_CACHE_DIR"] = str(tmp_path_factory.mktemp("ampfix-cache"))
    yield
