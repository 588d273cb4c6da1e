// The MPICOMP_* environment variables, every layer's (the Python API's config, the
// interposer's settings, the torch backend, the benchmarks): one list, so that a name outside
// it, a misspelling, is reported instead of silently ignored, as Open MPI reports an unknown
// MCA parameter.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace mpicomp {

// A setting read from the environment: its name (mpicomp.config's, or the interposer's
// alone), its variable, what it holds and its range. One table, so that every way in takes a
// variable alike (the interposer at MPI_Init, mpicomp.config at import) and mpicomp.config
// checks an assignment by the same range.
enum class SettingKind { bytes, count, seconds, flag, hierarchy };
struct SettingRule {
  const char* name;
  const char* var;
  SettingKind kind;
  double lo, hi;
};
const std::vector<SettingRule>& setting_rules();

// One setting whose variable is set: integer for bytes, counts, flags (0, 1) and hierarchy
// (config.h's Hierarchy), seconds for seconds.
struct SettingValue {
  const SettingRule* rule;
  uint64_t integer;
  double seconds;
};

// The settings whose variables are set, in setting_rules()'s order. false on the first
// invalid one, with error "VAR=value: expected ...".
bool read_environment(std::vector<SettingValue>& out, std::string& error);

// The MPICOMP_* names set in this process's environment that no layer reads, sorted.
std::vector<std::string> unknown_environment();

// A byte count as every layer takes it (the *_BYTES variables, mpicomp.config, the
// benchmarks' -m): digits, then optionally K, M or G (powers of 1024) and B or iB, any case:
// "65536", "64K", "16MiB". False when text is none of these (or overflows).
bool parse_size(const std::string& text, size_t& out);

}  // namespace mpicomp
