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


def init_process_group(comm=None, backend="gloo", timeout=datetime.timedelta(minutes=5)):
    """``torch.distributed.init_process_group`` with ``comm``'s ranks (default COMM_WORLD):
    torch rank i is ``comm`` rank i. Collective over ``comm``.

    Args:
        comm: an mpi4py communicator; every one of its processes must call this.
        backend: ``"gloo"`` (CPU tensors) or ``"nccl"`` (CUDA tensors).
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
    rank, size = comm.Get_rank(), comm.Get_size()
    addr = _master_addr(comm)
    store = port = None
    if rank == 0:
        store = dist.TCPStore(addr, 0, size, is_master=True,
                              wait_for_workers=False, timeout=timeout)
        port = store.port
    port = comm.bcast(port, root=0)
    if rank != 0:
        store = dist.TCPStore(addr, port, size, is_master=False, timeout=timeout)
    dist.init_process_group(backend, store=store, rank=rank, world_size=size, timeout=timeout)
    return dist
