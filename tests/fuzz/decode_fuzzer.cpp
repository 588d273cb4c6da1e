// libFuzzer target: every host decoder (codecs none, fp16, bf16, int8, int4, sign, lz4, blosc, bound; each
// SIMD target this CPU runs) on arbitrary bytes. Built with ASan and UBSan by `make fuzz`
// (long runs) and tests/test_fuzz.py (a bounded run in `make test`). Input: codec, dtype,
// block and SIMD target, element count (2 bytes), then the frame. The frame is copied into a
// buffer of exactly encoded_bytes(), the output into one of exactly n elements, so a decoder
// that reads past its frame or writes past its output stops the run. What must hold: lossy
// frames always decode (any bytes are a valid frame); a lossless or bound frame decodes or
// raises a codec Error, and a lossless one that decodes restores bytes that encode and decode
// back to themselves.
#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "codecs/blosc.h"
#include "codecs/codec.h"
#include "codecs/host_codec.h"
#include "codecs/errors.h"

using namespace mpicomp;

namespace {

const CodecId kFuzzCodecs[] = {CodecId::none, CodecId::fp16, CodecId::bf16, CodecId::int8, CodecId::int4,
                               CodecId::sign, CodecId::lz4, CodecId::blosc, CodecId::bound};
const unsigned kBloscCompressors[] = {0, 1, 2, 4, 5};  // blosclz, lz4, lz4hc, zlib, zstd
// What each codec takes (codecs.py, check_combination): lossless frames carry any dtype's
// bytes; the others decode floating-point data, float64 with none and bound only.
const DType kFloats[] = {DType::f32, DType::f16, DType::bf16};
const DType kAny[] = {DType::f32, DType::f16, DType::bf16, DType::f64, DType::i8, DType::i32, DType::i64};

// Runs f; a codec Error is fine where `may_fail`, anything else escaping is a finding.
template <class F>
bool decodes(bool may_fail, F&& f) {
  try {
    f();
    return true;
  } catch (const Error& e) {
    if (may_fail && e.kind == ErrorKind::codec) return false;
    std::fprintf(stderr, "decoder raised: %s\n", e.what());
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 5) return 0;
  static const std::vector<std::string> targets = cpu_targets();
  const CodecId c = kFuzzCodecs[data[0] % 9];
  const bool lossless = is_lossless(c), framed = is_framed(c);
  const DType t = lossless ? kAny[data[1] % 7]
                  : c == CodecId::none || c == CodecId::bound ? kAny[data[1] % 4]
                                                              : kFloats[data[1] % 3];
  const Spec s{c, c == CodecId::blosc ? blosc_options(kBloscCompressors[data[2] % 5], data[2] / 5 % 3, 1)
                                      : 32u * (1u + data[2] % 8)};
  set_cpu_target(targets[(data[2] >> 3) % targets.size()]);
  const size_t n = data[3] | size_t(data[4]) << 8;
  data += 5, size -= 5;

  std::vector<uint8_t> frame(encoded_bytes(s, t, n));
  if (!frame.empty()) std::memcpy(frame.data(), data, std::min(size, frame.size()));
  std::vector<uint8_t> y(n * dtype_size(t));
  const bool ok = decodes(framed, [&] { host_decode(s, t, frame.data(), n, 1.f, y.data()); });
  if (is_float(t) && (t != DType::f64 || framed)) {  // float64 sums: lossless and bound frames', in float64
    const DType sum_t = acc_dtype(s.id, t);
    std::vector<uint8_t> acc(n * dtype_size(sum_t));
    decodes(framed, [&] { host_decode_accumulate(s, t, frame.data(), n, sum_t, acc.data()); });
  }
  if (lossless && ok) {
    std::vector<uint8_t> again(encoded_bytes(s, t, n)), back(y.size());
    host_encode(s, t, y.data(), n, nullptr, again.data());
    host_decode(s, t, again.data(), n, 1.f, back.data());
    if (back != y) std::abort();
  }
  return 0;
}
