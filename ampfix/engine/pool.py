"""Worker processes that never leave a run waiting.

Why not ``concurrent.futures.ProcessPoolExecutor``: when one of its workers dies the whole pool
is marked broken, and the executor then waits for the other workers, one of which can sit
blocked writing a large result into a pipe nobody reads any more (a run that never ends); its
shutdown also waits for the work in flight, so Ctrl-C took as long as the run.

Here each worker has a pipe of its own and a thread of this process reads every result as soon
as it is there (a worker never blocks on a full pipe).  A worker that dies costs only the job it
held: a fresh worker takes its place and the job's future gets :class:`WorkerDied`; the caller
splits a job of several files to find the one to blame.  :meth:`Pool.close` kills the workers at
once (SIGKILL), so Ctrl-C and SIGTERM end a run within a fraction of a second.

Workers take the default signal dispositions (SIGTERM ends them; Ctrl-C goes to this process,
which kills them), die with this process (PR_SET_PDEATHSIG, and a watchdog thread where that is
missing), and never run this process's handlers.
"""
from __future__ import annotations

import multiprocessing
import os
import signal
import threading
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from multiprocessing.connection import wait
from typing import Any, Callable, List, Optional, Sequence

from ampfix.engine.interrupts import shielded


class WorkerDied(Exception):
    """The worker process running the job ended without answering (a crash in the interpreter,
    a kill, the memory killer)."""


class _Failed:
    """An exception raised by a job, carried back as text when it cannot be pickled."""

    def __init__(self, exc: BaseException) -> None:
        import traceback

        self.text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        try:  # it must come back whole: an exception whose __init__ takes other arguments does not
            import pickle

            pickle.loads(pickle.dumps(exc))
            self.exc: Optional[BaseException] = exc
        except Exception:
            self.exc = None

    def error(self) -> BaseException:
        return self.exc if self.exc is not None else RuntimeError(self.text)


