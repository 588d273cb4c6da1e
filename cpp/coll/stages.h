// The two building blocks of every compressed collective, written once over any codec and
// any engine: a reduce-scatter stage (each rank encodes the parts of its input meant for the
// others once, exchanges them, and decodes-and-accumulates what it receives) and an
// allgather stage (each rank encodes one part once and every rank decodes all parts).
// allreduce = reduce-scatter stage + allgather stage: two compressions, never one per hop.
// Both pipeline: a part is sent in segments, each sent as soon as it is encoded, and
// received segments are decoded while later ones are still being encoded.
#pragma once
#include <mpi.h>

#include <string>
#include <utility>
#include <vector>

#include "deadline.h"
#include "engine.h"
#include "mpi_util.h"
#include "stats.h"
#include "topology.h"

namespace mpicomp {

// Part j of a buffer is elements [off[j], off[j+1]), or, where `at` is given, len(j)
// elements from at[j] (the parts of a two-level stage lie wherever their ranks' blocks are);
// parts travel in segments of `seg` elements (a multiple of the codec's block, so segments
// encode independently).
struct Layout {
  std::vector<size_t> off;
  size_t seg;
  std::vector<size_t> at;
  size_t len(int j) const { return off[j + 1] - off[j]; }
  size_t pos(int j) const { return at.empty() ? off[j] : at[j]; }
};

// Parts of equal length k (reduce_scatter / allgather of k elements per rank).
Layout equal_layout(int size, size_t k, size_t seg);
// n elements in `size` parts whose boundaries fall on multiples of `granule` (allreduce).
Layout balanced_layout(int size, size_t n, size_t granule, size_t seg);
// Segment length for a codec and dtype from the configured segment bytes: segment_bytes of
// input, or as many more as put segment_bytes / kWireFraction on the wire (lossy codecs).
constexpr size_t kWireFraction = 8;
size_t segment_elems(Spec s, DType t, size_t segment_bytes);
// Where segment k of an encoded part starts in a receive buffer: segments are whole blocks
// (whole chunks for lossless codecs), so each has room for the largest encoding of `seg`.
inline size_t segment_offset(Spec s, DType t, size_t seg, size_t k) { return k * encoded_bytes(s, t, seg); }
// Room for a part of `len` elements sent in segments of `seg` (encoded_bytes(s, t, len) for
// lossy codecs; a lossless frame per segment needs a header each), rounded up to 16 bytes:
// parts lie side by side in wire buffers, and a GPU's vector loads fault on a part that
// starts where the one before it ended (an fp16 part of odd length, say).
inline size_t part_bytes(Spec s, DType t, size_t len, size_t seg) {
  size_t last = len ? (len - 1) / seg : 0;
  return frame_align(segment_offset(s, t, seg, last) + encoded_bytes(s, t, len - last * seg));
}

// Bytes this thread's stages have sent since the last call (what the wire carried, a
// lossless frame's own size included), for the statistics; split by node where a Links
// scope said where the peers are.
Sent take_sent_bytes();
// Counts the data that mpicomp's messages outside the stages carried to peer (what rides the
// agreement) by node, where a Links scope says where the peers are; not in Sent::bytes, which
// bytes_wire reads for compressed calls only.
void note_sent(size_t bytes, int peer);
// Whether a message to peer crosses between nodes, as the innermost Links scope says (false
// outside one): the same answer on both ends of a pair, from the agreed layout.
bool crosses_nodes(int peer);

// While one is alive, this thread's stages count what they send to a peer as crossing
// between nodes or not: by the peer's node in `layout` (stages on the communicator the
// layout describes), or all of it one way (stages on a layout's intra or inter communicator).
class Links {
 public:
  explicit Links(const NodeLayout& layout);
  explicit Links(bool between_nodes);
  ~Links();
  Links(const Links&) = delete;
  Links& operator=(const Links&) = delete;
  bool between(int peer) const { return layout_ ? layout_->node_of[peer] != layout_->node : between_; }

