// CUDA kernels of the codecs. Blockwise encoding gives each record (codec block) to one warp:
// lane j handles elements j, j + 32, j + 64, ..., which is the lane order format.h fixes for
// the sign codec's abs-sum, so every result is bit-identical to the CPU's (nvcc --fmad=false
// matches the CPU's -ffp-contract=off). Decoding is one thread per element.
// Every launch goes through launch(), so that tests/fake_cuda can compile this file as C++
// and run the same kernels on the CPU (a warp's lanes as fibers) against the CPU codecs.
#include "codec_cuda.h"
#include "runtime.h"

namespace mpicomp::cuda {
namespace {

constexpr unsigned kFull = 0xffffffffu;
constexpr int kThreads = 256;

__device__ __forceinline__ float warp_absmax(float m) {
  for (int off = 16; off > 0; off >>= 1) m = absmax_step(m, __shfl_xor_sync(kFull, m, off));
  return m;
}

// The lane partial sums folded in fold_lanes' order (shuffle-down tree), then broadcast.
__device__ __forceinline__ float warp_fold(float p) {
  for (int off = 16; off > 0; off >>= 1) p += __shfl_down_sync(kFull, p, off);
  return __shfl_sync(kFull, p, 0);
}

__device__ __forceinline__ float input(const void* x, DType t, const float* res, size_t i) {
  float v = load_f32(x, t, i);
  return res ? v + res[i] : v;  // not v + 0.f: that turns -0 into +0, as on the CPU
}

template <CodecId C>
__global__ void encode_blocks(uint32_t B, DType t, const void* x, size_t n, float* res, uint8_t* out) {
  const size_t rec_id = (size_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const unsigned lane = threadIdx.x & 31;
  const size_t off = rec_id * B;
  if (off >= n) return;  // whole warps leave together
  const size_t len = n - off < B ? n - off : B;
  uint8_t* rec = out + rec_id * record_bytes(C, B);
  uint8_t* payload = rec + kScaleBytes;

  float acc = 0.f;
  for (size_t i = lane; i < len; i += 32) {
    float v = input(x, t, res, off + i);
    acc = C == CodecId::sign ? acc + fabsf(v) : absmax_step(acc, v);
  }
  float s, inv = 0.f;
  bool lifted = false;  // the same on every lane: warp_fold and warp_absmax broadcast
  if (C == CodecId::sign) {
    float sum = warp_fold(acc);
    if (sign_overflowed(sum)) {
      acc = 0.f;
      for (size_t i = lane; i < len; i += 32) acc += fabsf(input(x, t, res, off + i)) * kSignLow;
      s = sign_scale_low(warp_fold(acc), len);
    } else {
      s = sign_scale(sum, len);
    }
  } else {
    float am = warp_absmax(acc);
    s = int_scale(C, am);
    inv = int_inv_scale(C, am);
    lifted = int_lifted(am);
  }
  if (lane == 0) *reinterpret_cast<float*>(rec) = s;
  const bool poisoned = s != s;

  for (size_t row = 0; row < len; row += 32) {  // every lane runs every row (shuffles)
    const size_t i = row + lane;
    const bool valid = i < len;
    float v = valid ? input(x, t, res, off + i) : 0.f;
    float d;
    if (C == CodecId::sign) {
      bool neg = valid && sign_bit(v);
      unsigned bits = __ballot_sync(kFull, neg);
      d = sign_value(neg, s);
      size_t nbytes = (len - row) >= 32 ? 4 : (len - row + 7) / 8;
      if (lane < nbytes) payload[row / 8 + lane] = uint8_t(bits >> (8 * lane));
    } else {
      int q = valid ? quantize(lifted ? lift(v) : v, inv, qmax(C)) : 0;
      d = dequantize(q, s);
      if (C == CodecId::int8) {
        if (valid) payload[i] = uint8_t(int8_t(q));
      } else {
        int hi = __shfl_down_sync(kFull, q, 1);
        if (valid && !(lane & 1)) payload[i / 2] = pack_nibbles(q, i + 1 < len ? hi : 0);
      }
    }
    if (res && valid) res[off + i] = poisoned ? 0.f : v - d;
  }
}

template <CodecId C>
__global__ void encode_half(DType t, const void* x, size_t n, float* res, uint16_t* out) {
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    float v = input(x, t, res, i);
    uint16_t h = C == CodecId::fp16 ? f32_to_f16(v) : f32_to_bf16(v);
    out[i] = h;
    if (res) {
      float r = v - (C == CodecId::fp16 ? f16_to_f32(h) : bf16_to_f32(h));
      res[i] = r == r && fabsf(r) <= 3.402823466e+38f ? r : 0.f;
    }
  }
}

// Elements i..i+3 of an encoded stream (i a multiple of 4, all four < n): one division to
// find the record and one load per codec word for four elements. Blocks are multiples of 32,
// so the four share a record.
__device__ __forceinline__ void element4(Spec s, DType t, const uint8_t* in, size_t i, float v[4]) {
  switch (s.id) {
    case CodecId::none:
      for (int e = 0; e < 4; ++e) v[e] = load_f32(in, t, i + e);
      return;
    case CodecId::fp16:
    case CodecId::bf16: {
      uint2 w = *reinterpret_cast<const uint2*>(in + 2 * i);
      uint16_t h[4] = {uint16_t(w.x), uint16_t(w.x >> 16), uint16_t(w.y), uint16_t(w.y >> 16)};
      for (int e = 0; e < 4; ++e) v[e] = s.id == CodecId::fp16 ? f16_to_f32(h[e]) : bf16_to_f32(h[e]);
      return;
    }
    default: {
      size_t k = i / s.block, j = i - k * s.block;
      const uint8_t* rec = in + k * record_bytes(s.id, s.block);
      float scale = *reinterpret_cast<const float*>(rec);
      const uint8_t* p = rec + kScaleBytes;
      if (s.id == CodecId::int8) {
        uint32_t w = *reinterpret_cast<const uint32_t*>(p + j);
        for (int e = 0; e < 4; ++e) v[e] = dequantize(int8_t(uint8_t(w >> (8 * e))), scale);
      } else if (s.id == CodecId::int4) {
        uint16_t w = *reinterpret_cast<const uint16_t*>(p + j / 2);
        for (int e = 0; e < 4; ++e) {
          uint8_t b = uint8_t(w >> (8 * (e / 2)));
          v[e] = dequantize((e & 1) ? nibble_hi(b) : nibble_lo(b), scale);
        }
      } else {
        uint8_t b = uint8_t(p[j / 8] >> (j % 8));
        for (int e = 0; e < 4; ++e) v[e] = sign_value((b >> e) & 1u, scale);
      }
    }
  }
}

// Element i alone (the tail of n that is not a multiple of 4).
__device__ __forceinline__ float element(Spec s, DType t, const uint8_t* in, size_t i) {
  switch (s.id) {
    case CodecId::none: return load_f32(in, t, i);
    case CodecId::fp16: return f16_to_f32(reinterpret_cast<const uint16_t*>(in)[i]);
    case CodecId::bf16: return bf16_to_f32(reinterpret_cast<const uint16_t*>(in)[i]);
    default: {
      size_t k = i / s.block, j = i - k * s.block;
      const uint8_t* rec = in + k * record_bytes(s.id, s.block);
      float scale = *reinterpret_cast<const float*>(rec);
      const uint8_t* p = rec + kScaleBytes;
      if (s.id == CodecId::int8) return dequantize(int8_t(p[j]), scale);
      if (s.id == CodecId::int4) return dequantize((j & 1) ? nibble_hi(p[j / 2]) : nibble_lo(p[j / 2]), scale);
      return sign_value((p[j / 8] >> (j % 8)) & 1u, scale);
    }
  }
}

// Each thread takes four consecutive elements; `op(i, value)` stores or accumulates one.
template <class Op>
__device__ __forceinline__ void for_each_element(Spec s, DType t, const uint8_t* in, size_t n, Op op) {
  const size_t stride = size_t(gridDim.x) * blockDim.x, quads = n / 4;
  for (size_t q = size_t(blockIdx.x) * blockDim.x + threadIdx.x; q < quads; q += stride) {
    float v[4];
    element4(s, t, in, 4 * q, v);
    for (int e = 0; e < 4; ++e) op(4 * q + e, v[e]);
  }
  for (size_t i = 4 * quads + size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    op(i, element(s, t, in, i));
}

__global__ void decode_kernel(Spec s, DType t, const uint8_t* in, size_t n, float scale, void* y) {
  for_each_element(s, t, in, n, [&](size_t i, float v) { store_f32(y, t, i, v * scale); });
}

__global__ void accumulate_kernel(Spec s, DType t, const uint8_t* in, size_t n, float* acc) {
  for_each_element(s, t, in, n, [&](size_t i, float v) { acc[i] += v; });
}

__global__ void store_kernel(const float* acc, size_t n, float scale, DType t, void* y) {
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    store_f32(y, t, i, acc[i] * scale);
}

// float64 sums (host_codec.cpp's add_f64 and host_store): acc += x, and y = acc * scale.
__global__ void accumulate_f64_kernel(const double* x, size_t n, double* acc) {
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    acc[i] += x[i];
}

__global__ void store_f64_kernel(const double* acc, size_t n, double scale, double* y) {
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    y[i] = scale == 1.0 ? acc[i] : acc[i] * scale;
}

template <class... P, class... A>
void launch(const char* what, void (*kernel)(P...), unsigned grid, cudaStream_t st, A... args) {
#if defined(__CUDACC__)
  kernel<<<grid, kThreads, 0, st>>>(args...);
#else
  fake_cuda_launch(grid, kThreads, st, [=] { kernel(args...); }, args...);
#endif
  check(cudaGetLastError(), what);
}

unsigned grid_for(size_t threads) {
  size_t g = (threads + kThreads - 1) / kThreads;
  return unsigned(g < (1u << 20) ? (g ? g : 1) : (1u << 20));  // grid-stride loops cover the rest
}

}  // namespace

bool available() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // no driver or no device: not an error for later calls
    return false;
  }
  return count > 0;
}

