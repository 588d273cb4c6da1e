"""A data x tensor x pipeline parallel mesh of MPI ranks.

Rank layout (Megatron-LM, Shoeybi et al. 2019, arXiv 1909.08053): tensor-parallel ranks are
adjacent, then data-parallel, then pipeline-parallel::

    rank = (pp_rank * dp + dp_rank) * tp + tp_rank

Tensor parallelism exchanges activations in every layer, so its ranks should share a node
(and, with MPI's usual block placement of ranks on nodes, they do); pipeline stages talk
least, once per micro-batch, so they may sit furthest apart.
"""

from mpi4py import MPI

from .. import _comm
from ..errors import ArgumentError

__all__ = ["Mesh"]

_DIMS = ("dp", "tp", "pp")


def _size(name, value):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ArgumentError(f"Mesh: {name} must be a positive int, got {value!r}")
    return value


class Mesh:
    """Sub-communicators of ``comm`` for data (dp), tensor (tp) and pipeline (pp) parallelism.

    Every rank of ``comm`` must construct the mesh with the same sizes (it splits ``comm``
    collectively). Sizes are checked on every rank before any communication, so a bad mesh
    raises the same ArgumentError everywhere instead of hanging.

    Args:
        dp: number of data-parallel replicas (gradients are averaged over ``mesh.dp``).
        tp: tensor-parallel group size (one layer's weights split over ``mesh.tp``).
        pp: number of pipeline stages (``mesh.pp`` links consecutive stages).
            Any of the three may be None: it is then the world size divided by the others
            (at most one None).
        comm: the mpi4py intra-communicator to split (default COMM_WORLD).

    Attributes:
        dp, tp, pp: mpi4py communicators of this rank's groups; in each, ranks are ordered by
            their coordinate (``mesh.tp.Get_rank() == mesh.tp_rank``).
        dp_size, tp_size, pp_size: the sizes.
        dp_rank, tp_rank, pp_rank: this rank's coordinates.
        comm: the communicator the mesh was built from.

    Raises:
        ArgumentError: a size is not a positive int, or dp * tp * pp != comm's size.
    """

    def __init__(self, dp=None, tp=1, pp=1, comm=MPI.COMM_WORLD):
        _comm.checked(comm, "Mesh", intra=True)
        world = comm.Get_size()
        sizes = {"dp": dp, "tp": tp, "pp": pp}
        missing = [k for k, v in sizes.items() if v is None]
        if len(missing) > 1:
            raise ArgumentError(f"Mesh: at most one of dp, tp, pp may be None, got {', '.join(missing)} None")
        known = 1
        for k, v in sizes.items():
            if v is not None:
                known *= _size(k, v)
        if missing:
            if world % known:
                raise ArgumentError(f"Mesh: {missing[0]}=None needs the world size {world} to be a multiple of "
                                    f"the other sizes' product {known} ({_describe(sizes)})")
            sizes[missing[0]] = world // known
        elif known != world:
            raise ArgumentError(f"Mesh: dp * tp * pp = {_describe(sizes)} = {known}, but comm has {world} ranks")
        self.comm = comm
        self.dp_size, self.tp_size, self.pp_size = sizes["dp"], sizes["tp"], sizes["pp"]
        rank = comm.Get_rank()
        self.tp_rank = rank % self.tp_size
        self.dp_rank = rank // self.tp_size % self.dp_size
        self.pp_rank = rank // (self.tp_size * self.dp_size)
        # Split's key orders each group by the coordinate along it; the color is the rank's
        # coordinates along the other two dimensions.
        self.tp = comm.Split(self.pp_rank * self.dp_size + self.dp_rank, self.tp_rank)
        self.dp = comm.Split(self.pp_rank * self.tp_size + self.tp_rank, self.dp_rank)
        self.pp = comm.Split(self.dp_rank * self.tp_size + self.tp_rank, self.pp_rank)
        self._torch_groups = None

    def rank_of(self, dp_rank=0, tp_rank=0, pp_rank=0):
        """The rank in ``comm`` at these coordinates."""
        coords = {"dp_rank": (dp_rank, self.dp_size), "tp_rank": (tp_rank, self.tp_size),
                  "pp_rank": (pp_rank, self.pp_size)}
        for name, (v, n) in coords.items():
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < n:
                raise ArgumentError(f"Mesh.rank_of: {name} must be in 0..{n - 1}, got {v!r}")
        return (pp_rank * self.dp_size + dp_rank) * self.tp_size + tp_rank

    def group_ranks(self, dim):
        """Ranks of ``comm`` in this rank's group along ``dim`` ("dp", "tp" or "pp"), in order."""
        _check_dim(dim)
        here = {"dp_rank": self.dp_rank, "tp_rank": self.tp_rank, "pp_rank": self.pp_rank}
        out = []
        for i in range(getattr(self, f"{dim}_size")):
            here[f"{dim}_rank"] = i
            out.append(self.rank_of(**here))
        return out

    def torch_group(self, dim):
        """The torch.distributed process group of this rank's group along ``dim``, with the
        same ranks in the same order as ``getattr(mesh, dim)``.

        torch.distributed must be initialised with the same processes as ``comm`` (same
        size, same rank numbers). The first call creates the groups of all three dimensions
        and is collective: every rank must make it.

        Raises:
            ArgumentError: torch.distributed is not initialised, or its ranks differ from comm's.
        """
        _check_dim(dim)
        if self._torch_groups is None:
            self._torch_groups = self._make_torch_groups()
        return self._torch_groups[dim]

    def _make_torch_groups(self):
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            raise ArgumentError("Mesh.torch_group: torch.distributed is not initialised; call "
                                "torch.distributed.init_process_group first (or use the mpi4py groups)")
        size, rank = dist.get_world_size(), dist.get_rank()
        if (size, rank) != (self.comm.Get_size(), self.comm.Get_rank()):
            raise ArgumentError(f"Mesh.torch_group: torch.distributed has rank {rank} of {size}, but the mesh's "
                                f"comm has rank {self.comm.Get_rank()} of {self.comm.Get_size()}")
        groups = {}
        for dim in _DIMS:
            # new_group is collective over the whole world: every rank creates every group,
            # in the same order, and keeps its own.
            others = [d for d in _DIMS if d != dim]
            for a in range(getattr(self, f"{others[0]}_size")):
                for b in range(getattr(self, f"{others[1]}_size")):
                    coords = {f"{others[0]}_rank": a, f"{others[1]}_rank": b}
                    ranks = [self.rank_of(**coords, **{f"{dim}_rank": i}) for i in range(getattr(self, f"{dim}_size"))]
                    g = dist.new_group(ranks)
                    if self.comm.Get_rank() in ranks:
                        groups[dim] = g
        return groups

    def __repr__(self):
        return (f"Mesh(dp={self.dp_size}, tp={self.tp_size}, pp={self.pp_size}; rank {self.comm.Get_rank()} at "
                f"dp_rank={self.dp_rank}, tp_rank={self.tp_rank}, pp_rank={self.pp_rank})")


def _check_dim(dim):
    if dim not in _DIMS:
        raise ArgumentError(f"Mesh: dim must be one of 'dp', 'tp', 'pp', got {dim!r}")


def _describe(sizes):
    return " x ".join(f"{k}={'None' if v is None else v}" for k, v in sizes.items())
