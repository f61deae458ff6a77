"""The worker pool never leaves a run waiting: a dead worker costs only its job, a large result
is read while another worker dies, and closing kills the workers at once."""
import os
import signal
import sys
import time

import pytest

from ampfix.engine.pool import Pool, WorkerDied, result

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the workers fork here")


def _big(n):
    return b"x" * n


def _die(_):
    os.kill(os.getpid(), signal.SIGKILL)


def _slow(seconds):
    time.sleep(seconds)
    return seconds


def test_a_dead_worker_costs_only_its_job_while_another_returns_a_large_result():
    with Pool(2) as pool:
        big = pool.submit(_big, 64 * 1024 * 1024)  # far more than a pipe holds
        dead = pool.submit(_die, None)
        with pytest.raises(WorkerDied):
            result(dead)
        assert len(result(big)) == 64 * 1024 * 1024
        # the pool goes on with a fresh worker
        assert [result(pool.submit(_big, 3)) for _ in range(4)] == [b"xxx"] * 4


def test_an_exception_in_a_job_comes_back_as_itself():
    with Pool(1) as pool:
        fut = pool.submit(_div, 0)
        with pytest.raises(ZeroDivisionError):
            result(fut)


def _div(x):
    return 1 / x


def test_close_kills_busy_workers_at_once():
    pool = Pool(2)
    futures = [pool.submit(_slow, 60) for _ in range(4)]
    time.sleep(0.5)
    pids = [w.process.pid for w in pool._workers]
    start = time.monotonic()
    pool.close()
    assert time.monotonic() - start < 3
    for f in futures:
        with pytest.raises(WorkerDied):
            f.result(timeout=1)
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_workers_take_the_default_sigterm():
    def terminated(signum, frame):  # what the CLI installs: a worker must not inherit it
        raise SystemExit(143)

    old = signal.signal(signal.SIGTERM, terminated)
    try:
        pool = Pool(1)
    finally:
        signal.signal(signal.SIGTERM, old)
    with pool:
        pid = result(pool.submit(_pid, None))
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)
        else:
            pytest.fail("a worker ignored SIGTERM")


def _pid(_):
    return os.getpid()


class Awkward(Exception):
    """An exception that pickles but does not unpickle (its __init__ takes other arguments)."""

    def __init__(self, path, line, message):
        super().__init__(f"{path}:{line}: {message}")


def _awkward(_):
    raise Awkward("x.py", 3, "bad")


def test_an_exception_that_does_not_unpickle_comes_back_as_text_and_the_pool_goes_on():
    with Pool(1) as pool:
        with pytest.raises(RuntimeError, match="x.py:3: bad"):
            result(pool.submit(_awkward, None))
        assert result(pool.submit(_big, 2)) == b"xx"
