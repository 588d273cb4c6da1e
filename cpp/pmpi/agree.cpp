#include "agree.h"

#include "../codecs/spec.h"
#include "../coll/mpi_util.h"

#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

namespace mpicomp::pmpi {
namespace {

// What one rank sends: plain integers, the same layout on every rank of one program.
struct Wire {
  uint64_t min_bytes;
  uint64_t segment_bytes;
  uint32_t dtypes;
  uint32_t skip_local;
  int32_t codec[3];  // per collective: CodecId (+ kAutoBit for codec "auto"), or -1 when off
  uint32_t block[3];
};

constexpr Coll kColls[3] = {Coll::allreduce, Coll::reduce_scatter, Coll::allgather};
constexpr const char* kCodecVars[3] = {"MPICOMP_CODEC / MPICOMP_ALLREDUCE_CODEC",
                                       "MPICOMP_CODEC / MPICOMP_REDUCE_SCATTER_CODEC",
                                       "MPICOMP_CODEC / MPICOMP_ALLGATHER_CODEC"};

Wire wire_of(const Settings& s) {
  Wire w{};
  w.min_bytes = s.min_bytes;
  w.segment_bytes = s.segment_bytes;
  w.dtypes = s.dtypes;
  w.skip_local = s.skip_local;
  for (int i = 0; i < 3; ++i) {
    const auto& spec = s.codec[int(kColls[i])];
    w.codec[i] = spec ? int32_t(spec->id) | (s.adaptive[int(kColls[i])] ? kAutoBit : 0) : -1;
    w.block[i] = spec ? spec->block : 0;
  }
  return w;
}

std::string dtypes_text(uint32_t bits) {
  std::string out;
  for (auto& [name, t] : kDtypeNames)
    if (bits & Settings::dtype_bit(t)) out += std::string(out.empty() ? "" : ",") + name;
  return out.empty() ? "(none)" : out;
}

std::string codec_text(int32_t id, uint32_t block) {
  if (id < 0) return "off";
  return std::string(id & kAutoBit ? "auto:" : "") + codec_name(CodecId(id & ~kAutoBit)) + ":block=" +
         std::to_string(block);
}

// The first setting in which `other` differs from `mine`: (variable, my value, its value).
bool differs(const Wire& mine, const Wire& other, std::string out[3]) {
  auto set = [&](const std::string& var, const std::string& a, const std::string& b) {
    out[0] = var, out[1] = a, out[2] = b;
    return true;
  };
  if (mine.min_bytes != other.min_bytes)
    return set("MPICOMP_MIN_BYTES", std::to_string(mine.min_bytes), std::to_string(other.min_bytes));
  if (mine.dtypes != other.dtypes) return set("MPICOMP_DTYPES", dtypes_text(mine.dtypes), dtypes_text(other.dtypes));
  if (mine.skip_local != other.skip_local)
    return set("MPICOMP_SKIP_LOCAL", std::to_string(mine.skip_local), std::to_string(other.skip_local));
  for (int i = 0; i < 3; ++i)
    if (mine.codec[i] != other.codec[i] || mine.block[i] != other.block[i])
      return set(kCodecVars[i], codec_text(mine.codec[i], mine.block[i]), codec_text(other.codec[i], other.block[i]));
  if (mine.segment_bytes != other.segment_bytes)
    return set("MPICOMP_SEGMENT_BYTES", std::to_string(mine.segment_bytes), std::to_string(other.segment_bytes));
  return false;
}

// Attribute values: the address of one of these two says the verdict.
char g_agreed, g_differ;

}  // namespace

bool settings_agree(MPI_Comm comm, const Settings& s) {
  static Keyval key;
  const int keyval = key.get();
  void* value = nullptr;
  int found = 0;
  PMPI_Comm_get_attr(comm, keyval, &value, &found);
  if (found) return value == &g_agreed;
  int rank = 0, size = 1;
  PMPI_Comm_rank(comm, &rank);
  PMPI_Comm_size(comm, &size);
  const Wire mine = wire_of(s);
  std::vector<Wire> all(size_t(size) > 0 ? size_t(size) : 1);
  PMPI_Allgather(&mine, int(sizeof(Wire)), MPI_BYTE, all.data(), int(sizeof(Wire)), MPI_BYTE, comm);
  std::string what[3];
  int other = -1;
  for (int r = 0; r < size && other < 0; ++r)
    if (differs(mine, all[size_t(r)], what)) other = r;
  PMPI_Comm_set_attr(comm, keyval, other < 0 ? &g_agreed : &g_differ);
  if (other >= 0) {
    int world = 0;
    PMPI_Comm_rank(MPI_COMM_WORLD, &world);
    std::fprintf(stderr,
                 "mpicomp (LD_PRELOAD), rank %d: %s is %s here but %s on rank %d of this communicator: settings "
                 "that decide whether and how a call is compressed must be the same on every rank; this "
                 "communicator's MPI_Allreduce, MPI_Reduce_scatter_block, MPI_Allgather and MPI_Iallreduce fail "
                 "(MPI_ERR_OTHER)\n",
                 world, what[0].c_str(), what[1].c_str(), what[2].c_str(), other);
    std::fflush(stderr);
  }
  return other < 0;
}

}  // namespace mpicomp::pmpi
