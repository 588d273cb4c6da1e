// The patterns in which an agreement's messages (exchange.h) pair the ranks up: recursive
// doubling, recursive halving, and two levels on nodes of several ranks.
#include <vector>

#include "exchange.h"

namespace mpicomp {
namespace agreement {
namespace {

// The ranks of recursive doubling and halving, as MPICH's: of `size` ranks the first 2 * rem
// pair up, the odd one of each pair handing its data to the even one and sitting out the
// rounds among the pof2 that remain, numbered 0 .. pof2-1 (newranks).
struct Newranks {
  int pof2 = 1, rem = 0, nr = -1;  // nr: this rank's newrank; -1: it sits out
  Newranks(int r, int size) {
    while (pof2 * 2 <= size) pof2 *= 2;
    rem = size - pof2;
    nr = r < 2 * rem ? (r % 2 ? -1 : r / 2) : r - rem;
  }
  // Newrank k's rank, which is also the first of the ranks' units it holds (rank(pof2): size).
  int rank(int k) const { return k < rem ? 2 * k : k + rem; }
};

}  // namespace

// Recursive doubling among `size` ranks of c, this one `r` (as MPICH's allreduce): the first
// 2 * rem ranks pair up, the odd one handing its data to the even one, the pof2 that remain
// exchange with partners at distance 1, 2, 4, ..., and the even ranks hand the result back.
// Sums exchange the whole vector each round; a gather exchanges the blocks it holds, which
// are always a contiguous run of units, received straight into place.
void doubling(Exchange& ex, MPI_Comm c, int r, int size, const Blocks& blk) {
  const Newranks n(r, size);
  const int pof2 = n.pof2, rem = n.rem, nr = n.nr;
  const bool gather = ex.data.kind == Payload::gather;
  const size_t bytes = gather ? 0 : blk.B * ex.elem;  // a sum's (blk.B elements; none: headers alone)
  char* tmp = gather ? nullptr : scratch(0, bytes);
  auto held = [&](int lo, int k) { return blk.units(n.rank(lo), n.rank(std::min(lo + k, pof2))); };
  auto whole = [&] { return Span{const_cast<char*>(ex.src), bytes}; };  // a sum's
  if (r < 2 * rem) {
    if (r % 2)
      ex.send(c, r - 1, gather ? blk.units(r, r + 1) : whole());
    else if (gather)
      ex.recv(c, r + 1, blk.units(r + 1, r + 2));
    else if (ex.recv(c, r + 1, Span{tmp, bytes}))
      ex.add(0, tmp, bytes);
  }
  for (int mask = 1; nr >= 0 && mask < pof2; mask <<= 1) {
    const int pn = nr ^ mask, peer = n.rank(pn);
    if (gather) {
      ex.sendrecv(c, peer, held(nr & ~(mask - 1), mask), held(pn & ~(mask - 1), mask));
    } else if (ex.sendrecv(c, peer, whole(), Span{tmp, bytes})) {
      ex.add(0, tmp, bytes);
    }
  }
  if (r < 2 * rem) {
    Span result = gather ? blk.units(0, size) : Span{ex.data.out, bytes};
    if (r % 2 == 0) {
      ex.send(c, r + 1, result);
    } else {
      ex.recv(c, r - 1, result);  // straight into place
      ex.src = static_cast<const char*>(ex.data.out);  // what this rank sends on (two_levels)
    }
  }
}

// Where the copies of a payload that a node's other lanes would send reach this many bytes,
// it crosses between nodes once per node (two_levels): below, the extra round inside the node
// costs more than those copies take on the link. Bench/netem's 2 nodes of 2, uncompressed
// allreduce: at 1 Gbit/s 32 KiB took 558 us in every lane and 283-380 us in one, 16 KiB 285
// and 234-271 us; at 10 Gbit/s, where a round inside these emulated nodes (TCP on 2 shared
// cores) costs more than the link saves, 16-32 KiB took 184-301 and 241-366 us.
constexpr size_t kOneLaneBytes = 16 * 1024;

// On nodes of several ranks, in up to three phases, as MPI libraries' node-aware small
// allreduces go (Open MPI's HAN, MPICH's compositions): (1) each node's ranks by recursive
// doubling among themselves; (2) the ranks with the same index on every node (a lane), among
// themselves: each then holds everything; (3) the node's first rank hands the outcome down
// its node in a binomial tree, to the ranks that need it. On two levels (not Config::hierarchy
// flat, nor codec auto's flat path), a payload whose other lanes' copies come to kOneLaneBytes
// crosses in lane 0 only, the other lanes exchanging their headers alone, and all of the
// node's ranks need phase 3: one copy per node on the network card instead of one per lane.
// Others (the agreement alone included) cross in every lane, and only the ranks beyond the
// smallest node's size (no lane) need phase 3: two phases, as doubling over all ranks.
// Which ranks need phase 3 follows from what the node agreed in phase 1, so its ranks decide
// alike: where they disagree, all of them take phase 3. A gather collects the blocks in node
// order (node 0's ranks, then node 1's, ...): in place where that is rank order, else in
// scratch, put in rank order at the end.
void two_levels(Exchange& ex, const CommInfo& ci, const NodeLayout& L) {
  const std::vector<int>& first = L.node_first;
  const bool gather = ex.data.kind == Payload::gather;
  const size_t B = ex.data.count;
  char* out = static_cast<char*>(ex.data.out);
  char* G = gather && !L.node_ordered ? scratch(4, B * ci.size) : out;
  if (G != out) std::memcpy(G + size_t(first[L.node] + L.local) * B, out + ci.rank * B, B);
  const Span result = gather ? Span{G, B * ci.size} : Span{out, B * ex.elem};

  const int k = L.node_size[L.node];
  Links inside(false);
  doubling(ex, L.intra, L.local, k, Blocks{G, B, nullptr, first[L.node]});
  const bool one_lane = !ex.mine.sig.flat && size_t(L.lanes - 1) * result.n >= kOneLaneBytes;
  const bool node_agreed = ex.agreed();
  if (L.local < L.lanes) {
    Links across(true);
    const bool header_only = one_lane && L.local > 0;
    doubling(ex, L.inter, L.node, L.nodes, Blocks{G, header_only ? 0 : B, first.data(), 0});
  }
  auto needs = [&](int local) { return local >= L.lanes || one_lane || !node_agreed; };
  int mask = 1;
  while (mask < k) mask <<= 1;
  for (mask >>= 1; mask >= 1; mask >>= 1) {
    if (L.local % (2 * mask) == 0 && L.local + mask < k && needs(L.local + mask))
      ex.send(L.intra, L.local + mask, result);
    else if (L.local % (2 * mask) == mask && needs(L.local))
      ex.recv(L.intra, L.local - mask, result);
  }
  if (G != out)
    for (int at = 0; at < ci.size; ++at) std::memcpy(out + L.order[at] * B, G + at * B, B);
}

// A reduce-scatter by recursive halving (MPICH's for commutative operations): the first 2 * rem
// ranks pair up as in doubling(), the odd one handing its vector to the even one; then each of
// the pof2 that remain sends its partner, at distance pof2 / 2, pof2 / 4, ..., 1, the half of
// the parts it still holds that the partner keeps, and adds in what it receives: about one
// vector in all, where recursive doubling sends the whole one each round. 4 ranks, codec
// none, one run each: on shared memory 16 KiB took 19 us against 51 us, 32 KiB 44 against 53
// (MPI_Reduce_scatter_block 29-33 and 50-59 us); flat over bench/netem's 2 nodes of 2 at
// 10 Gbit/s, 16 KiB 153 against 186 us.
// The headers meet as in doubling(): every rank's reaches every rank. On two ranks it is the
// single exchange MPI's reduce-scatter makes: half the vector each way.
void halving(Exchange& ex, MPI_Comm c, int r, int size) {
  const Newranks n(r, size);
  const int pof2 = n.pof2, rem = n.rem, nr = n.nr;
  const size_t part = ex.data.count / size * ex.elem, whole = ex.data.count * ex.elem;
  auto first = [&](int k) { return size_t(n.rank(k)); };  // a newrank's first part
  if (r < 2 * rem) {
    char* tmp = r % 2 ? nullptr : scratch(0, whole);
    if (r % 2)
      ex.send(c, r - 1, Span{const_cast<char*>(ex.src), whole});
    else if (ex.recv(c, r + 1, Span{tmp, whole}))
      ex.add(0, tmp, whole);
  }
  for (int lo = 0, mask = pof2 / 2; nr >= 0 && mask >= 1; mask >>= 1) {
    const int pn = nr ^ mask, peer = n.rank(pn);
    const int keep = nr & mask ? lo + mask : lo, give = nr & mask ? lo : lo + mask;
    const size_t at = first(keep) * part, bytes = (first(keep + mask) - first(keep)) * part;
    const size_t from = first(give) * part, sent = (first(give + mask) - first(give)) * part;
    char* tmp = scratch(0, bytes);  // the halves shrink: one buffer serves every round
    if (ex.sendrecv(c, peer, Span{const_cast<char*>(ex.src) + from, sent}, Span{tmp, bytes})) ex.add(at, tmp, bytes);
    lo = keep;
  }
  if (r < 2 * rem) {  // the even rank holds its odd partner's part too
    char* out = static_cast<char*>(ex.data.out);
    if (r % 2 == 0)
      ex.send(c, r + 1, Span{out + size_t(r + 1) * part, part});
    else
      ex.recv(c, r - 1, Span{out + size_t(r) * part, part});
  }
}

}  // namespace agreement
}  // namespace mpicomp