def _serve(conn, parent: int) -> None:
    """A worker's loop: (fn, arg) in, ("ok", result) or ("err", _Failed) out; None ends it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # never the parent's handler (raise SystemExit)
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG (Linux)
    except Exception:
        pass

    def watch():
        import time

        while True:
            if os.getppid() != parent:
                os._exit(1)
            time.sleep(0.5)

    threading.Thread(target=watch, daemon=True).start()
    while True:
        try:
            job = conn.recv()
        except (EOFError, OSError):
            os._exit(0)
        if job is None:
            os._exit(0)
        fn, arg = job
        try:
            out = ("ok", fn(arg))
        except BaseException as exc:  # noqa: BLE001 - carried to the caller
            out = ("err", _Failed(exc))
        try:
            conn.send(out)
        except Exception as exc:  # a result that cannot be pickled
            conn.send(("err", _Failed(exc)))


class _Worker:
    def __init__(self, ctx, parent: int) -> None:
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_serve, args=(child, parent), daemon=True)
        self.process.start()
        child.close()
        self.job: Optional[Future] = None


class Pool:
    """``submit(fn, arg) -> Future`` over ``n`` worker processes (fork: the work functions and
    their arguments need not be importable by name in a fresh interpreter)."""

    def __init__(self, n: int) -> None:
        self._ctx = multiprocessing.get_context("fork")
        self._parent = os.getpid()
        self._lock = threading.Lock()
        self._queue: List[tuple] = []
        self._closed = False
        self._broken: Optional[BaseException] = None
        self._wake_r, self._wake_w = os.pipe()
        self._workers = [_Worker(self._ctx, self._parent) for _ in range(max(1, n))]
        self._thread = threading.Thread(target=self._run, daemon=True, name="ampfix-pool")
        self._thread.start()

    # ------------------------------------------------------------------ the caller's side
    def submit(self, fn: Callable[[Any], Any], arg: Any) -> Future:
        fut: Future = Future()
        with shielded(), self._lock:  # a Ctrl-C landing here must not leave the lock held
            if self._closed or self._broken is not None:
                raise RuntimeError("the pool is closed" if self._closed else f"the pool failed: {self._broken}")
            self._queue.append((fut, fn, arg))
        os.write(self._wake_w, b"x")
        return fut

    def map(self, fn: Callable[[Any], Any], items: Sequence[Any]) -> List[Any]:
        """[fn(item)] in order; an item whose worker died is run again once in a fresh one, and
        raises WorkerDied if it dies again."""
        futures = [self.submit(fn, x) for x in items]
        out = []
        for fut, x in zip(futures, items):
            try:
                out.append(result(fut))
            except WorkerDied:
                out.append(result(self.submit(fn, x)))
        return out

    def close(self) -> None:
        """Kill the workers now and fail what is pending; nothing waits for work in flight."""
        with shielded():  # it runs on the way out of a Ctrl-C: a second one must not cut it short
            self._close()

    def _close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            pending = [f for f, _, _ in self._queue]
            self._queue.clear()
        for w in self._workers:
            _kill(w.process)
        os.write(self._wake_w, b"x")
        self._thread.join(timeout=2)
        for w in self._workers:
            w.process.join(timeout=1)
            w.conn.close()
            if w.job is not None and not w.job.done():
                w.job.set_exception(WorkerDied("the run was stopped"))
        for f in pending:
            if not f.done():
                f.set_exception(WorkerDied("the run was stopped"))
        os.close(self._wake_r)
        os.close(self._wake_w)

    def __enter__(self) -> "Pool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ the reader thread
    def _run(self) -> None:
        try:
            self._serve_results()
        except BaseException as exc:  # never leave a caller waiting on a future nobody will set
            self._broken = exc
            with self._lock:
                pending = [f for f, _, _ in self._queue] + [w.job for w in self._workers if w.job is not None]
                self._queue.clear()
            for f in pending:
                if not f.done():
                    f.set_exception(RuntimeError(f"ampfix's worker pool failed: {type(exc).__name__}: {exc}"))

    def _serve_results(self) -> None:
        while True:
            with self._lock:
                if self._closed:
                    return
                for w in self._workers:
                    if w.job is None and self._queue:
                        fut, fn, arg = self._queue.pop(0)
                        if not fut.set_running_or_notify_cancel():
                            continue
                        try:
                            w.conn.send((fn, arg))
                        except Exception as exc:  # cannot be pickled, or the worker is gone
                            if w.process.is_alive():
                                fut.set_exception(exc)
                                continue
                            fut.set_exception(WorkerDied(f"worker ended: {exc}"))
                            continue
                        w.job = fut
                waits = [self._wake_r]
                for w in self._workers:
                    waits += [w.conn, w.process.sentinel]
            try:
                ready = wait(waits)
                if self._wake_r in ready:
                    os.read(self._wake_r, 4096)
            except OSError:
                if self._closed:  # close() shut the pipes under us
                    return
                raise  # else the pending jobs fail (in _run), rather than wait for ever
            with self._lock:
                if self._closed:
                    return
                for k, w in enumerate(self._workers):
                    if w.conn in ready or w.process.sentinel in ready:
                        self._collect(k, w)

    def _collect(self, k: int, w: _Worker) -> None:
        got = None
        if w.conn.poll():
            try:
                got = w.conn.recv()
            except (EOFError, OSError):
                got = None
            except Exception as exc:  # a result that does not unpickle: the job fails, the pool goes on
                got = ("err", _Failed(RuntimeError(f"a worker's result could not be read: {type(exc).__name__}: {exc}")))
        if got is not None and w.job is not None:
            status, value = got
            if status == "ok":
                w.job.set_result(value)
            else:
                w.job.set_exception(value.error())
            w.job = None
        if not w.process.is_alive():
            self._replace(k, w)

    def _replace(self, k: int, w: _Worker) -> None:
        w.process.join(timeout=1)
        code = w.process.exitcode
        if w.job is not None:
            why = f"signal {-code}" if code is not None and code < 0 else f"exit status {code}"
            w.job.set_exception(WorkerDied(f"the worker process died ({why})"))
            w.job = None
        w.conn.close()
        self._workers[k] = _Worker(self._ctx, self._parent)


def result(fut: Future) -> Any:
    """The future's result, waiting in short slices so that Ctrl-C is seen at once (at the end of
    a slice: a signal handled inside the future's wait would break its lock, see interrupts.py)."""
    while True:
        with shielded():
            try:
                return fut.result(timeout=0.2)
            except FutureTimeout:  # the builtin TimeoutError from Python 3.11 on
                pass


def _kill(process) -> None:
    try:
        if process.pid is not None and process.is_alive():
            os.kill(process.pid, signal.SIGKILL)
    except (OSError, ValueError, AssertionError):
        pass
