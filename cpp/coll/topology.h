// Which ranks of a communicator share a node, and the two communicators a two-level
// collective runs on: `intra` (this rank's node) and `inter` (the ranks with this rank's
// index on their node, one per node). Nodes come from MPI_Comm_split_type(SHARED) or, with
// Config::ranks_per_node = K, from blocks of K consecutive ranks of MPI_COMM_WORLD (emulated
// nodes, launchers that place ranks in blocks; under MPIR_CVAR_NOLOCAL MPICH reports every
// rank as a node of its own). A sub-communicator's layout follows its members' world ranks.
#pragma once
#include <mpi.h>

#include <string>
#include <vector>

namespace mpicomp {

struct NodeLayout {
  int nodes = 1;               // nodes the communicator spans
  std::vector<int> node_of;    // per rank of the communicator: its node, 0 .. nodes-1 by first rank
  std::vector<int> node_size;  // per node: its ranks
  int node = 0, local = 0;     // this rank's node and its index among that node's ranks
  int lanes = 1;               // the smallest node's size: ranks with local < lanes move data between nodes
  // Node order (node 0's ranks, then node 1's, ..., each node's in rank order): the ranks in
  // it, and where each node's start (and one past the last); node_ordered: it is rank order.
  std::vector<int> order, node_first;
  bool node_ordered = true;
  // The j-th rank of node m.
  int rank_at(int m, int j) const { return order[size_t(node_first[size_t(m)] + j)]; }
  size_t ranks_per_node = 0;   // Config::ranks_per_node it was made with (0: the MPI library's nodes)
  MPI_Comm intra = MPI_COMM_NULL;  // this node's ranks, by rank
  MPI_Comm inter = MPI_COMM_NULL;  // ranks with index `local` on each node, by node; null for local >= lanes
  // More than one node, and some node with more than one rank: where two levels apply.
  bool hierarchical() const { return nodes > 1 && int(node_of.size()) > nodes; }
  // "2 nodes: 2+2 ranks" for messages and MPICOMP_VERBOSE.
  std::string describe() const;
};

// The layout of comm, made on the communicator's first use (a collective: every rank of comm
// reaches it at the start of the same mpicomp call) with the ranks_per_node in force then,
// and cached with the communicator after. Ranks whose ranks_per_node differ, or a
// ranks_per_node that is not a valid layout, raise ShapeMismatchError / an argument Error
// on every rank; the communicator stays usable.
const NodeLayout& node_layout(MPI_Comm comm);

}  // namespace mpicomp
