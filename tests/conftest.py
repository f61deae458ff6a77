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


@pytest.fixture(autouse=True, scope="session")
def _ctrl_c_as_python_has_it():
    """Ctrl-C as an interactive Python has it, however pytest was started: a shell without job
    control starts a background command with SIGINT ignored (`cmd &` in a script), Python then
    leaves it ignored, and the tests of Ctrl-C would see nothing (one waited for ever on an
    interrupt that never came).  The subprocesses the tests start inherit the handler's
    disposition, so they get SIGINT's default too."""
    import signal

    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        yield
        return
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
