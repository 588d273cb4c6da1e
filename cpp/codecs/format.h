// The wire format of every mpicomp codec, and the per-element / per-block arithmetic that
// produces it. This header is the single definition of that arithmetic: the CPU loops
// (cpu_kernels.inc, compiled once per SIMD target) and the CUDA kernels (cuda/kernels.cu)
// both call these functions, so bytes encoded on one decode bit-identically on the other and
// the CPU tests exercise exactly what the GPU runs.
//
// Layout of a blockwise codec (int8, int4, sign) for n elements with block size B:
//   ceil(n / B) records, record k = [float32 scale (little endian)][payload of block k]
//   payload: int8 -> len bytes (two's complement q, |q| <= 127)
//            int4 -> ceil(len/2) bytes, element 2m in the low nibble of byte m, q in [-7, 7]
//            sign -> ceil(len/8) bytes, element e is bit (e % 8) of byte e / 8, 1 = negative
// Every record but the last has len = B; B is a multiple of kLanes so a record is 4-aligned.
// fp16 / bf16: n little-endian 16-bit words. none: the input bytes as they are.
//
// Lossless codecs (lz4, bitcomp, ans) compress the input's bytes in chunks of kChunkBytes
// (the last may be shorter), each on its own so that a GPU compresses them in parallel:
//   [u32 word per chunk, padded to kFrameAlign][chunk 0][chunk 1]...
// word i = stored size of chunk i; its high bit (kRawChunk) says the chunk is stored as it
// is, because compressing did not make it smaller. Every chunk starts at a multiple of
// kFrameAlign (what nvCOMP asks of its inputs) and the frame's size is one too, so frames
// laid end to end stay aligned. lz4 chunks are LZ4 blocks (the lz4 library's block format,
// which nvCOMP's LZ4 writes and reads too); bitcomp and ans chunks are nvCOMP's own formats.
//
// A block that holds a NaN or +/-Inf gets a NaN scale, so all of its decoded elements are
// NaN: compression never turns a non-finite gradient into a finite one (loss scaling relies
// on seeing it).
#pragma once
#include <cstddef>
#include <cstdint>

#include <cmath>
#include <cstring>

#if defined(__CUDACC__)
#define MPICOMP_HD __host__ __device__ __forceinline__
#else
#define MPICOMP_HD inline
#endif

