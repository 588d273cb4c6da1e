"""torch Futures over mpicomp's requests that keep the error's type: ``Future.then`` hands a
callback's exception on as a RuntimeError ("Got the following error when running the
callback: ..."), which would turn a ShapeMismatchError or CommTimeoutError into an untyped
error. Here the original exception reaches whoever waits."""
import threading

import torch

__all__ = ["from_request", "then", "all_of"]


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
