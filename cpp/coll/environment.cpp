#include "environment.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
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
    "MPICOMP_MIN_BYTES", "MPICOMP_EAGER_BYTES", "MPICOMP_SEGMENT_BYTES", "MPICOMP_GPU_SEGMENT_BYTES",
    "MPICOMP_CACHE_BYTES",
    "MPICOMP_CODEC_THREADS", "MPICOMP_RANKS_PER_NODE", "MPICOMP_HIERARCHY", "MPICOMP_TIMEOUT", "MPICOMP_AUTO_REPROBE",
    "MPICOMP_SKIP_LOCAL",
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

const std::vector<SettingRule>& setting_rules() {
  using K = SettingKind;
  static const std::vector<SettingRule> rules = {
      {"min_bytes", "MPICOMP_MIN_BYTES", K::bytes, 0, 0x1p62},
      {"eager_bytes", "MPICOMP_EAGER_BYTES", K::bytes, 0, 0x1p30},
      {"segment_bytes", "MPICOMP_SEGMENT_BYTES", K::bytes, 1024, 0x1p31},  // 0 would divide by zero
      {"gpu_segment_bytes", "MPICOMP_GPU_SEGMENT_BYTES", K::bytes, 1024, 0x1p31},
      {"cache_bytes", "MPICOMP_CACHE_BYTES", K::bytes, 0, 0x1p62},
      {"residual_bytes", "MPICOMP_RESIDUAL_BYTES", K::bytes, 0, 0x1p62},
      {"codec_threads", "MPICOMP_CODEC_THREADS", K::count, 0, 1024},
      {"ranks_per_node", "MPICOMP_RANKS_PER_NODE", K::count, 0, 0x1p24},
      {"hierarchy", "MPICOMP_HIERARCHY", K::hierarchy, 0, 1},
      {"timeout_s", "MPICOMP_TIMEOUT", K::seconds, 0, 1e9},
      {"auto_reprobe_s", "MPICOMP_AUTO_REPROBE", K::seconds, 0, 1e9},
      {"skip_local", "MPICOMP_SKIP_LOCAL", K::flag, 0, 1},
      {"verbose", "MPICOMP_VERBOSE", K::flag, 0, 1},
      {"stats", "MPICOMP_STATS", K::flag, 0, 1},
      {"error_feedback", "MPICOMP_ERROR_FEEDBACK", K::flag, 0, 1},
  };
  return rules;
}

bool read_environment(std::vector<SettingValue>& out, std::string& error) {
  out.clear();
  if (std::getenv("MPICOMP_COMPRESS_LOCAL")) {  // renamed with its default flipped: never ignored silently
    error = "MPICOMP_COMPRESS_LOCAL: gone; compression is now applied on one node too, by default (set "
            "MPICOMP_SKIP_LOCAL=1 to skip it there, and unset MPICOMP_COMPRESS_LOCAL)";
    return false;
  }
  for (const SettingRule& r : setting_rules()) {
    const char* v = std::getenv(r.var);
    if (!v) continue;
    const std::string text(v), range = "[" + std::to_string(uint64_t(r.lo)) + ", " + std::to_string(uint64_t(r.hi)) + "]";
    SettingValue value{&r, 0, 0};
    size_t n = 0;
    char* end = nullptr;
    errno = 0;
    bool ok = false;
    std::string expected;
    switch (r.kind) {
      case SettingKind::bytes:
        ok = parse_size(text, n) && n >= uint64_t(r.lo) && n <= uint64_t(r.hi);  // exact: 2^62 + 1 as a double is 2^62
        value.integer = n;
        expected = "a byte count in " + range + " (65536, 64K, 16M)";
        break;
      case SettingKind::count: {
        const long long c = std::strtoll(v, &end, 10);
        ok = *v && !*end && !errno && c >= 0 && uint64_t(c) >= uint64_t(r.lo) && uint64_t(c) <= uint64_t(r.hi);
        value.integer = uint64_t(c);
        expected = "an integer in " + range;
        break;
      }
      case SettingKind::seconds:
        value.seconds = std::strtod(v, &end);
        ok = *v && !*end && !errno && value.seconds >= r.lo && value.seconds <= r.hi;
        expected = "a number of seconds in [0, 1e9]";
        break;
      case SettingKind::flag:
        ok = text == "0" || text == "1";
        value.integer = text == "1";
        expected = "0 or 1";
        break;
      case SettingKind::hierarchy:
        ok = text == "auto" || text == "flat";
        value.integer = text == "flat";
        expected = "auto or flat";
        break;
    }
    if (!ok) {
      error = std::string(r.var) + "=" + text + ": expected " + expected;
      return false;
    }
    out.push_back(value);
  }
  return true;
}

}  // namespace mpicomp
