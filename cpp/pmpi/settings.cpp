#include "settings.h"

#include <vector>

#include "../codecs/blosc.h"
#include "../coll/environment.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace mpicomp::pmpi {
namespace {

// Codec blosc's options "cname=zstd,filter=bitshuffle,clevel=1" (any of them, any order)
// into spec.block, as mpicomp.codec("blosc", ...) packs them.
bool parse_blosc(const std::string& opts, Spec& spec, std::string& why) {
  static const std::pair<const char*, unsigned> cnames[] = {{"blosclz", 0}, {"lz4", 1}, {"lz4hc", 2}, {"zlib", 4},
                                                            {"zstd", 5}};
  static const std::pair<const char*, unsigned> filters[] = {{"none", 0}, {"shuffle", 1}, {"bitshuffle", 2}};
  unsigned cname = 5, filter = 1, level = 1;  // mpicomp.codec("blosc")'s defaults: zstd, shuffle, 1
  size_t start = 0;
  while (start <= opts.size() && !opts.empty()) {
    const std::string item = opts.substr(start, opts.find(',', start) - start);
    const std::string key = item.substr(0, item.find('=')), value = item.substr(item.find('=') + 1);
    bool ok = false;
    if (key == "cname" || key == "filter") {
      for (auto& [n, v] : key == "cname" ? std::vector(std::begin(cnames), std::end(cnames))
                                         : std::vector(std::begin(filters), std::end(filters)))
        if (value == n) (key == "cname" ? cname : filter) = v, ok = true;
    } else if (key == "clevel") {
      ok = value.size() == 1 && value[0] >= '0' && value[0] <= '9';
      if (ok) level = unsigned(value[0] - '0');
    }
    if (!ok || item.find('=') == std::string::npos) {
      why = "option '" + item + "' is not valid for codec blosc (cname=blosclz|lz4|lz4hc|zlib|zstd, "
            "filter=none|shuffle|bitshuffle, clevel=0-9)";
      return false;
    }
    if (opts.find(',', start) == std::string::npos) break;
    start = opts.find(',', start) + 1;
  }
  spec.block = blosc_options(cname, filter, level);
  return true;
}

// "int4", "int4:block=128" or "blosc:cname=zstd": the spec syntax of mpicomp.codec();
// "lossless" is blosc's name with its defaults.
bool parse_spec(const std::string& text, Spec& spec, std::string& why) {
  std::string name = text.substr(0, text.find(':'));
  int id = name == "lossless" ? int(CodecId::blosc) : -1;
  for (int i = 0; i < kHostCodecs; ++i)  // host buffers: not the GPU-only codecs
    if (name == codec_name(CodecId(i))) id = i;
  if (id < 0) {
    why = "unknown codec '" + name + "' (codecs: ";
    for (int i = 0; i < kHostCodecs; ++i) why += std::string(codec_name(CodecId(i))) + ", ";
    why += "lossless, or off)";
    return false;
  }
  spec = Spec{CodecId(id), 256};
  if (spec.id == CodecId::blosc)
    return parse_blosc(text.find(':') == std::string::npos ? "" : text.substr(text.find(':') + 1), spec, why);
  if (text.find(':') == std::string::npos) return true;
  std::string opts = text.substr(text.find(':') + 1);
  if (opts.rfind("block=", 0) != 0 || !is_blockwise(spec.id)) {
    why = "option '" + opts + "' is not valid for codec '" + name + "' (int8, int4 and sign take block=N)";
    return false;
  }
  char* end = nullptr;
  long b = std::strtol(opts.c_str() + 6, &end, 10);
  if (*end || b < 32 || b > long(kMaxBlock) || b % 32) {
    why = "block must be a multiple of 32 in [32, 65536], got '" + opts.substr(6) + "'";
    return false;
  }
  spec.block = uint32_t(b);
  return true;
}

bool read_codec(const char* var, std::optional<Spec>& out, std::string& error) {
  const char* v = std::getenv(var);
  if (!v) return true;
  std::string text(v), why;
  if (text == "off" || text.empty()) {
    out.reset();
    return true;
  }
  Spec s;
  if (!parse_spec(text, s, why)) {
    error = std::string(var) + "=" + text + ": " + why;
    return false;
  }
  out = s;
  return true;
}

// A byte count in [lo, hi] as every layer takes one (environment.h: parse_size; mpicomp.config's
// limits: a zero segment would divide by zero).
bool read_size(const char* var, size_t& out, std::string& error, long long lo, long long hi) {
  const char* v = std::getenv(var);
  if (!v) return true;
  size_t n = 0;
  if (!parse_size(v, n) || n < size_t(lo) || n > size_t(hi)) {
    error = std::string(var) + "=" + v + ": expected a byte count in [" + std::to_string(lo) + ", " +
            std::to_string(hi) + "] (65536, 64K, 16M)";
    return false;
  }
  out = n;
  return true;
}

// A count (threads, ranks) in [lo, hi].
bool read_count(const char* var, size_t& out, std::string& error, long long lo, long long hi) {
  const char* v = std::getenv(var);
  if (!v) return true;
  char* end = nullptr;
  errno = 0;
  long long n = std::strtoll(v, &end, 10);
  if (!*v || *end || errno || n < lo || n > hi) {
    error = std::string(var) + "=" + v + ": expected an integer in [" + std::to_string(lo) + ", " +
            std::to_string(hi) + "]";
    return false;
  }
  out = size_t(n);
  return true;
}

// Seconds, in [0, 1e9].
bool read_seconds(const char* var, double& out, std::string& error) {
  const char* v = std::getenv(var);
  if (!v) return true;
  char* end = nullptr;
  errno = 0;
  double t = std::strtod(v, &end);
  if (!*v || *end || errno || !(t >= 0 && t <= 1e9)) {
    error = std::string(var) + "=" + v + ": expected a number of seconds in [0, 1e9] (0: no limit)";
    return false;
  }
  out = t;
  return true;
}

bool read_flag(const char* var, bool& out, std::string& error) {
  const char* v = std::getenv(var);
  if (!v) return true;
  if (!std::strcmp(v, "1") || !std::strcmp(v, "0")) {
    out = v[0] == '1';
    return true;
  }
  error = std::string(var) + "=" + v + ": expected 0 or 1";
  return false;
}

bool read_hierarchy(const char* var, Hierarchy& out, std::string& error) {
  const char* v = std::getenv(var);
  if (!v) return true;
  if (!std::strcmp(v, "auto") || !std::strcmp(v, "flat")) {
    out = v[0] == 'f' ? Hierarchy::flat : Hierarchy::automatic;
    return true;
  }
  error = std::string(var) + "=" + v + ": expected auto or flat";
  return false;
}

// "float,double": a comma-separated list of kDtypeNames.
bool read_dtypes(const char* var, unsigned& out, std::string& error) {
  const char* v = std::getenv(var);
  if (!v) return true;
  std::string text(v), names;
  for (auto& [name, t] : kDtypeNames) names += std::string(names.empty() ? "" : ", ") + name;
  unsigned bits = 0;
  for (size_t at = 0; at <= text.size();) {
    size_t end = std::min(text.find(',', at), text.size());
    std::string name = text.substr(at, end - at);
    bool known = false;
    for (auto& [n, t] : kDtypeNames)
      if (name == n) known = true, bits |= Settings::dtype_bit(t);
    if (!known) {
      error = std::string(var) + "=" + text + ": unknown datatype '" + name + "' (datatypes: " + names + ")";
      return false;
    }
    at = end + 1;
  }
  out = bits;
  return true;
}

}  // namespace

