#include "spec.h"

#include <cstdlib>

#include "blosc.h"
#include "bound.h"

namespace mpicomp {
namespace {

std::string trimmed(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t"), b = s.find_last_not_of(" \t");
  return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

// A codec's options with their defaults, and each option's values (a table of names packed
// into Spec::block, an integer range, or with `real` a number in [kBoundMin, hi or kBoundMax]).
struct Option {
  const char* key;
  const char* fallback;  // "": none (given or left out)
  std::vector<std::pair<const char*, unsigned>> names;  // empty: a number in [lo, hi]
  long lo, hi, multiple;
  bool real = false;
};

const std::vector<Option>& options_of(CodecId id) {
  static const std::vector<Option> none, block = {{"block", "256", {}, 32, long(kMaxBlock), 32}},
      blosc = {{"cname", "zstd", {{"blosclz", 0}, {"lz4", 1}, {"lz4hc", 2}, {"zlib", 4}, {"zstd", 5}}, 0, 0, 1},
               {"filter", "shuffle", {{"none", 0}, {"shuffle", 1}, {"bitshuffle", 2}}, 0, 0, 1},
               {"clevel", "1", {}, 0, 9, 1}},
      // Exactly one of abs and rel (bound.h); rel relative to the largest magnitude.
      bound = {{"abs", "", {}, 0, 0, 1, true}, {"rel", "", {}, 0, 1, 1, true}, {"cname", "lz4", {{"zstd", 0}, {"lz4", 1}}, 0, 0, 1}};
  return is_blockwise(id) ? block : id == CodecId::blosc ? blosc : id == CodecId::bound ? bound : none;
}

// A real option's value: a number in [kBoundMin, its hi (0: kBoundMax)].
bool real_of(const Option& o, const std::string& codec, const std::string& text, double& out, std::string& why) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  const double hi = o.hi ? double(o.hi) : kBoundMax;
  if (text.empty() || *end || !(v >= kBoundMin && v <= hi)) {
    why = "codec '" + codec + "': " + o.key + " must be a number in [" + shown(kBoundMin) + ", " + shown(hi) +
          "], got " + text;
    return false;
  }
  return out = v, true;
}

// The value of option o as a number (an index into its names, or the integer); false if invalid.
bool value_of(const Option& o, const std::string& codec, const std::string& text, unsigned& out, std::string& why) {
  if (!o.names.empty()) {
    std::string listed;
    for (auto& [n, v] : o.names) {
      if (text == n) return out = v, true;
      listed += std::string(listed.empty() ? "" : ", ") + n;
    }
    why = "codec '" + codec + "': " + o.key + " must be one of " + listed + ", got '" + text + "'";
    return false;
  }
  char* end = nullptr;
  const long v = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end || v < o.lo || v > o.hi || v % o.multiple) {
    why = "codec '" + codec + "': " + o.key + " must be " +
          (o.multiple > 1 ? "a multiple of " + std::to_string(o.multiple) + " in" : std::string("an integer in")) +
          " [" + std::to_string(o.lo) + ", " + std::to_string(o.hi) + "], got " + text;
    return false;
  }
  return out = unsigned(v), true;
}

}  // namespace

bool split_auto(const std::string& text, std::string& inner) {
  const size_t colon = text.find(':');
  if (trimmed(text.substr(0, colon)) != "auto") return false;
  inner = colon == std::string::npos ? kAutoDefault : trimmed(text.substr(colon + 1));
  return true;
}

bool split_spec(const std::string& text, std::string& name, SpecOptions& options, std::string& why) {
  const size_t colon = text.find(':');
  name = trimmed(text.substr(0, colon));
  options.clear();
  if (colon == std::string::npos) return true;
  const std::string rest = text.substr(colon + 1);
  for (size_t at = 0; at <= rest.size();) {
    const size_t end = std::min(rest.find(',', at), rest.size());
    const std::string item = trimmed(rest.substr(at, end - at));
    at = end + 1;
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    if (eq == std::string::npos) {
      why = "codec spec '" + text + "': option '" + item + "' is not key=value";
      return false;
    }
    options.emplace_back(trimmed(item.substr(0, eq)), trimmed(item.substr(eq + 1)));
  }
  return true;
}

bool wire_spec(const std::string& name, const SpecOptions& given, Spec& spec, SpecOptions& in_force, std::string& why) {
  int id = name == "lossless" ? int(CodecId::blosc) : name == "nvcomp-lz4" ? int(CodecId::lz4) : -1;
  for (int i = 0; i < kCodecs && id < 0; ++i)
    if (name == codec_name(CodecId(i))) id = i;
  if (id < 0) {
    why = "unknown codec '" + name + "'";
    return false;
  }
  const auto& options = options_of(CodecId(id));
  for (auto& [key, value] : given) {
    bool known = false;
    for (auto& o : options) known |= key == o.key;
    if (!known) {
      std::string keys;
      for (auto& o : options) keys += std::string(keys.empty() ? "" : ", ") + o.key;
      why = "codec '" + name + "' has no option '" + key + "' (options: " + (keys.empty() ? "none" : keys) + ")";
      return false;
    }
  }
  unsigned values[3] = {};
  double real = 0;
  int reals = 0;
  in_force.clear();
  for (size_t i = 0; i < options.size(); ++i) {
    std::string text = options[i].fallback;
    for (auto& [key, value] : given)
      if (key == options[i].key) text = value;
    if (options[i].real) {  // given or not at all; values[i]: whether given
      if (text.empty()) continue;
      ++reals, values[i] = 1;
      if (!real_of(options[i], name, text, real, why)) return false;
    } else if (!value_of(options[i], name, text, values[i], why)) {
      return false;
    }
    in_force.emplace_back(options[i].key, text);
  }
  spec = Spec{CodecId(id), is_blockwise(CodecId(id)) ? values[0] : 0};
  if (spec.id == CodecId::blosc) spec.block = blosc_options(values[0], values[1], values[2]);
  if (spec.id == CodecId::bound) {
    if (reals != 1) {
      why = "codec 'bound' takes one bound: abs=<largest error> or rel=<largest error / largest |result|>, e.g. "
            "'bound:abs=1e-3'";
      return false;
    }
    spec.block = bound_options(real, values[1] != 0, values[2] != 0);
  }
  return true;
}

}  // namespace mpicomp