namespace mpicomp {

enum class DType : uint8_t { f32 = 0, f16 = 1, bf16 = 2, f64 = 3, i8 = 4, u8 = 5, i16 = 6, i32 = 7, i64 = 8 };
constexpr int kDTypes = 9;
enum class CodecId : uint8_t {
  none = 0, fp16 = 1, bf16 = 2, int8 = 3, int4 = 4, sign = 5, lz4 = 6, blosc = 7, bitcomp = 8, ans = 9, bound = 10
};

// Spec names (as mpicomp.codec() takes them) by CodecId. bitcomp and ans run on GPUs only
// (device_only), blosc and bound on host memory only.
constexpr int kCodecs = 11;
inline const char* codec_name(CodecId c) {
  static const char* names[kCodecs] = {"none", "fp16", "bf16", "int8", "int4", "sign", "lz4", "blosc", "nvcomp-bitcomp",
                                       "nvcomp-ans", "bound"};
  return int(c) < kCodecs ? names[int(c)] : "unknown";
}

// A codec together with its options; what both ends of a transfer must agree on.
struct Spec {
  CodecId id = CodecId::none;
  uint32_t block = 256;  // elements per scale record (blockwise codecs); blosc: its options (blosc.h)
};

constexpr uint32_t kLanes = 32;        // one CUDA warp; also the CPU's partial-sum width
constexpr uint32_t kMaxBlock = 65536;  // largest block: keeps a record's payload in int range
constexpr size_t kScaleBytes = 4;
constexpr size_t kChunkBytes = 65536;  // lossless chunk (nvCOMP's suggested size; a multiple of kFrameAlign)
constexpr size_t kFrameAlign = 16;
constexpr uint32_t kRawChunk = 0x80000000u;

MPICOMP_HD size_t dtype_size(DType t) {
  switch (t) {
    case DType::f64: case DType::i64: return 8;
    case DType::f32: case DType::i32: return 4;
    case DType::f16: case DType::bf16: case DType::i16: return 2;
    default: return 1;
  }
}
MPICOMP_HD bool is_float(DType t) { return t <= DType::f64; }
// numpy's and torch's names (mpicomp.codecs' dtype names, the bindings' DTYPES).
inline const char* dtype_name(DType t) {
  static const char* names[kDTypes] = {"float32", "float16", "bfloat16", "float64", "int8",
                                       "uint8",   "int16",   "int32",    "int64"};
  return int(t) < kDTypes ? names[int(t)] : "unknown";
}
MPICOMP_HD bool is_blockwise(CodecId c) { return c == CodecId::int8 || c == CodecId::int4 || c == CodecId::sign; }
MPICOMP_HD bool is_lossless(CodecId c) { return c >= CodecId::lz4 && c <= CodecId::ans; }
// Codecs whose frames a decoder checks (a damaged one raises a codec Error): the lossless
// codecs and bound (whose codes are a lossless frame).
MPICOMP_HD bool is_framed(CodecId c) { return is_lossless(c) || c == CodecId::bound; }
MPICOMP_HD bool device_only(CodecId c) { return c == CodecId::bitcomp || c == CodecId::ans; }
// What a reduction of dtype t with codec `wire` sums in: float64 in float64 where the wire
// carries it exactly (none, and the lossless codecs, whose frames restore it), float32 for
// everything else (the lossy codecs quantise in float32; 16-bit floats are widened), except
// codec bound, which sums every dtype in float64: its error budget (bound.h) then loses
// nothing to the sums' rounding.
MPICOMP_HD DType acc_dtype(CodecId wire, DType t) {
  return wire == CodecId::bound || (t == DType::f64 && (wire == CodecId::none || is_lossless(wire))) ? DType::f64
                                                                                                     : DType::f32;
}
MPICOMP_HD size_t frame_align(size_t b) { return (b + kFrameAlign - 1) / kFrameAlign * kFrameAlign; }
MPICOMP_HD size_t frame_chunks(size_t raw) { return (raw + kChunkBytes - 1) / kChunkBytes; }
MPICOMP_HD size_t frame_header_bytes(size_t chunks) { return frame_align(4 * chunks); }
// Largest frame of `raw` input bytes: every chunk stored as it is.
MPICOMP_HD size_t frame_bound(size_t raw) {
  size_t m = frame_chunks(raw);
  return m ? frame_header_bytes(m) + (m - 1) * kChunkBytes + frame_align(raw - (m - 1) * kChunkBytes) : 0;
}

// Largest quantised magnitude of the integer codecs.
MPICOMP_HD int qmax(CodecId c) { return c == CodecId::int8 ? 127 : 7; }

MPICOMP_HD size_t payload_bytes(CodecId c, size_t len) {
  return c == CodecId::int8 ? len : c == CodecId::int4 ? (len + 1) / 2 : (len + 7) / 8;
}
MPICOMP_HD size_t record_bytes(CodecId c, size_t len) { return kScaleBytes + payload_bytes(c, len); }

// The size of the frame at f (its header read), never more than frame_bound.
inline size_t frame_bytes(const uint8_t* f, size_t raw) {
  const size_t m = frame_chunks(raw), cap = frame_bound(raw);
  size_t pos = frame_header_bytes(m);
  for (size_t i = 0; i < m && pos <= cap; ++i) {
    uint32_t word;
    std::memcpy(&word, f + 4 * i, 4);
    pos += frame_align(word & ~kRawChunk);
  }
  return pos < cap ? pos : cap;
}

// Codec bound (bound.h): a 16-byte head (the step, the codes' width), a bit per chunk of
// codes (1: the chunk holds differences of neighbours' codes), padded to kFrameAlign, then a
// lossless frame of the codes (4 or 8 bytes each). The largest: 8-byte codes, whatever the
// dtype, so that a frame encoded from float64 sums decodes into float32 output.
constexpr size_t kBoundHead = 16;
MPICOMP_HD size_t bound_head_bytes(size_t code_bytes) { return kBoundHead + frame_align((frame_chunks(code_bytes) + 7) / 8); }
MPICOMP_HD size_t bound_frame_bound(size_t n) { return bound_head_bytes(8 * n) + frame_bound(8 * n); }

// Encoded size of n elements of dtype t: exact for lossy codecs (their output is never
// padded), the largest a frame can be for lossless ones and bound (what a receiver makes
// room for).
MPICOMP_HD size_t encoded_bytes(Spec s, DType t, size_t n) {
  switch (s.id) {
    case CodecId::none: return n * dtype_size(t);
    case CodecId::bound: return n ? bound_frame_bound(n) : 0;
    case CodecId::lz4: case CodecId::blosc: case CodecId::bitcomp: case CodecId::ans: return frame_bound(n * dtype_size(t));
    case CodecId::fp16: case CodecId::bf16: return 2 * n;
    default: {
      size_t full = n / s.block, rem = n % s.block;
      return full * record_bytes(s.id, s.block) + (rem ? record_bytes(s.id, rem) : 0);
    }
  }
}

// ---- bit casts and 16-bit float conversions (round to nearest even, NaN stays NaN) ----
MPICOMP_HD uint32_t f32_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u; std::memcpy(&u, &f, 4); return u;
#endif
}
MPICOMP_HD float bits_f32(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f; std::memcpy(&f, &u, 4); return f;
#endif
}

