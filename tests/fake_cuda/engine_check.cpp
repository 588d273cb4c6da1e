// The GPU engine's host-side logic on a machine without a GPU (tests/test_fake_cuda.py): the
// collectives run with cuda_engine on fake device memory (fake_runtime.cpp) and nvCOMP's
// stand-in (fake_nvcomp.cpp), and must give the host engine's bytes exactly, staged through
// pinned buffers or (argv[2] == "direct") passed to MPI as they are.
//   mpiexec -n N engine_check FAKE_NVCOMP.so staged|direct
#include <mpi.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "../../cpp/codecs/cuda/codec_cuda.h"
#include "../../cpp/coll/coll.h"
#include "../../cpp/coll/config.h"
#include "../../cpp/core/errors.h"
#include "cuda_runtime.h"

using namespace mpicomp;

namespace {

int g_failed = 0, g_rank = 0;

void expect(bool ok, const std::string& what) {
  if (!ok) {
    ++g_failed;
    std::fprintf(stderr, "rank %d: FAIL %s\n", g_rank, what.c_str());
  }
}

// Runs of zeros between stretches of noise, different on every rank.
std::vector<float> data(size_t n, int seed) {
  std::mt19937 g(seed * 7919 + g_rank);
  std::normal_distribution<float> d;
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) x[i] = (i / 3000) % 3 ? 0.f : d(g);
  return x;
}

float* to_device(const std::vector<float>& h, size_t offset) {  // offset elements into the allocation
  void* p;
  cudaMalloc(&p, (h.size() + offset + 1) * sizeof(float));
  float* d = static_cast<float*>(p) + offset;
  cudaMemcpyAsync(d, h.data(), h.size() * sizeof(float), cudaMemcpyHostToDevice, nullptr);
  return d;
}
std::vector<float> to_host(const float* d, size_t n) {
  std::vector<float> h(n);
  cudaMemcpyAsync(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost, nullptr);
  return h;
}

void run_one(Coll coll, CodecId codec, size_t n, size_t offset, bool avg, bool feedback, bool direct) {
  const int p = [] { int s; MPI_Comm_size(MPI_COMM_WORLD, &s); return s; }();
  const size_t in = coll == Coll::reduce_scatter ? n * p : n, out = coll == Coll::allgather ? n * p : n;
  std::vector<float> x = data(in, int(n + offset));
  CollArgs a;
  // The host reference: lossless codecs all restore the same bytes, so host lz4 stands in
  // for the GPU-only ones.
  a.spec = Spec{is_lossless(codec) ? CodecId::lz4 : codec, 256};
  a.dtype = DType::f32;
  a.count = n;
  a.avg = avg;
  std::vector<float> y(out), res_h(in, 0.f);
  a.residual = feedback ? res_h.data() : nullptr;
  collective(coll, MPI_COMM_WORLD, x.data(), y.data(), a);

  float* dx = to_device(x, offset);
  float* dy = to_device(std::vector<float>(out, -1.f), offset);
  float* dres = feedback ? to_device(std::vector<float>(in, 0.f), 0) : nullptr;
  a.spec.id = codec;
  a.residual = dres;
  a.engine = &cuda_engine(nullptr, direct);
  collective(coll, MPI_COMM_WORLD, dx, dy, a);
  a.engine->finish();
  std::vector<float> got = to_host(dy, out);
  std::string what = std::string(coll == Coll::allreduce ? "allreduce" : coll == Coll::allgather ? "allgather"
                                                                                                  : "reduce_scatter") +
                     " codec " + codec_name(codec) + " n " + std::to_string(n) + " offset " + std::to_string(offset) +
                     (avg ? " avg" : "") + (feedback ? " feedback" : "");
  if (codec == CodecId::none && coll != Coll::allgather) {  // the host sums through MPI: another order
    bool close = true;
    for (size_t i = 0; i < out; ++i) close &= std::fabs(got[i] - y[i]) <= 1e-5f * (std::fabs(y[i]) + 1.f);
    expect(close, what + ": values");
  } else {
    expect(std::memcmp(got.data(), y.data(), out * sizeof(float)) == 0, what + ": bytes");
  }
  if (feedback) expect(to_host(dres, in) == res_h, what + ": residual");
  cudaFree(dx - offset);
  cudaFree(dy - offset);
  if (dres) cudaFree(dres);
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  if (argc != 3) return std::fprintf(stderr, "usage: engine_check FAKE_NVCOMP.so staged|direct\n"), 2;
  std::string why = cuda::nvcomp_load(argv[1]);
  if (!why.empty()) return std::fprintf(stderr, "nvcomp_load: %s\n", why.c_str()), 2;
  const bool direct = std::string(argv[2]) == "direct";
  set_config(Config{0, 0, 256 << 10, true});  // compress everything, several segments per part
  const CodecId codecs[] = {CodecId::none, CodecId::fp16, CodecId::int8, CodecId::sign,
                            CodecId::lz4,  CodecId::bitcomp, CodecId::ans};
  for (CodecId c : codecs)
    for (Coll coll : {Coll::allreduce, Coll::reduce_scatter, Coll::allgather})
      for (size_t n : {size_t(1000), size_t(3 * 65536 + 7), size_t(300001)})
        for (size_t offset : {size_t(0), size_t(1)}) run_one(coll, c, n, offset, false, false, direct);
  for (CodecId c : {CodecId::int8, CodecId::lz4, CodecId::ans}) run_one(Coll::allreduce, c, 300001, 0, true, false, direct);
  run_one(Coll::allreduce, CodecId::int4, 300001, 0, false, true, direct);
  run_one(Coll::reduce_scatter, CodecId::sign, 100003, 0, false, true, direct);

  // A frame corrupted on its way is a codec error, not a crash (zeros: every chunk compressed).
  std::vector<float> x(200000, 0.f);
  float* dx = to_device(x, 0);
  size_t room = encoded_bytes(Spec{CodecId::ans}, DType::f32, x.size());
  void* frame;
  cudaMalloc(&frame, room);
  size_t bytes = cuda::frame_encode(CodecId::ans, DType::f32, dx, x.size() * 4, static_cast<uint8_t*>(frame), nullptr, nullptr);
  expect(bytes > 0 && bytes < x.size() * 4, "ans frame of compressible data is smaller");
  static_cast<uint8_t*>(frame)[frame_header_bytes(frame_chunks(x.size() * 4))] ^= 0x5A;  // chunk 0's first byte
  bool raised = false;
  try {
    cuda::frame_decode(CodecId::ans, static_cast<uint8_t*>(frame), nullptr, x.size() * 4,
                       reinterpret_cast<uint8_t*>(dx), nullptr);
  } catch (const Error& e) {
    raised = e.kind == ErrorKind::codec;
  }
  expect(raised, "a corrupt ans frame raises a codec error");

  int failed = 0;
  MPI_Allreduce(&g_failed, &failed, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (g_rank == 0) std::printf("engine_check %s: %d failed checks\n", argv[2], failed);
  MPI_Finalize();
  return failed ? 1 : 0;
}