 private:
  const NodeLayout* layout_ = nullptr;
  bool between_ = false;
  const Links* outer_;
};

// The first corrupt frame a stage received (lossless codecs, whose decoders check their
// frames). The stage goes on without it, so every rank still sends and receives all of the
// call's messages; check_frames then fails the call on every rank, naming this one.
struct FrameDamage {
  int source = -1;  // the rank that sent it; -1: none
  std::string what;
  // Runs decode(); a codec Error it raises is recorded (the first) instead of thrown.
  template <class F>
  void guard(int from, F&& decode) {
    try {
      decode();
    } catch (const Error& err) {
      if (err.kind != ErrorKind::codec) throw;
      if (source < 0) source = from, what = err.what();
    }
  }
};
// One small allreduce: raises a codec Error on every rank when any rank recorded damage.
void check_frames(MPI_Comm c, const CommInfo& ci, const FrameDamage& d);

// A stage is in flight from its constructor, which posts the receives and encodes and sends
// this rank's parts, to finish(), which waits for the rest and decodes it. In between, the
// caller may start another stage on other wire slots: an allreduce encodes and sends the next
// tile's reduce-scatter while this tile's allgather is on the wire, and decodes that
// allgather while the next reduce-scatter travels. A stage uses the engine's wire buffers
// `slot` and `slot + 1`. Not movable: MPI and the timeout guard hold its requests' address.

// acc (own part, dtype sum_t: float32, or float64 for float64 the wire carries exactly) = sum
// over ranks of their part `rank` of x. The own part is added exactly, the others decoded in
// a fixed order, so the result does not depend on timing.
// residual (input-sized, may be null): error feedback for the encoded parts; the own part's
// entries are added to acc and zeroed.
class ReduceScatterStage {
 public:
  ReduceScatterStage(MPI_Comm c, const CommInfo& ci, Engine& e, Spec s, DType t, const Layout& L, const void* x,
                     float* residual, DType sum_t, void* acc, FrameDamage& damage, int slot = 0);
  ReduceScatterStage(const ReduceScatterStage&) = delete;
  ReduceScatterStage& operator=(const ReduceScatterStage&) = delete;
  // acc holds the sum when it returns.
  void finish();

 private:
  void consume(bool block);
  const int r_, p_;
  Engine& e_;
  const Spec s_;
  const DType t_;
  const Layout L_;
  const DType sum_t_;
  char* const acc_;
  FrameDamage& damage_;
  const size_t my_len_, my_enc_;
  const char* own_ = nullptr;  // input of the sums' own dtype, added by the first peer's decode (no load)
  uint8_t* rbuf_ = nullptr;
  size_t next_ = 0;  // receives are consumed in the order they were posted
  std::vector<MPI_Request> rreq_, sreq_;
  Posted posted_r_{rreq_, Posted::receives}, posted_s_{sreq_, Posted::sends};
};

// Every rank's `src` (its own part, dtype st) is encoded once and decoded by all ranks (the
// owner too, so all outputs are identical) into y (dtype yt) times scale. residual: error
// feedback for the own part (may be null). Codec none requires st == yt. stream: y is
// written around the cache (Engine::decode).
class AllgatherStage {
 public:
  AllgatherStage(MPI_Comm c, const CommInfo& ci, Engine& e, Spec s, DType st, const Layout& L, const void* src,
                 float* residual, DType yt, void* y, float scale, bool stream, FrameDamage& damage, int slot = 0);
  AllgatherStage(const AllgatherStage&) = delete;
  AllgatherStage& operator=(const AllgatherStage&) = delete;
  // y holds every part when it returns.
  void finish();

 private:
  void consume(bool block);
  void decode_part(const uint8_t* part, int j, size_t k);
  const int r_, p_;
  Engine& e_;
  const Spec s_;
  const DType st_, yt_;
  const Layout L_;
  void* const y_;
  const float scale_;
  const bool stream_;
  FrameDamage& damage_;
  const bool raw_;         // exact parts sent from src and received into y (Engine::mpi_takes_buffers)
  const void* const src_;
  std::vector<size_t> rpos_;  // part j lands at rpos_[j] in the receive buffer
  uint8_t *rbuf_ = nullptr, *sbuf_ = nullptr;
  std::vector<std::pair<int, size_t>> which_;  // (part, segment) of each receive
  std::vector<int> idx_;
  size_t left_ = 0;
  std::vector<MPI_Request> rreq_, sreq_;
  Posted posted_r_{rreq_, Posted::receives}, posted_s_{sreq_, Posted::sends};
};

// What an allreduce's allgather stage sends of a part it reduced: acc holds the part's sums
// (len elements of dtype sum_t, residual res), `mine` is the part's place in the output (dtype
// t). The allgather sends the float32 sums (their residual: error feedback of the own part), or for
// a lossless codec the output's own part: a frame restores the bytes it was given, so the
// reduced part is stored as the output first and gathered as it is. Uncompressed 16-bit
// output travels as the 16-bit codec of its dtype, which carries it exactly.
struct ReducedPart {
  Spec out;
  DType st;
  const void* src;
  float* res;
  float scale;
};
ReducedPart reduced_part(Engine& e, Spec wire, DType t, DType sum_t, void* acc, size_t len, float* res, void* mine,
                         double scale);

}  // namespace mpicomp
