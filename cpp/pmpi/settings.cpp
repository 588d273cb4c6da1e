#include "settings.h"

#include <algorithm>
#include <cstdlib>
#include <vector>

#include "../codecs/spec.h"
#include "../coll/environment.h"

namespace mpicomp::pmpi {
namespace {

// "int4", "int4:block=128", "blosc:cname=zstd" or "auto:int4": mpicomp.codec()'s grammar and
// rules (codecs/spec.h), for the codecs of host memory.
bool parse_spec(const std::string& text, Spec& spec, bool& adaptive, std::string& why) {
  std::string name, inner;
  SpecOptions options, in_force;
  adaptive = split_auto(text, inner);
  if (!split_spec(adaptive ? inner : text, name, options, why)) return false;
  if (!wire_spec(name, options, spec, in_force, why)) {
    if (why.rfind("unknown codec", 0) == 0) {
      why += " (codecs: ";
      for (int i = 0; i < kCodecs; ++i)
        if (!device_only(CodecId(i))) why += std::string(codec_name(CodecId(i))) + ", ";
      why += "lossless, auto, auto:<codec>, or off)";
    }
    return false;
  }
  if (device_only(spec.id)) {
    why = "codec '" + name + "' runs on GPU buffers only; the interposer compresses host memory";
    return false;
  }
  return true;
}

bool read_codec(const char* var, std::optional<Spec>& out, bool& adaptive, std::string& error) {
  const char* v = std::getenv(var);
  if (!v) return true;
  std::string text(v), why;
  if (text == "off" || text.empty()) {
    out.reset();
    adaptive = false;
    return true;
  }
  Spec s;
  if (!parse_spec(text, s, adaptive, why)) {
    error = std::string(var) + "=" + text + ": " + why;
    return false;
  }
  out = s;
  return true;
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
  std::optional<Spec> all;
  bool all_adaptive = false;
  if (!read_codec("MPICOMP_CODEC", all, all_adaptive, error)) return false;
  const std::pair<Coll, const char*> overrides[] = {{Coll::allreduce, "MPICOMP_ALLREDUCE_CODEC"},
                                                    {Coll::reduce_scatter, "MPICOMP_REDUCE_SCATTER_CODEC"},
                                                    {Coll::allgather, "MPICOMP_ALLGATHER_CODEC"}};
  for (auto& [coll, var] : overrides) {
    s.codec[int(coll)] = all;
    s.adaptive[int(coll)] = all_adaptive;
    if (!read_codec(var, s.codec[int(coll)], s.adaptive[int(coll)], error)) return false;
  }
  // The settings every way in shares (coll/environment.h).
  std::vector<SettingValue> values;
  if (!read_environment(values, error)) return false;
  for (const SettingValue& v : values) {
    const std::string name = v.rule->name;
    if (name == "min_bytes") s.min_bytes = v.integer;
    else if (name == "segment_bytes") s.segment_bytes = v.integer;
    else if (name == "eager_bytes") s.eager_bytes = v.integer;
    else if (name == "cache_bytes") s.cache_bytes = v.integer;
    else if (name == "residual_bytes") s.residual_bytes = v.integer;
    else if (name == "codec_threads") s.codec_threads = v.integer;
    else if (name == "ranks_per_node") s.ranks_per_node = v.integer;
    else if (name == "hierarchy") s.hierarchy = Hierarchy(v.integer);
    else if (name == "timeout_s") s.timeout_s = v.seconds;
    else if (name == "auto_reprobe_s") s.auto_reprobe_s = v.seconds;
    else if (name == "skip_local") s.skip_local = v.integer;
    else if (name == "verbose") s.verbose = v.integer;
    else if (name == "stats") s.stats = v.integer;
    else if (name == "error_feedback") s.error_feedback = v.integer;
  }
  return read_dtypes("MPICOMP_DTYPES", s.dtypes, error);
}

}  // namespace mpicomp::pmpi
