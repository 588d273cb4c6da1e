#include "environment.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <limits>
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

bool parse_size(const std::string& text, size_t& out) {
  size_t i = 0, n = 0;
  if (text.empty() || !std::isdigit(static_cast<unsigned char>(text[0]))) return false;
  for (; i < text.size() && std::isdigit(static_cast<unsigned char>(text[i])); ++i) {
    const size_t d = size_t(text[i] - '0');
    if (n > (std::numeric_limits<size_t>::max() - d) / 10) return false;
    n = n * 10 + d;
  }
  std::string unit = text.substr(i);
  for (char& c : unit) c = char(std::toupper(static_cast<unsigned char>(c)));
  int shift = 0;
  if (!unit.empty() && (unit[0] == 'K' || unit[0] == 'M' || unit[0] == 'G')) {
    shift = unit[0] == 'K' ? 10 : unit[0] == 'M' ? 20 : 30;
    unit.erase(0, 1);
  }
  if (!(unit.empty() || unit == "B" || (shift && unit == "IB"))) return false;
  if (n > (std::numeric_limits<size_t>::max() >> shift)) return false;
  out = n << shift;
  return true;
}

}  // namespace mpicomp