bool read_settings(Settings& s, std::string& error) {
  if (std::getenv("MPICOMP_COMPRESS_LOCAL")) {  // renamed with its default flipped: never ignored silently
    error = "MPICOMP_COMPRESS_LOCAL: gone; compression is now applied on one node too, by default (set "
            "MPICOMP_SKIP_LOCAL=1 to pass such calls through, and unset MPICOMP_COMPRESS_LOCAL)";
    return false;
  }
  std::optional<Spec> all;
  if (!read_codec("MPICOMP_CODEC", all, error)) return false;
  const std::pair<Coll, const char*> overrides[] = {{Coll::allreduce, "MPICOMP_ALLREDUCE_CODEC"},
                                                    {Coll::reduce_scatter, "MPICOMP_REDUCE_SCATTER_CODEC"},
                                                    {Coll::allgather, "MPICOMP_ALLGATHER_CODEC"}};
  for (auto& [coll, var] : overrides) {
    s.codec[int(coll)] = all;
    if (!read_codec(var, s.codec[int(coll)], error)) return false;
  }
  return read_size("MPICOMP_MIN_BYTES", s.min_bytes, error, 0, 1LL << 62) &&
         read_size("MPICOMP_SEGMENT_BYTES", s.segment_bytes, error, 1024, 1LL << 31) &&
         read_size("MPICOMP_CACHE_BYTES", s.cache_bytes, error, 0, 1LL << 62) &&
         read_size("MPICOMP_RESIDUAL_BYTES", s.residual_bytes, error, 0, 1LL << 62) &&
         read_count("MPICOMP_CODEC_THREADS", s.codec_threads, error, 0, 1024) &&
         read_count("MPICOMP_RANKS_PER_NODE", s.ranks_per_node, error, 0, 1 << 24) &&
         read_hierarchy("MPICOMP_HIERARCHY", s.hierarchy, error) &&
         read_seconds("MPICOMP_TIMEOUT", s.timeout_s, error) &&
         read_flag("MPICOMP_ERROR_FEEDBACK", s.error_feedback, error) && read_flag("MPICOMP_STATS", s.stats, error) &&
         read_flag("MPICOMP_VERBOSE", s.verbose, error) && read_flag("MPICOMP_SKIP_LOCAL", s.skip_local, error) &&
         read_dtypes("MPICOMP_DTYPES", s.dtypes, error);
}

}  // namespace mpicomp::pmpi