// The conversions below compute every case and select one, without branches, so that the
// CPU loops over them vectorise (an early return per case kept them scalar: 0.8 GB/s).
MPICOMP_HD uint16_t f32_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  // One NaN for all NaNs: the GPU's arithmetic does not keep NaN payloads or signs as the
  // CPU's does, and the encoded bytes must not depend on where they were made.
  uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  // Finite values that round past bfloat16's largest (3.3895e38, within half a step of it)
  // keep it: finite input never decodes to Inf.
  uint32_t a = u & 0x7fffffffu;
  rounded = a >= 0x7f7f8000u && a < 0x7f800000u ? ((u >> 16) & 0x8000u) | 0x7f7fu : rounded;
  return uint16_t(a > 0x7f800000u ? 0x7fc0u : rounded);
}
MPICOMP_HD float bf16_to_f32(uint16_t h) { return bits_f32(uint32_t(h) << 16); }

MPICOMP_HD uint16_t f32_to_f16(float f) {
  uint32_t u = f32_bits(f);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t a = u & 0x7fffffffu;
  // Normal in f16: rebias the exponent (-112 << 23) and round to nearest even.
  uint32_t normal = (a + 0xc8000fffu + ((a >> 13) & 1u)) >> 13;
  // Subnormal or zero in f16: adding 0.5 (2^-1) aligns the f16 subnormal grid (2^-24) with
  // float's last mantissa bit, so the FPU does the round-to-nearest-even.
  uint32_t subnormal = f32_bits(bits_f32(a) + 0.5f) - 0x3f000000u;
  uint32_t h = a < 0x38800000u ? subnormal : normal;
  h = a >= 0x477ff000u ? 0x7c00u : h;           // rounds to >= 65520: Inf
  return uint16_t(a > 0x7f800000u ? 0x7e00u : (sign | h));  // NaN: one for all (see bf16)
}
MPICOMP_HD float f16_to_f32(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t a = h & 0x7fffu;
  uint32_t special = 0x7f800000u | (a & 0x3ffu) << 13;                  // Inf / NaN
  uint32_t subnormal = f32_bits(float(int32_t(a)) * 5.9604644775390625e-8f);  // a * 2^-24, exact
  uint32_t normal = (a << 13) + 0x38000000u;
  return bits_f32(sign | (a >= 0x7c00u ? special : a < 0x0400u ? subnormal : normal));
}

// ---- blockwise arithmetic ----
// Running absmax that makes NaN sticky (a plain max would drop it); Inf wins on its own.
MPICOMP_HD float absmax_step(float m, float x) {
  float a = fabsf(x);
  return (a > m || a != a) ? a : m;
}
MPICOMP_HD bool absmax_bad(float m) { return !(m <= 3.402823466e+38f); }  // NaN or Inf
// |x| as an ordered integer: for non-negative floats integer order is float order and every
// NaN pattern lies above +Inf, so the largest abs_bits of a block is its absmax_step result
// (a NaN when it holds one) in one integer max per element.
MPICOMP_HD uint32_t abs_bits(float x) { return f32_bits(x) & 0x7fffffffu; }

