"""One rank of a fault test: `mpiexec -n N python program.py CASE KIND VICTIM REPORTS`. Every rank
trains a few steps of CASE; then rank VICTIM arms a fault of KIND (tests/faults/inject.py) to strike
halfway through its next step, and every other rank writes what its steps raised to
REPORTS/rank<r>.json and leaves at once (os._exit: MPI_Finalize could wait for the lost rank).

CASE is an optimizer of tests/optim/_cases.py, "ddp" (DistributedDataParallel over an "mpicomp"
group), "interposed" (mpi4py's Allreduce under the LD_PRELOAD library, which the test sets,
as are MPICOMP_TIMEOUT and MPICOMP_CODEC) or "auto" (codec auto measuring a communicator)."""
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "optim")]

from inject import SHELTERED, arm, sheltered  # noqa: E402

if __name__ == "__main__" and SHELTERED not in os.environ:
    sys.exit(sheltered(sys.argv))
from mpi4py import MPI  # noqa: E402

WORLD = MPI.COMM_WORLD
RANK = WORLD.Get_rank()


def interposed():
    import numpy as np

    comm = WORLD.Dup()
    comm.Set_errhandler(MPI.ERRORS_RETURN)
    x = np.ones(1 << 20, np.float32)
    y = np.empty_like(x)
    return lambda step: comm.Allreduce(x, y)


def auto():
    """Each step is a communicator's first call with codec "auto", after which its ranks time
    the collective both ways (cpp/coll/adaptive.cpp): the measurement is most of the step, so
    the fault strikes in it."""
    import numpy as np

    import mpicomp

    x = np.ones(1 << 16, np.float32)
    comms = [WORLD.Dup() for _ in range(8)]  # the fault strikes in step 3
    for c in comms:  # their private duplicates made here, by MPI's own untimed MPI_Comm_dup, not in a step
        mpicomp.allreduce(x, comm=c, codec="none")
    return lambda step: mpicomp.allreduce(x, comm=comms[step], codec="auto")


def ddp():
    import datetime

    import torch

    import mpicomp.torch as mt

    mt.init_process_group(WORLD, "mpicomp", timeout=datetime.timedelta(seconds=float(os.environ["MPICOMP_TIMEOUT"])))
    model = torch.nn.parallel.DistributedDataParallel(_model())
    x = torch.randn(8, 6)

    def step(i):
        model.zero_grad()
        model(x).square().mean().backward()
    return step


def optimizer(case):
    from _cases import CASES

    make, step = CASES[case]
    model = _model()
    opt = make(model, WORLD.Dup())
    return lambda i: step(opt, model, RANK, i)


def _model():
    """Wide enough that a step's collectives take milliseconds: the fault strikes inside them."""
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 1 << 15), torch.nn.Tanh(), torch.nn.Linear(1 << 15, 3))


def main(case, kind, victim, reports):
    from mpicomp import MpicompError

    step = {"interposed": interposed, "ddp": ddp, "auto": auto}.get(case, lambda: optimizer(case))()
    took = []
    for i in range(3):
        t0 = time.perf_counter()
        step(i)
        took.append(time.perf_counter() - t0)
    WORLD.Barrier()
    if RANK == int(victim):  # halfway through a step as long as the quickest so far (the first ones set up)
        arm(kind, min(took) / 2)
    t0 = time.perf_counter()
    try:
        for i in range(3, 1000):  # the fault strikes in the first; DiLoCo with overlap fails a step late
            step(i)
        raised = None
    except Exception as e:  # what a survivor raises is the result
        raised = e
    report = {"rank": RANK, "waited": time.perf_counter() - t0, "victim": RANK == int(victim),
              "error": None if raised is None else f"{type(raised).__module__}.{type(raised).__qualname__}",
              "message": str(raised)[:500]}
    report["mpicomp_error"] = isinstance(raised, MpicompError)
    if isinstance(raised, MPI.Exception):
        report["mpi_err_other"] = raised.Get_error_class() == MPI.ERR_OTHER
    (Path(reports) / f"rank{RANK}.json").write_text(json.dumps(report))
    os._exit(0)


if __name__ == "__main__":
    main(*sys.argv[1:])
