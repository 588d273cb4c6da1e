// Host lossless frames, and the LZ4 block format written from its specification
// (https://github.com/lz4/lz4/blob/dev/doc/lz4_Block_format.md): a block is a run of
// sequences [token][literal length+][literals][offset, 2 bytes LE][match length+]; the token's
// high nibble is the literal length, its low nibble the match length minus 4 (15 = more bytes
// follow, each added, until one is not 255); the last sequence has literals only. The end
// rules: the last 5 bytes are literals, and no match starts in the last 12 bytes.
// The encoder is greedy with a 4096-entry hash of 4-byte words: fast, not the best ratio.
// It stays beside Blosc2 (whose LZ4 encodes sparse data faster) because these raw blocks are
// the wire format nvCOMP's LZ4 writes and reads: codec lz4 frames from a GPU rank and from a
// host rank are the same bytes. Blosc2's chunks carry headers of their own. Measured side
// by side in the README ("Two LZ4s").
#include "lossless.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <string>
#include <vector>

#include "errors.h"
#include "blosc.h"
#include "parallel.h"

namespace mpicomp {
namespace {

constexpr size_t kMinMatch = 4, kLastLiterals = 5, kMatchFromEnd = 12, kMaxOffset = 65535;
constexpr int kHashBits = 12;

uint32_t read32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
uint64_t read64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}
uint32_t hash4(uint32_t v) { return (v * 2654435761u) >> (32 - kHashBits); }

// Appends a length's continuation bytes (the part at and above 15 in the token's nibble).
bool put_length(uint8_t*& op, const uint8_t* end, size_t len) {
  for (; len >= 255; len -= 255) {
    if (op >= end) return false;
    *op++ = 255;
  }
  if (op >= end) return false;
  *op++ = uint8_t(len);
  return true;
}

bool put_sequence(uint8_t*& op, const uint8_t* end, const uint8_t* lit, size_t nlit, size_t offset, size_t mlen) {
  if (op >= end) return false;
  uint8_t* token = op++;
  *token = uint8_t(std::min<size_t>(nlit, 15) << 4);
  if (nlit >= 15 && !put_length(op, end, nlit - 15)) return false;
  if (size_t(end - op) < nlit) return false;
  std::memcpy(op, lit, nlit);
  op += nlit;
  if (!mlen) return true;  // the last sequence
  if (end - op < 2) return false;
  *op++ = uint8_t(offset);
  *op++ = uint8_t(offset >> 8);
  *token |= uint8_t(std::min<size_t>(mlen - kMinMatch, 15));
  return mlen - kMinMatch < 15 || put_length(op, end, mlen - kMinMatch - 15);
}

bool get_length(const uint8_t*& ip, const uint8_t* end, size_t& len) {
  uint8_t b;
  do {
    if (ip >= end) return false;
    b = *ip++;
    len += b;
  } while (b == 255);
  return true;
}

size_t chunk_len(size_t raw, size_t i) { return std::min(kChunkBytes, raw - i * kChunkBytes); }

[[noreturn]] void gpu_only(CodecId c) {
  throw Error(ErrorKind::backend, std::string("codec nvcomp-") + (c == CodecId::ans ? "ans" : "bitcomp") +
                                      " encodes and decodes on a GPU only (nvCOMP); give it device buffers");
}

}  // namespace

// Chunks are compressed side by side on codec_threads() threads, each into the slot it would
// take stored as it is, then moved down behind the one before: the frame is the same bytes
// whatever the thread count. A thread takes at least kMinChunks chunks (256 KiB), which
// Blosc2's shuffle + zstd compresses in about 0.1-1 ms, far above a hand-off's cost.
constexpr size_t kMinChunks = 4;

size_t host_frame_encode(Spec s, size_t typesize, size_t raw, uint8_t* out, const ChunkSource& chunk) {
  if (s.id != CodecId::lz4 && s.id != CodecId::blosc) gpu_only(s.id);
  const size_t m = frame_chunks(raw);
  if (!m) return 0;  // out may be null
  const size_t head = frame_header_bytes(m);
  std::vector<uint32_t> words(m);
  parallel_ranges(m, kMinChunks, [&](size_t a, size_t b) {
    for (size_t i = a; i < b; ++i) {
      const size_t len = chunk_len(raw, i);
      uint8_t* slot = out + head + i * kChunkBytes;
      const uint8_t* src = chunk(i, len);
      const size_t stored = s.id == CodecId::blosc ? blosc_compress_chunk(s.block, typesize, src, len, slot, len)
                                                   : lz4_compress_block(src, len, slot, len - 1);
      words[i] = uint32_t(stored);
      if (!stored) {
        std::memcpy(slot, src, len);
        words[i] = uint32_t(len) | kRawChunk;
      }
    }
  });
  std::memcpy(out, words.data(), 4 * m);
  std::memset(out + 4 * m, 0, head - 4 * m);
  size_t pos = head;
  for (size_t i = 0; i < m; ++i) {
    const size_t stored = words[i] & ~kRawChunk;
    std::memmove(out + pos, out + head + i * kChunkBytes, stored);
    std::memset(out + pos + stored, 0, frame_align(stored) - stored);  // same input, same bytes
    pos += frame_align(stored);
  }
  return pos;
}

size_t host_frame_encode(Spec s, size_t typesize, const uint8_t* x, size_t raw, uint8_t* out) {
  return host_frame_encode(s, typesize, raw, out, [x](size_t i, size_t) { return x + i * kChunkBytes; });
}

