"""DiLoCo's state and checkpoints (the methods of mpicomp.optim.DiLoCo live here).

A checkpoint is one file written by rank 0 (``torch.save`` to a temporary file in the same
directory, then ``os.replace``: a reader sees the old file or the new one, never half of
one). It holds what all workers share (global parameters, outer optimizer state, step count,
the caller's data position, the configuration and parameter shapes) and, in ``workers``,
each worker's own state (inner optimizer state and error-feedback residuals), in the order
of the workers' ranks in ``comm``. Loaded by a different number of workers, worker i takes
``workers[i]`` if there is one, and starts its inner state fresh otherwise, as a worker
joining DiLoCo does in the paper; surplus saved workers are dropped.
"""

import os

import torch

from ..errors import ArgumentError, CheckpointError
from .._agree import agree

__all__ = ["FORMAT", "state_dict", "load_state_dict", "save", "load"]

FORMAT = "mpicomp.DiLoCo/2"  # /2: fragments are equal element ranges
_PLAIN = (type(None), bool, int, float, str)


def _common(opt):
    return {"format": FORMAT, "config": opt._config(),
            "global": [g.detach().clone() for g in opt.global_params],
            "outer": opt.outer_optimizer.state_dict(), "inner_step": opt.inner_step,
            "outer_steps": opt.outer_steps}


def _worker(opt):
    return {"optimizer": opt.inner_optimizer.state_dict(),
            "residuals": [None if ef is None or ef.residual is None else ef.residual.clone() for ef in opt.feedback]}


def state_dict(opt):
    return dict(_common(opt), worker=_worker(opt))


def _check(opt, ckpt, who, where):
    """Raises CheckpointError when ckpt cannot be loaded into opt."""
    if not isinstance(ckpt, dict) or ckpt.get("format") != FORMAT:
        raise CheckpointError(f"{who}: {where} is not a DiLoCo checkpoint (no {FORMAT!r} format tag)")
    saved, mine = ckpt["config"], opt._config()
    if len(saved["shapes"]) != len(mine["shapes"]):
        raise CheckpointError(f"{who}: {where} is of another model: {len(saved['shapes'])} parameter tensors, "
                              f"this model has {len(mine['shapes'])}")
    for i, (a, b, da, db) in enumerate(zip(saved["shapes"], mine["shapes"], saved["dtypes"], mine["dtypes"])):
        if tuple(a) != tuple(b) or da != db:
            raise CheckpointError(f"{who}: {where} is of another model: parameter {i} is {tuple(a)} {da} there, "
                                  f"{tuple(b)} {db} here")
    for key in ("sync_every", "fragments", "codec", "error_feedback"):
        if saved[key] != mine[key]:
            raise CheckpointError(f"{who}: {where} was written with {key}={saved[key]!r}, this DiLoCo has "
                                  f"{key}={mine[key]!r}")


def _check_worker(opt, worker, who, where):
    if worker is None:
        return
    groups = worker["optimizer"]["param_groups"]
    mine = opt.inner_optimizer.param_groups
    if [len(g["params"]) for g in groups] != [len(g["params"]) for g in mine]:
        raise CheckpointError(f"{who}: {where}: the inner optimizer there has parameter groups of sizes "
                              f"{[len(g['params']) for g in groups]}, this one {[len(g['params']) for g in mine]}")


def _apply(opt, common, worker):
    with torch.no_grad():
        for g, saved in zip(opt.global_params, common["global"]):
            g.copy_(saved)
    opt.outer_optimizer.load_state_dict(common["outer"])
    opt.inner_step, opt.outer_steps = common["inner_step"], common["outer_steps"]
    if worker is None:  # a worker that joins: fresh inner state (the paper's model of joining)
        opt.inner_optimizer.state.clear()
        residuals = [None] * len(opt.feedback)
    else:
        opt.inner_optimizer.load_state_dict(worker["optimizer"])
        residuals = worker["residuals"]
    for ef, r in zip(opt.feedback, residuals):
        if ef is not None:
            ef.residual = None if r is None else r.clone()
    for f in range(opt.fragments):
        opt._set_local(f)
    opt._failed = None
    opt._pending = "inner" if opt.inner_comm is not None else "outer"


