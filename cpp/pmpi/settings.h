// Configuration of the interposer, read once from the environment at MPI_Init.
#pragma once
#include <cstddef>
#include <optional>
#include <string>
#include <utility>

#include "../codecs/format.h"
#include "../coll/config.h"
#include "../coll/handshake.h"

namespace mpicomp::pmpi {

struct Settings {
  std::optional<Spec> codec[5];  // per Coll (index = Coll value); empty: pass through
  bool adaptive[5] = {};         // per Coll: codec "auto", `codec` where it pays (coll/adaptive.h)
  size_t min_bytes = 64 * 1024;  // smaller calls pass through
  size_t segment_bytes = 1 << 19;
  size_t eager_bytes = Config{}.eager_bytes;  // Config::eager_bytes
  bool error_feedback = false;   // keyed by (communicator, receive buffer, count)
  bool stats = false;
  bool verbose = false;          // a line on rank 0 for each new reason a call is not compressed
  bool skip_local = false;       // pass through on communicators whose ranks share one node
  double timeout_s = 0;          // Config::timeout_s: 0, no limit
  size_t cache_bytes = size_t(128) << 20;  // Config::cache_bytes
  size_t residual_bytes = size_t(1) << 30;  // error feedback's residuals (residuals.h)
  Hierarchy hierarchy = Hierarchy::automatic;  // MPICOMP_HIERARCHY: auto or flat (config.h)
  size_t ranks_per_node = 0;     // MPICOMP_RANKS_PER_NODE: 0, the MPI library's nodes (topology.h)
  size_t codec_threads = 0;      // codec work's threads (codecs/parallel.h); 0: the default
  double auto_reprobe_s = 60;    // Config::auto_reprobe_s
  // Datatypes compressed, one bit per DType: by default the ones gradients come in; doubles
  // (norms, metrics, scientific fields) stay exact unless MPICOMP_DTYPES names them.
  unsigned dtypes = dtype_bit(DType::f32) | dtype_bit(DType::f16) | dtype_bit(DType::bf16);
  static constexpr unsigned dtype_bit(DType t) { return 1u << unsigned(t); }
};

// The MPICOMP_DTYPES names of the datatypes the interposer can compress, and their DTypes.
constexpr std::pair<const char*, DType> kDtypeNames[] = {
    {"float", DType::f32}, {"double", DType::f64}, {"float16", DType::f16}, {"bfloat16", DType::bf16}};

// Parses the MPICOMP_* variables. On an invalid value returns false and sets `error` to a
// message that names the variable and the value.
bool read_settings(Settings& s, std::string& error);

}  // namespace mpicomp::pmpi
