"""A Ctrl-C or SIGTERM that arrives while the main thread is inside a lock's bookkeeping ends the run
as an interrupt (130/143), never as "internal error: cannot release un-acquired lock" (CI saw that
once in test_signals_exit_code_and_no_orphan_workers) nor as a lock left held."""
import os
import signal
import threading
from concurrent.futures import Future

import pytest
from click.testing import CliRunner

import ampfix.cli
import ampfix.engine.run
from ampfix.engine.interrupts import shielded
from ampfix.engine.pool import result


def _signal_inside_the_wait(fut: Future, sig=signal.SIGINT) -> None:
    """Send `sig` once, right after the future's condition let its lock go in Condition.wait and
    before the wait's `try`: the moment the race of CI's failure needs."""
    cond = fut._condition
    release = cond._release_save
    sent = []

    def release_then_signal():
        state = release()
        if not sent:
            sent.append(1)
            os.kill(os.getpid(), sig)  # the handler runs before this function returns
        return state

    cond._release_save = release_then_signal


def test_the_race_is_real_without_the_shield():
    fut: Future = Future()
    _signal_inside_the_wait(fut)
    with pytest.raises(RuntimeError, match="un-acquired lock") as got:
        fut.result(timeout=0.2)
    assert isinstance(got.value.__context__, KeyboardInterrupt)


def test_result_turns_that_moment_into_a_plain_interrupt():
    fut: Future = Future()
    _signal_inside_the_wait(fut)
    with pytest.raises(KeyboardInterrupt):
        result(fut)
    assert not fut._condition._is_owned()
    done = threading.Thread(target=fut.set_result, args=(5,))
    done.start()
    done.join(timeout=5)
    assert not done.is_alive(), "the future's lock was left held"
    assert result(fut) == 5


def test_sigterm_in_that_moment_goes_to_the_handler_in_place():
    def terminated(signum, frame):
        raise SystemExit(128 + signum)

    old = signal.signal(signal.SIGTERM, terminated)
    try:
        fut: Future = Future()
        _signal_inside_the_wait(fut, signal.SIGTERM)
        with pytest.raises(SystemExit) as got:
            result(fut)
        assert got.value.code == 143
    finally:
        signal.signal(signal.SIGTERM, old)


def test_shielded_holds_the_signal_to_its_end_and_restores_the_handlers():
    before = signal.getsignal(signal.SIGINT)
    reached = []
    with pytest.raises(KeyboardInterrupt):
        with shielded():
            os.kill(os.getpid(), signal.SIGINT)
            reached.append("the rest of the block ran")
    assert reached and signal.getsignal(signal.SIGINT) is before


def test_shielded_off_the_main_thread_is_a_plain_block():
    out = []

    def body():
        with shielded():
            out.append(signal.getsignal(signal.SIGINT))

    t = threading.Thread(target=body)
    t.start()
    t.join()
    assert out == [signal.getsignal(signal.SIGINT)]


def test_an_error_raised_while_an_interrupt_unwinds_reports_the_interrupt(tmp_path, monkeypatch):
    (tmp_path / "a.py").write_text("x = 1\n")

    def broken_unwinding(*a, **k):
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            raise RuntimeError("cannot release un-acquired lock")

    monkeypatch.setattr(ampfix.engine.run, "check_paths", broken_unwinding)
    out = CliRunner().invoke(ampfix.cli.main, ["check", str(tmp_path)])
    assert out.exit_code == 130, out.output
    assert "internal error" not in out.output and "interrupted" in out.output
