"""torch.distributed set up from an MPI communicator, without a port to agree on.

The usual recipe (rank 0 binds a socket to port 0, reads the port, closes the socket and
broadcasts the number) races: between the close and TCPStore's own bind another process can
take the port, and rank 0 fails with EADDRINUSE. Here rank 0 starts the TCPStore itself on
port 0, so the kernel hands it a port it already holds, and MPI broadcasts that port.
"""
import datetime
import os
import socket

from ..errors import ArgumentError


def _master_addr(comm):
    """Where the other ranks reach rank 0's store: MASTER_ADDR if the user set it; the link
    address bench/netem --per-rank gives each rank; loopback when all ranks share a node;
    otherwise rank 0's host name."""
    from mpi4py import MPI

    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    one_node = node.Get_size() == comm.Get_size()  # the same answer on every rank
    node.Free()
    addr = None
    if comm.Get_rank() == 0:
        addr = (os.environ.get("MASTER_ADDR") or os.environ.get("MPICOMP_NETEM_ADDR")
                or ("127.0.0.1" if one_node else socket.getfqdn()))
    return comm.bcast(addr, root=0)


def mpi_store(comm, timeout):
    """A TCPStore served by comm's rank 0, which every rank of comm reaches (collective)."""
    import torch.distributed as dist

    addr = _master_addr(comm)
    store = port = None
    if comm.Get_rank() == 0:
        store = dist.TCPStore(addr, 0, comm.Get_size(), is_master=True, wait_for_workers=False, timeout=timeout)
        port = store.port
    port = comm.bcast(port, root=0)
    if comm.Get_rank() != 0:
        store = dist.TCPStore(addr, port, comm.Get_size(), is_master=False, timeout=timeout)
    return store


def init_process_group(comm=None, backend="gloo", timeout=datetime.timedelta(minutes=30)):
    """``torch.distributed.init_process_group`` with ``comm``'s ranks (default COMM_WORLD):
    torch rank i is ``comm`` rank i. Collective over ``comm``.

    Args:
        comm: an mpi4py communicator; every one of its processes must call this.
        backend: ``"gloo"`` (CPU tensors), ``"nccl"`` (CUDA tensors) or ``"mpicomp"``.
        timeout: how long a rank waits for the others, in the store and in the backend.

    Returns:
        the ``torch.distributed`` module, initialised.

    Raises:
        ArgumentError: torch.distributed is already initialised.
    """
    import torch.distributed as dist
    from mpi4py import MPI

    comm = MPI.COMM_WORLD if comm is None else comm
    if comm.allreduce(dist.is_initialized(), op=MPI.LOR):
        raise ArgumentError("init_process_group: torch.distributed is already initialised on some rank")
    store = mpi_store(comm, timeout)
    dist.init_process_group(backend, store=store, rank=comm.Get_rank(), world_size=comm.Get_size(), timeout=timeout)
    return dist


_for_every_backend = False


def _initialising_mpicomp():
    """Whether the env:// rendezvous running now is one of init_process_group("mpicomp"):
    torch's handler sees no backend, so it is read from init_process_group's frame."""
    import sys

    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if code.co_name == "init_process_group" and code.co_filename.endswith("distributed_c10d.py"):
            return "mpicomp" in str(frame.f_locals.get("backend", "")).lower()
        frame = frame.f_back
    return False


def install_rendezvous():
    """Wraps torch's ``env://`` handler (``init_process_group``'s default) so that
    ``init_process_group("mpicomp")`` needs no MASTER_ADDR, MASTER_PORT, RANK or WORLD_SIZE,
    under mpiexec or started alone (one rank): where MASTER_ADDR is unset, the store comes
    from :func:`mpi_store` and rank and size from MPI. Every other rendezvous
    (other backends, unless :func:`rendezvous_from_mpi` was called; MASTER_ADDR set) is
    torch's own handler's, unchanged. torch has no public way to replace a scheme's handler,
    so this wraps the one in its registry. Called when the backend is registered."""
    import sys

    import torch.distributed  # noqa: F401 -- loads torch.distributed.rendezvous

    registry = sys.modules["torch.distributed.rendezvous"]._rendezvous_handlers
    torch_env = registry["env"]
    if getattr(torch_env, "mpicomp", False):
        return

    def env_or_mpi(url, timeout=datetime.timedelta(minutes=30), **kwargs):
        from mpi4py import MPI

        world = MPI.COMM_WORLD
        ours = _for_every_backend or _initialising_mpicomp()
        if not ours or os.environ.get("MASTER_ADDR"):
            yield from torch_env(url, timeout, **kwargs)
            return
        yield mpi_store(world, timeout), world.Get_rank(), world.Get_size()
        raise RuntimeError("mpicomp: env:// from MPI cannot rendezvous again")

    env_or_mpi.mpicomp = True
    registry["env"] = env_or_mpi


def rendezvous_from_mpi():
    """Makes every backend's ``env://`` rendezvous (gloo's, nccl's) take rank, size and store
    from MPI under mpiexec when MASTER_ADDR is unset, as ``init_process_group("mpicomp")``
    always does: the one explicit line a plain script adds to run with gloo under mpiexec."""
    global _for_every_backend
    install_rendezvous()
    _for_every_backend = True