// Codec bound's codes are compressed by Blosc2, which has no GPU version.
static void host_only(CodecId c) {
  if (c == CodecId::bound) throw Error(ErrorKind::backend, "codec bound runs on host memory only, not on GPU buffers");
}

void encode(Spec s, DType t, const void* x, size_t n, float* res, uint8_t* out, void* stream) {
  host_only(s.id);
  if (n == 0) return;
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  size_t warps = (n + s.block - 1) / (s.block ? s.block : 1);
  unsigned g = unsigned((warps * 32 + kThreads - 1) / kThreads);
  auto* half = reinterpret_cast<uint16_t*>(out);
  switch (s.id) {
    case CodecId::none: check(cudaMemcpyAsync(out, x, n * dtype_size(t), cudaMemcpyDeviceToDevice, st), "encode"); return;
    case CodecId::fp16: return launch("encode", encode_half<CodecId::fp16>, grid_for(n), st, t, x, n, res, half);
    case CodecId::bf16: return launch("encode", encode_half<CodecId::bf16>, grid_for(n), st, t, x, n, res, half);
    case CodecId::int8: return launch("encode", encode_blocks<CodecId::int8>, g, st, s.block, t, x, n, res, out);
    case CodecId::int4: return launch("encode", encode_blocks<CodecId::int4>, g, st, s.block, t, x, n, res, out);
    case CodecId::sign: return launch("encode", encode_blocks<CodecId::sign>, g, st, s.block, t, x, n, res, out);
    default: return;  // lossless codecs: nvcomp.cpp
  }
}

