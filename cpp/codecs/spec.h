// Layer 1: the codec spec grammar, "name" or "name:key=value,key=value", and the options of
// every wire codec. One parser for every way in: mpicomp.codec() in Python (and through it
// the benchmarks' --codec and the torch layer), the interposer's MPICOMP_*_CODEC variables.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "format.h"

namespace mpicomp {

using SpecOptions = std::vector<std::pair<std::string, std::string>>;  // (key, value as text)

// The codec "auto" names ("auto" alone: int8, the default codec of gradients).
constexpr const char* kAutoDefault = "int8";

// A CodecId with this bit added: codec "auto" over that codec, where a codec travels as a
// number (the bindings' calls, the interposer's settings exchange).
constexpr int kAutoBit = 1 << 8;

// "auto" or "auto:<spec>" (e.g. "auto:int4:block=128"): codec "auto", which compresses with
// <spec> where that pays (coll/adaptive.h). True for those, with <spec>'s text in `inner`.
bool split_auto(const std::string& text, std::string& inner);

// Splits text into its name and options, each trimmed of blanks; false, with why, for an
// option that is not key=value.
bool split_spec(const std::string& text, std::string& name, SpecOptions& options, std::string& why);

// The wire codec `name` with the options given (a later key overrides an earlier one): its
// Spec, and every option in force, defaults included, as mpicomp.Codec.options shows them.
// "lossless" is blosc with its defaults, "nvcomp-lz4" lz4. false, with why, for an unknown
// name or option or a value out of range.
bool wire_spec(const std::string& name, const SpecOptions& given, Spec& spec, SpecOptions& in_force, std::string& why);

}  // namespace mpicomp
