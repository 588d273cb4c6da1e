#include "topology.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <map>
#include <memory>

#include "coll.h"
#include "config.h"
#include "mpi_util.h"

namespace mpicomp {
namespace {

int free_layout(MPI_Comm, int, void* value, void*) {
  auto* L = static_cast<NodeLayout*>(value);
  if (L->intra != MPI_COMM_NULL) PMPI_Comm_free(&L->intra);
  if (L->inter != MPI_COMM_NULL) PMPI_Comm_free(&L->inter);
  delete L;
  return MPI_SUCCESS;
}

// This rank's node key: the lowest world rank on its node. Every rank of comm computes its
// own, so a sub-communicator's nodes are its members' nodes in the world.
int node_key(MPI_Comm comm, size_t ranks_per_node) {
  int world_rank = 0;
  mpi_check(PMPI_Comm_rank(MPI_COMM_WORLD, &world_rank), "MPI_Comm_rank");
  if (ranks_per_node) return int(size_t(world_rank) / ranks_per_node * ranks_per_node);
  MPI_Comm shm;
  mpi_check(PMPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &shm), "MPI_Comm_split_type");
  int key = world_rank;
  int rc = PMPI_Allreduce(&world_rank, &key, 1, MPI_INT, MPI_MIN, shm);
  PMPI_Comm_free(&shm);
  mpi_check(rc, "MPI_Allreduce");
  return key;
}

void announce(const NodeLayout& L, MPI_Comm comm) {
  static std::atomic<bool> said{false};  // layouts of two threads' communicators may be made at once
  int rank = 0;
  PMPI_Comm_rank(comm, &rank);
  // One node is what every single-machine run has: nothing to tell.
  if (!config().verbose || rank != 0 || L.nodes == 1 || said.exchange(true)) return;
  std::fprintf(stderr, "mpicomp: %zu ranks on %s (%s; %s)\n", L.node_of.size(), L.describe().c_str(),
               L.ranks_per_node ? ("ranks_per_node = " + std::to_string(L.ranks_per_node)).c_str()
                                : "nodes from MPI_Comm_split_type",
               L.hierarchical() ? "two-level collectives apply" : "one level");
  std::fflush(stderr);
}

}  // namespace

std::string NodeLayout::describe() const {
  std::string s = std::to_string(nodes) + (nodes == 1 ? " node: " : " nodes: ");
  for (int n = 0; n < nodes; ++n) s += (n ? "+" : "") + std::to_string(node_size[n]);
  return s + " ranks";
}

const NodeLayout& node_layout(MPI_Comm comm) {
  static Keyval key(free_layout);
  const int keyval = key.get();
  void* value = nullptr;
  int found = 0;
  mpi_check(PMPI_Comm_get_attr(comm, keyval, &value, &found), "MPI_Comm_get_attr");
  if (found) return *static_cast<const NodeLayout*>(value);

  // Every rank's (node key, ranks_per_node), so that all ranks see the same table and decide
  // alike: a disagreement raises on every rank, after the one exchange all of them make.
  const size_t rpn = config().ranks_per_node;
  int size = 0, rank = 0;
  PMPI_Comm_size(comm, &size);
  PMPI_Comm_rank(comm, &rank);
  long long mine[2] = {node_key(comm, rpn), (long long)rpn};
  std::vector<long long> all(2 * size_t(size));
  mpi_check(PMPI_Allgather(mine, 2, MPI_LONG_LONG, all.data(), 2, MPI_LONG_LONG, comm), "MPI_Allgather");
  for (int j = 0; j < size; ++j)
    if (all[2 * j + 1] != all[1])
      throw Error(ErrorKind::shape_mismatch,
                  "ranks disagree on ranks_per_node (mpicomp.config.ranks_per_node, MPICOMP_RANKS_PER_NODE): rank 0 has " + std::to_string(all[1]) + ", rank " + std::to_string(j) +
                      " has " + std::to_string(all[2 * j + 1]) + "; the node layout must be the same on every rank");

  auto L = std::make_unique<NodeLayout>();
  L->ranks_per_node = rpn;
  std::map<long long, int> index;  // node key -> node, numbered by their first rank
  L->node_of.resize(size);
  for (int j = 0; j < size; ++j) {
    auto [it, fresh] = index.emplace(all[2 * j], int(index.size()));
    if (fresh) L->node_size.push_back(0);
    L->node_of[j] = it->second;
    if (j == rank) L->local = L->node_size[it->second];
    ++L->node_size[it->second];
  }
  L->nodes = int(index.size());
  L->node_first.assign(L->nodes + 1, 0);
  for (int n = 0; n < L->nodes; ++n) L->node_first[n + 1] = L->node_first[n] + L->node_size[n];
  std::vector<int> next(L->node_first.begin(), L->node_first.end() - 1);
  L->order.resize(size);
  for (int j = 0; j < size; ++j) {
    const int at = next[L->node_of[j]]++;
    L->order[at] = j;
    L->node_ordered = L->node_ordered && at == j;
  }
  L->node = L->node_of[rank];
  L->lanes = *std::min_element(L->node_size.begin(), L->node_size.end());
  mpi_check(PMPI_Comm_split(comm, L->node, rank, &L->intra), "MPI_Comm_split");
  mpi_check(PMPI_Comm_split(comm, L->local < L->lanes ? L->local : MPI_UNDEFINED, L->node, &L->inter),
            "MPI_Comm_split");
  for (MPI_Comm c : {L->intra, L->inter})
    if (c != MPI_COMM_NULL) PMPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN);
  announce(*L, comm);
  mpi_check(PMPI_Comm_set_attr(comm, keyval, L.get()), "MPI_Comm_set_attr");
  return *L.release();
}

bool node_local(MPI_Comm comm) { return node_layout(comm).nodes == 1; }

}  // namespace mpicomp
