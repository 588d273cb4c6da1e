// Layer 1, host memory: codec bound, error-bounded compression. Every finite element is
// quantised to an integer code with the step that keeps it within the bound (uniform
// quantisation, as SZ and ZCCL's SZp do), and the codes are compressed losslessly by
// C-Blosc2 (bit shuffle, then lz4 or zstd): smooth data costs few bits, noise what its
// entropy asks. Per chunk of codes, the encoder keeps the codes or the differences of
// neighbours' codes, whichever is smaller (a smooth field's differences are near zero; a
// noisy one's are twice its codes). NaN and +/-Inf have codes of their own and decode as
// they were.
//
// The bound of one encoding is absolute; a collective splits the bound the user gives over
// the encodings a value goes through (coll/budget.h), so that it holds on the result.
//
// Frame (format.h: bound_head_bytes): [float64 step][u8 code bytes, 4 or 8][7 zero bytes]
// [a bit per chunk of codes, 1 = differences][zeros to kFrameAlign][lossless frame of the
// codes]; codes are zigzag-coded (0, -1, 1, -2 ... -> 0, 1, 2, 3 ...) so that small
// magnitudes have zero high bits, which the bit shuffle gathers.
#pragma once
#include <cstddef>
#include <cstdint>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "format.h"

namespace mpicomp {

// Spec::block of codec bound: the bound's float64 exponent and 18 leading mantissa bits
// (bits 2-30; the rest cut: rounded down, never looser than asked), bit 31 set for a bound
// relative to the largest magnitude (of the result, in a collective; of the input, in one
// encoding), bit 1 set for a collective's share of a bound (coll/budget.h, which sets aside
// the output's rounding itself), bit 0 the compressor of the codes (1: lz4, 0: zstd).
constexpr uint32_t kBoundRel = 0x80000000u, kBoundStage = 2u, kBoundLz4 = 1u, kBoundBits = 0x7ffffffcu;
// The bounds codec bound takes: float64's normal range.
constexpr double kBoundMax = 1.7976931348623157e308, kBoundMin = 2.2250738585072014e-308;
uint32_t bound_options(double bound, bool relative, bool lz4, bool stage = false);
inline double bound_value(uint32_t block) {
  const uint64_t bits = uint64_t(block & kBoundBits) << 32;
  double v;
  std::memcpy(&v, &bits, sizeof v);
  return v;
}
inline bool bound_relative(uint32_t block) { return (block & kBoundRel) != 0; }

// v, or for a finite v beyond dtype t's largest finite value, that value with v's sign: a
// decoded value (a code times the step) may pass it where the input was just below it, and
// the largest value is nearer the input than Inf. (float64 needs no clamp.)
inline double saturated(double v, DType t) {
  const double top = t == DType::f16 ? 65504.0 : t == DType::bf16 ? 3.3895313892515355e38 : 3.4028234663852886e38;
  const double clamped = std::min(std::max(v, -top), top);  // selects, without branches: vectorises
  return std::fabs(v) <= 1.7976931348623157e308 ? clamped : v;
}

// Rounding a value v to dtype t errs by at most bound_rounding(t) * |v| + bound_underflow(t):
// half a unit in the last place, and half the subnormal step. 16-bit outputs are rounded
// through float32 (format.h: store_f32), which adds float32's half unit.
inline double bound_rounding(DType t) {
  return t == DType::f64 ? 0x1p-53 : t == DType::f16 ? 0x1p-11 + 0x1p-24 : t == DType::bf16 ? 0x1p-8 + 0x1p-24 : 0x1p-24;
}
inline double bound_underflow(DType t) {
  return t == DType::f64 ? 0x1p-1074 : t == DType::f16 ? 0x1p-25 + 0x1p-150 : t == DType::bf16 ? 0x1p-134 + 0x1p-150
                                                                                                 : 0x1p-150;
}

// v for an error message: 3 significant digits (the bound's messages, here and coll/budget.h).
std::string shown(double v);

// Largest finite |x| over n elements of float dtype t (0 if none).
double finite_absmax(DType t, const void* x, size_t n);

// Encodes n elements of x (a float dtype) into out (room for encoded_bytes): every finite
// element decodes within the bound of Spec::block (relative: times finite_absmax of x), its
// rounding back to dtype t included (but for a collective's share, kBoundStage); returns the
// bytes written. A bound that rounding to t would use half of, or finer than 2^-38 of the
// data's magnitude (the codes would not be exact in float64), raises a codec Error.
size_t bound_encode(Spec s, DType t, const void* x, size_t n, uint8_t* out);
// y (n elements of dtype t) = the decoded values times scale, rounded once to t.
void bound_decode(const uint8_t* in, size_t n, double scale, DType t, void* y);
// acc = base + the decoded values (acc, base of dtype sum_t; base null: acc += them).
void bound_decode_accumulate(const uint8_t* in, size_t n, DType sum_t, void* acc, const void* base);

}  // namespace mpicomp