void decode(Spec s, DType t, const uint8_t* in, size_t n, float scale, void* y, void* stream) {
  host_only(s.id);
  if (n == 0) return;
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  if (s.id == CodecId::none && scale == 1.f) {
    check(cudaMemcpyAsync(y, in, n * dtype_size(t), cudaMemcpyDeviceToDevice, st), "decode");
    return;
  }
  launch("decode", decode_kernel, grid_for((n + 3) / 4), st, s, t, in, n, scale, y);
}

void decode_accumulate(Spec s, DType t, const uint8_t* in, size_t n, DType sum_t, void* acc, void* stream) {
  host_only(s.id);
  if (n == 0) return;
  const auto st = static_cast<cudaStream_t>(stream);
  if (sum_t == DType::f32)
    return launch("decode_accumulate", accumulate_kernel, grid_for((n + 3) / 4), st, s, t, in, n,
                  static_cast<float*>(acc));
  if (s.id != CodecId::none || t != DType::f64)
    throw Error(ErrorKind::argument, "cuda decode_accumulate: float64 sums take float64 elements as they are");
  launch("decode_accumulate", accumulate_f64_kernel, grid_for(n), st, reinterpret_cast<const double*>(in), n,
         static_cast<double*>(acc));
}

void store(DType sum_t, const void* acc, size_t n, double scale, DType t, void* y, void* stream) {
  if (n == 0) return;
  const auto st = static_cast<cudaStream_t>(stream);
  if (sum_t == DType::f32)
    return launch("store", store_kernel, grid_for(n), st, static_cast<const float*>(acc), n, float(scale), t, y);
  if (t != DType::f64) throw Error(ErrorKind::argument, "cuda store: float64 sums are stored as float64");
  launch("store", store_f64_kernel, grid_for(n), st, static_cast<const double*>(acc), n, scale, static_cast<double*>(y));
}

namespace {
// Whole 16-byte words where both ends allow (frame chunks always do), bytes for the rest.
__global__ void copy_chunks_kernel(const ChunkCopy* list) {
  const ChunkCopy c = list[blockIdx.x];
  size_t words = 0;
  if (((reinterpret_cast<uintptr_t>(c.src) | reinterpret_cast<uintptr_t>(c.dst)) & 15) == 0) {
    words = c.bytes / 16;
    for (size_t i = threadIdx.x; i < words; i += blockDim.x)
      reinterpret_cast<uint4*>(c.dst)[i] = reinterpret_cast<const uint4*>(c.src)[i];
  }
  for (size_t i = words * 16 + threadIdx.x; i < c.padded; i += blockDim.x) c.dst[i] = i < c.bytes ? c.src[i] : 0;
}
}  // namespace

void copy_chunks(const ChunkCopy* list, size_t count, void* stream) {
  if (count == 0) return;
  launch("copy_chunks", copy_chunks_kernel, unsigned(count), static_cast<cudaStream_t>(stream), list);
}

}  // namespace mpicomp::cuda
