"""Which ranks of a communicator share a node: the layout the collectives' two levels use
(exact inside a node, compressed between nodes), and that AMSP's planner and DiLoCo's
islands can follow instead of guessing their own."""
from typing import NamedTuple

from . import _comm, _core

__all__ = ["NodeLayout", "node_layout"]


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


def node_layout(comm):
    """The node layout of ``comm``. Collective on the communicator's first mpicomp use (as
    every mpicomp call is); fixed from then on. Raises ShapeMismatchError on every rank when
    the ranks' ``config.ranks_per_node`` differ."""
    node_of, node, local, lanes, rpn = _core.node_layout(_comm.private(comm))
    return NodeLayout(tuple(node_of), node, local, lanes, rpn)
