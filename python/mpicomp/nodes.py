"""Which ranks of a communicator share a node: the layout the collectives' two levels use
(exact inside a node, compressed between nodes), and that AMSP's planner and DiLoCo's
islands can follow instead of guessing their own."""
from typing import NamedTuple

from . import _comm, _core
from .errors import ArgumentError

__all__ = ["NodeLayout", "node_comms", "node_layout"]


class NodeLayout(NamedTuple):
    """node_of: each rank's node (numbered by their lowest rank); node and local: this rank's
    node and its index there; lanes: the smallest node's size; ranks_per_node: the
    ``config.ranks_per_node`` the layout was made with (0: the MPI library's nodes)."""

    node_of: tuple
    node: int
    local: int
    lanes: int
    ranks_per_node: int

    @property
    def nodes(self):
        return max(self.node_of) + 1

    @property
    def hierarchical(self):
        """More than one node, and some node with more than one rank: where two levels apply."""
        return self.nodes > 1 and len(self.node_of) > self.nodes

    @property
    def sizes(self):
        """Ranks per node, by node."""
        return tuple(self.node_of.count(n) for n in range(self.nodes))

    @property
    def block(self):
        """K when node i holds ranks i*K ... (i+1)*K - 1 for every i (nodes of equal size, ranks
        placed in blocks: what AMSP's groups assume), else None."""
        k = self.sizes[0]
        equal = len(set(self.sizes)) == 1
        return k if equal and self.node_of == tuple(r // k for r in range(len(self.node_of))) else None


def node_layout(comm):
    """The node layout of ``comm``. Collective on the communicator's first mpicomp use (as
    every mpicomp call is); fixed from then on. Raises ShapeMismatchError on every rank when
    the ranks' ``config.ranks_per_node`` differ."""
    node_of, node, local, lanes, rpn = _core.node_layout(_comm.private(comm))
    return NodeLayout(tuple(node_of), node, local, lanes, rpn)


def node_comms(comm):
    """(intra, inter): new communicators split from ``comm`` by its node layout. ``intra`` holds
    this rank's node (by rank), ``inter`` the ranks with this rank's index on every node (by
    node): the two levels of a hierarchical algorithm, or DiLoCo's islands
    (``DiLoCo(..., inner_comm=intra, comm=inter)``: exact averaging inside the node, outer
    gradients between nodes). Collective over ``comm``; free them when done.

    Raises:
        ArgumentError: on every rank, when the nodes differ in size (the ranks past the
            smallest node's size would have no peer there).
    """
    lay = node_layout(comm)
    if len(set(lay.sizes)) != 1:
        raise ArgumentError(f"node_comms: the nodes of this communicator differ in size ({lay.sizes}): every "
                            "rank needs a peer with its index on every node")
    return comm.Split(lay.node, comm.Get_rank()), comm.Split(lay.local, lay.node)
