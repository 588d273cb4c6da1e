// Configuration of the interposer, read once from the environment at MPI_Init.
#pragma once
#include <cstddef>
#include <optional>
#include <string>

#include "../codecs/format.h"
#include "../coll/handshake.h"

namespace mpicomp::pmpi {

struct Settings {
  std::optional<Spec> codec[5];  // per Coll (index = Coll value); empty: pass through
  size_t min_bytes = 64 * 1024;  // smaller calls pass through
  size_t segment_bytes = 1 << 20;
  bool error_feedback = false;   // keyed by (communicator, receive buffer, count)
  bool stats = false;
  bool verbose = false;          // a line on rank 0 for each new reason a call is not compressed
  bool skip_local = false;       // pass through on communicators whose ranks share one node
};

// Parses the MPICOMP_* variables. On an invalid value returns false and sets `error` to a
// message that names the variable and the value.
bool read_settings(Settings& s, std::string& error);

}  // namespace mpicomp::pmpi
