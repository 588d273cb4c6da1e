"""torch Futures over mpicomp's requests that keep the error's type: ``Future.then`` hands a
callback's exception on as a RuntimeError ("Got the following error when running the
callback: ..."), which would turn a ShapeMismatchError or CommTimeoutError into an untyped
error. Here the original exception reaches whoever waits, and the torch backend's Work
raises it."""
import datetime
import threading

import torch
import torch.distributed as dist

from ..errors import CommTimeoutError

__all__ = ["from_request", "then", "all_of", "Work", "all_works"]


def _settle(fut, fn, *args):
    try:
        fut.set_result(fn(*args))
    except Exception as e:  # noqa: BLE001 -- handed to whoever waits, with its type
        fut.set_exception(e)


def from_request(req, value):
    """A Future completed when the mpicomp Request ``req`` is: with ``value()``, run on the
    thread that completes it (mpicomp's worker), or with the request's error."""
    fut = torch.futures.Future()
    req.add_done_callback(lambda r: _settle(fut, lambda: (r.wait(), value())[1]))
    return fut


def then(fut, fn):
    """``fut.then(fn)`` on fut's value (not on fut), keeping the type of either's error."""
    out = torch.futures.Future()
    fut.add_done_callback(lambda f: _settle(out, lambda: fn(f.wait())))
    return out


def all_of(futures, value):
    """A Future completed when all of ``futures`` are: with ``value``, or with the error of
    the first of them (in order) that failed."""
    out = torch.futures.Future()
    left, lock = [len(futures)], threading.Lock()

    def one_done(_):
        with lock:
            left[0] -= 1
            if left[0]:
                return
        _settle(out, lambda: ([f.wait() for f in futures], value)[1])

    if not futures:
        out.set_result(value)
    for f in futures:
        f.add_done_callback(one_done)
    return out


class Work(dist.Work):
    """A torch Work over a torch Future whose ``wait()`` raises the operation's error (the
    Work of torch's ``_create_work_from_future`` reports success whatever the future holds),
    and gives up after ``timeout`` (a timedelta, as torch's ``work.wait(timeout)``) with
    CommTimeoutError, the operation still running.

    ``get_future()`` holds the error as a C++ one, a RuntimeError naming the class ("Got the
    following error when running the callback: CommTimeoutError: ..."): torch's C++ readers of
    the future (DDP's reducer without a comm hook) read a Python exception without the GIL
    and crash the process (torch 2.13). ``wait()`` raises the typed error, and ``fut`` is the
    future that holds it."""

    def __init__(self, fut):
        super().__init__()
        self.fut = fut
        self._cpp_fut = fut.then(lambda f: f.wait())

    def wait(self, timeout=None):
        seconds = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else 0
        if seconds > 0 and not self.fut.done():
            done = threading.Event()
            self.fut.add_done_callback(lambda _: done.set())
            if not done.wait(seconds):
                raise CommTimeoutError(f"mpicomp backend: work.wait: the operation has not completed after "
                                       f"{seconds:g} s (it goes on; the group's own timeout ends it)")
        self.fut.wait()
        return True

    def get_future(self):
        return self._cpp_fut

    def is_completed(self):
        return self.fut.done()


def all_works(works, result):
    """One Work for several started in order: done when all are, with ``result``, or with the
    error of the first that failed (each still runs: the ranks' sequences stay aligned)."""
    return Work(all_of([w.fut for w in works], result))