def load_state_dict(opt, state):
    """Collective, as in the other optimizers: a state one rank cannot load, or states of
    different steps, raise on every rank before any rank changes."""
    who, error = "DiLoCo.load_state_dict", None
    try:
        _check(opt, state, who, "the state")
        _check_worker(opt, state.get("worker"), who, "the state")
    except CheckpointError as e:
        error = e
    agree(opt._comms, who, error, None if error else {"inner_step": state.get("inner_step")})
    _apply(opt, state, state.get("worker"))


def _plain(value):
    """What torch.load(weights_only=True) reads back: numbers, strings, lists, dicts."""
    if isinstance(value, (list, tuple)):
        return all(_plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, _PLAIN) and _plain(v) for k, v in value.items())
    return isinstance(value, _PLAIN)


def _root_group(opt):
    """True on the ranks that exchange with rank 0 of comm (one per island)."""
    return opt.inner_comm is None or opt.inner_comm.Get_rank() == 0


def save(opt, path, data_position):
    who = "DiLoCo.save"
    error = None
    if not isinstance(path, (str, os.PathLike)):
        error = ArgumentError(f"{who}: path must be a str or os.PathLike, got {path!r}")
    elif not _plain(data_position):
        error = ArgumentError(f"{who}: data_position must be built of numbers, strings, lists and dicts, got "
                              f"{type(data_position).__name__}")
    agree(opt._comms, who, error, opt._signature())
    workers = opt._workers.gather(_worker(opt), root=0) if _root_group(opt) else None
    if workers is not None:
        error = None
        try:
            _write(path, dict(_common(opt), data_position=data_position, workers=workers,
                              layout="workers[i]: inner state of rank i of comm (island i)"))
        except OSError as e:
            error = ArgumentError(f"{who}: cannot write {os.fspath(path)!r}: {e}")
    agree(opt._comms, who, error)


def _write(path, obj):
    path = os.fspath(path)
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def _read(opt, path, who):
    """On rank 0 of comm's root group: (checkpoint without workers, workers, None) or
    (None, [], error)."""
    where = repr(os.fspath(path)) if isinstance(path, (str, os.PathLike)) else repr(path)
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        return None, [], CheckpointError(f"{who}: no checkpoint at {where}")
    except Exception as e:  # torch reports truncation as RuntimeError, garbage as UnpicklingError...
        return None, [], CheckpointError(f"{who}: {where} is not a readable checkpoint (truncated or corrupt?): "
                                         f"{type(e).__name__}: {e}")
    try:
        _check(opt, ckpt, who, where)
    except CheckpointError as e:
        return None, [], e
    except (KeyError, TypeError) as e:
        return None, [], CheckpointError(f"{who}: {where} is not a DiLoCo checkpoint of this version ({e!r})")
    return ckpt, ckpt.pop("workers"), None


def load(opt, path):
    who = "DiLoCo.load"
    common = worker = error = None
    if _root_group(opt):
        comm = opt._workers
        if comm.Get_rank() == 0:
            common, workers, error = _read(opt, path, who)
            slices = [workers[i] if i < len(workers) else None for i in range(comm.Get_size())]
        else:
            slices = None
        common = comm.bcast(common, root=0)
        worker = comm.scatter(slices, root=0)
    if opt.inner_comm is not None:
        common, worker = opt._island.bcast((common, worker), root=0)
    if common is not None and error is None:
        try:
            _check_worker(opt, worker, who, repr(os.fspath(path)))
        except CheckpointError as e:
            error = e
    agree(opt._comms, who, error)  # rank 0's read error reaches every rank here
    _apply(opt, common, worker)
    return common.get("data_position")