// The record's scale: what one quantisation step of magnitude qmax decodes to.
MPICOMP_HD float int_scale(CodecId c, float absmax) {
  if (absmax_bad(absmax)) return bits_f32(0x7fc00000u);
  float s = absmax / float(qmax(c));
  // Rounded up, qmax * s passes the largest float for absmax near it: one step down keeps
  // every decoded value of a finite block finite.
  return float(qmax(c)) * s <= 3.402823466e+38f ? s : bits_f32(f32_bits(s) - 1u);
}
// Blocks whose absmax lies below 2^-64 are quantised lifted by 2^64 (x * 2^64 against
// absmax * 2^64). Unlifted, qmax / absmax overflows float32 below ~3.7e-37 (int8) and
// ~2.1e-38 (int4), and x * inf turned positive values into -qmax; lifted, the arithmetic also
// stays off subnormal numbers, which some CPUs run tens of times slower. The record's scale
// is absmax / qmax either way, so decoding does not know about it.
MPICOMP_HD bool int_lifted(float absmax) { return absmax < 5.421010862427522e-20f; }  // 2^-64
// x * 2^64 for |x| < 2^-64, exact and without subnormal arithmetic: a normal x's exponent
// field moves up by 64; a subnormal one, m * 2^-149 for its integer mantissa m, becomes
// m * 2^-85 (an integer conversion and a multiply of normal numbers).
MPICOMP_HD float lift(float x) {
  uint32_t b = f32_bits(x), mag = b & 0x7fffffffu;
  uint32_t up = mag < 0x00800000u ? f32_bits(float(int32_t(mag)) * 2.5849394142282115e-26f) : mag + (64u << 23);
  return bits_f32((b & 0x80000000u) | up);
}
// Multiplier from (lifted, for a lifted block) value to quantised units; 0 for an all-zero
// (or poisoned) block.
MPICOMP_HD float int_inv_scale(CodecId c, float absmax) {
  if (!(absmax > 0.f) || absmax_bad(absmax)) return 0.f;
  return float(qmax(c)) / (int_lifted(absmax) ? lift(absmax) : absmax);
}
// Quantisation of a finite x with a finite multiplier (every element of a block whose
// absmax is finite): no NaN can arise, so the CPU loops need no NaN test per element.
MPICOMP_HD int quantize_finite(float x, float inv, int q) {
  int y = int(rintf(x * inv));  // round half to even, on the host and on the GPU
  return y > q ? q : y < -q ? -q : y;  // integer clamp: vectorises as min / max
}
// Any x: a poisoned block (inv = 0) quantises to 0 everywhere, Inf * 0 included.
MPICOMP_HD int quantize(float x, float inv, int q) {
  float y = x * inv;
  return y == y ? quantize_finite(x, inv, q) : 0;
}
MPICOMP_HD float dequantize(int q, float scale) { return float(q) * scale; }
MPICOMP_HD uint8_t pack_nibbles(int lo, int hi) { return uint8_t((lo & 0xf) | ((hi & 0xf) << 4)); }
MPICOMP_HD constexpr int nibble_lo(uint8_t b) { return int(int8_t(uint8_t(b << 4))) >> 4; }
MPICOMP_HD constexpr int nibble_hi(uint8_t b) { return int(int8_t(b)) >> 4; }

// sign codec: x ~ sign(x) * mean(|x|) over the block. The mean's summation order is fixed so
// CPU and GPU agree to the bit: lane j (0..31) sums |x[32 i + j]| for i = 0, 1, ... in order,
// then the 32 lane sums are folded as a warp's shuffle-down tree (offsets 16, 8, 4, 2, 1).
MPICOMP_HD float sign_scale(float abssum, size_t len) {
  return (abssum == abssum && abssum <= 3.402823466e+38f) ? abssum / float(len) : bits_f32(0x7fc00000u);
}
// A finite block whose sum of magnitudes overflows float32 (mean magnitude near 3.4e38 / len)
// is summed again, in the same order, as |x| * 2^-64 (exact for such magnitudes): its scale
// is that mean times 2^64, saturated at the largest float, so finite input decodes finite. A
// block holding Inf still sums to Inf, and NaN to NaN: poisoned.
MPICOMP_HD bool sign_overflowed(float abssum) { return abssum > 3.402823466e+38f; }
constexpr float kSignLow = 5.421010862427522e-20f;  // 2^-64
MPICOMP_HD float sign_scale_low(float abssum_low, size_t len) {
  if (!(abssum_low <= 3.402823466e+38f)) return bits_f32(0x7fc00000u);
  float s = abssum_low / float(len) * 1.8446744073709552e19f;  // * 2^64
  return s <= 3.402823466e+38f ? s : 3.402823466e+38f;
}
MPICOMP_HD bool sign_bit(float x) { return x < 0.f; }
MPICOMP_HD float sign_value(bool negative, float scale) { return negative ? -scale : scale; }

// Folds 32 lane partial sums in the warp's tree order (lane sums in p[0..31], result in p[0]).
MPICOMP_HD float fold_lanes(float* p) {
  for (uint32_t off = kLanes / 2; off > 0; off >>= 1)
    for (uint32_t j = 0; j < off; ++j) p[j] += p[j + off];
  return p[0];
}

// Loading any float dtype as float32, and storing float32 as it.
MPICOMP_HD float load_f32(const void* x, DType t, size_t i) {
  switch (t) {
    case DType::f32: return static_cast<const float*>(x)[i];
    case DType::f16: return f16_to_f32(static_cast<const uint16_t*>(x)[i]);
    case DType::bf16: return bf16_to_f32(static_cast<const uint16_t*>(x)[i]);
    default: return float(static_cast<const double*>(x)[i]);
  }
}
MPICOMP_HD void store_f32(void* y, DType t, size_t i, float v) {
  switch (t) {
    case DType::f32: static_cast<float*>(y)[i] = v; break;
    case DType::f16: static_cast<uint16_t*>(y)[i] = f32_to_f16(v); break;
    case DType::bf16: static_cast<uint16_t*>(y)[i] = f32_to_bf16(v); break;
    default: static_cast<double*>(y)[i] = double(v); break;
  }
}

}  // namespace mpicomp
