#include "environment.h"

#include <algorithm>
#include <cstring>
#include <string_view>

extern char** environ;

namespace mpicomp {
namespace {

// README's settings table, docs/interposer.md and docs/benchmarks.md document each.
constexpr std::string_view kKnown[] = {
    // codecs (interposer, torch backend)
    "MPICOMP_CODEC", "MPICOMP_ALLREDUCE_CODEC", "MPICOMP_REDUCE_SCATTER_CODEC", "MPICOMP_ALLGATHER_CODEC",
    "MPICOMP_DTYPES", "MPICOMP_ERROR_FEEDBACK", "MPICOMP_RESIDUAL_BYTES",
    // mpicomp.config (and the interposer's counterparts)
    "MPICOMP_MIN_BYTES", "MPICOMP_EAGER_BYTES", "MPICOMP_SEGMENT_BYTES", "MPICOMP_CACHE_BYTES",
    "MPICOMP_CODEC_THREADS", "MPICOMP_RANKS_PER_NODE", "MPICOMP_HIERARCHY", "MPICOMP_TIMEOUT", "MPICOMP_SKIP_LOCAL",
    "MPICOMP_VERBOSE", "MPICOMP_STATS",
    // refused with its own message (renamed)
    "MPICOMP_COMPRESS_LOCAL",
    // GPU codecs, benchmarks and the emulated network
    "MPICOMP_NVCOMP_LIBRARY", "MPICOMP_BENCH_CORRUPT", "MPICOMP_NETEM", "MPICOMP_NETEM_ADDR",
};

}  // namespace

std::vector<std::string> unknown_environment() {
  std::vector<std::string> out;
  for (char** e = environ; e && *e; ++e) {
    const std::string_view entry(*e);
    if (entry.rfind("MPICOMP_", 0) != 0) continue;
    const std::string_view name = entry.substr(0, entry.find('='));
    if (std::find(std::begin(kKnown), std::end(kKnown), name) == std::end(kKnown)) out.emplace_back(name);
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace mpicomp
