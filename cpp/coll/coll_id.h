// The collectives mpicomp runs, as every layer names them (agreement, statistics, the
// bindings' COLL_IDS, the interposer).
#pragma once
#include <cstdint>

namespace mpicomp {

enum class Coll : uint8_t { allreduce = 1, reduce_scatter = 2, allgather = 3, send = 4 };

inline const char* coll_name(Coll c) {
  switch (c) {
    case Coll::allreduce: return "allreduce";
    case Coll::reduce_scatter: return "reduce_scatter";
    case Coll::allgather: return "allgather";
    default: return "send/recv";
  }
}

}  // namespace mpicomp