namespace {

// Chunk i lands at y + i * kChunkBytes, or where y is null in a buffer of the thread's that
// sink reads (a chunk stored as it is is read where it lies).
void decode_frame(Spec s, const uint8_t* in, size_t raw, uint8_t* y, const ChunkSink* sink) {
  if (s.id != CodecId::lz4 && s.id != CodecId::blosc) gpu_only(s.id);
  const size_t m = frame_chunks(raw), cap = frame_bound(raw);
  auto corrupt = [&](size_t i) {
    return Error(ErrorKind::codec, "corrupt lossless frame: chunk " + std::to_string(i) + " of " + std::to_string(m) +
                                       " does not decode to its " + std::to_string(chunk_len(raw, i)) + " bytes");
  };
  // Where each chunk starts, from the header: checked before anything is read at them.
  std::vector<size_t> at(m + 1, frame_header_bytes(m));
  std::vector<uint32_t> words(m);
  for (size_t i = 0; i < m; ++i) {
    std::memcpy(&words[i], in + 4 * i, 4);
    const size_t len = chunk_len(raw, i), stored = words[i] & ~kRawChunk;
    if (!((words[i] & kRawChunk) ? stored == len : stored < len) || stored > cap - at[i]) throw corrupt(i);
    at[i + 1] = at[i] + frame_align(stored);
  }
  std::atomic<size_t> bad{m};  // the first chunk that did not decode
  parallel_ranges(m, kMinChunks, [&](size_t a, size_t b) {
    for (size_t i = a; i < b; ++i) {
      const size_t len = chunk_len(raw, i), stored = words[i] & ~kRawChunk;
      thread_local std::vector<uint8_t> buf;
      if (!y) buf.resize(kChunkBytes);
      uint8_t* into = y ? y + i * kChunkBytes : buf.data();
      bool ok = true;
      if (words[i] & kRawChunk && !y)
        into = const_cast<uint8_t*>(in + at[i]);  // read only, by sink
      else if (words[i] & kRawChunk)
        std::memcpy(into, in + at[i], len);
      else if (s.id == CodecId::blosc)
        ok = blosc_decompress_chunk(in + at[i], stored, into, len);
      else
        ok = lz4_decompress_block(in + at[i], stored, into, len);
      if (ok && sink) (*sink)(i, into, len);
      if (ok) continue;
      size_t seen = bad.load();
      while (i < seen && !bad.compare_exchange_weak(seen, i)) {
      }
    }
  });
  if (bad.load() < m) throw corrupt(bad.load());
}

}  // namespace

void host_frame_decode(Spec s, const uint8_t* in, size_t raw, uint8_t* y) { decode_frame(s, in, raw, y, nullptr); }
void host_frame_decode(Spec s, const uint8_t* in, size_t raw, const ChunkSink& sink) {
  decode_frame(s, in, raw, nullptr, &sink);
}

size_t lz4_compress_block(const uint8_t* src, size_t n, uint8_t* dst, size_t cap) {
  uint8_t* op = dst;
  const uint8_t* end = dst + cap;
  size_t anchor = 0;
  if (n > kMatchFromEnd) {
    std::vector<uint32_t> table(size_t(1) << kHashBits, UINT32_MAX);
    const size_t last_start = n - kMatchFromEnd, match_end = n - kLastLiterals;
    for (size_t ip = 0; ip <= last_start;) {
      uint32_t v = read32(src + ip), h = hash4(v), ref = table[h];
      table[h] = uint32_t(ip);
      if (ref == UINT32_MAX || ip - ref > kMaxOffset || read32(src + ref) != v) {
        ip += 1 + ((ip - anchor) >> 6);  // skip faster through data that does not repeat
        continue;
      }
      size_t len = kMinMatch;
      while (ip + len + 8 <= match_end && read64(src + ref + len) == read64(src + ip + len)) len += 8;
      while (ip + len < match_end && src[ref + len] == src[ip + len]) ++len;
      if (!put_sequence(op, end, src + anchor, ip - anchor, ip - ref, len)) return 0;
      ip += len;
      anchor = ip;
    }
  }
  if (!put_sequence(op, end, src + anchor, n - anchor, 0, 0)) return 0;
  return size_t(op - dst);
}

bool lz4_decompress_block(const uint8_t* src, size_t n, uint8_t* dst, size_t out_n) {
  const uint8_t *ip = src, *iend = src + n;
  size_t op = 0;
  for (;;) {
    if (ip >= iend) return false;
    const uint8_t token = *ip++;
    size_t nlit = token >> 4;
    if (nlit == 15 && !get_length(ip, iend, nlit)) return false;
    if (size_t(iend - ip) < nlit || out_n - op < nlit) return false;
    std::memcpy(dst + op, ip, nlit);
    ip += nlit, op += nlit;
    if (ip == iend) return op == out_n;
    if (iend - ip < 2) return false;
    const size_t offset = size_t(ip[0]) | size_t(ip[1]) << 8;
    ip += 2;
    size_t mlen = token & 15;
    if (mlen == 15 && !get_length(ip, iend, mlen)) return false;
    mlen += kMinMatch;
    if (offset == 0 || offset > op || out_n - op < mlen) return false;
    // A match repeats the `offset` bytes before it, period `offset` when it overlaps what it
    // writes (a run of zeros is one such match): copied from its start in runs that double,
    // each reading only bytes already written.
    for (size_t done = 0, run = offset; done < mlen; done += run, run += run)
      std::memcpy(dst + op + done, dst + op - offset, std::min(run, mlen - done));
    op += mlen;
  }
}

}  // namespace mpicomp
