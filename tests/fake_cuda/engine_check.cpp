// The GPU engine's host-side logic on a machine without a GPU (tests/test_fake_cuda.py): the
// collectives run with cuda_engine on fake device memory (fake_runtime.cpp) and nvCOMP's
// stand-in (fake_nvcomp.cpp), and must give the host engine's bytes exactly, staged through
// pinned buffers or (argv[2] == "direct") passed to MPI as they are; with a third argument K,
// on nodes of K ranks (config.ranks_per_node), through the two-level collectives.
//   mpiexec -n N engine_check FAKE_NVCOMP.so staged|direct [K]
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
#include "../../cpp/coll/topology.h"
#include "../../cpp/codecs/errors.h"
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

// Runs of zeros between stretches of noise, different on every rank, as dtype t's bytes.
std::vector<uint8_t> data(size_t n, int seed, DType t) {
  std::mt19937 g(seed * 7919 + g_rank);
  std::normal_distribution<float> d;
  std::vector<uint8_t> x(n * dtype_size(t));
  for (size_t i = 0; i < n; ++i) store_f32(x.data(), t, i, (i / 3000) % 3 ? 0.f : d(g));
  return x;
}

uint8_t* to_device(const std::vector<uint8_t>& h, size_t offset) {  // offset bytes into the allocation
  void* p;
  cudaMalloc(&p, h.size() + offset + 4);
  uint8_t* d = static_cast<uint8_t*>(p) + offset;
  cudaMemcpyAsync(d, h.data(), h.size(), cudaMemcpyHostToDevice, nullptr);
  return d;
}
std::vector<uint8_t> to_host(const void* d, size_t bytes) {
  std::vector<uint8_t> h(bytes);
  cudaMemcpyAsync(h.data(), d, bytes, cudaMemcpyDeviceToHost, nullptr);
  return h;
}

std::vector<uint8_t> to_host_bytes(const std::vector<float>& v) {
  auto* b = reinterpret_cast<const uint8_t*>(v.data());
  return std::vector<uint8_t>(b, b + v.size() * 4);
}

void run_one(Coll coll, CodecId codec, DType t, size_t n, size_t offset, bool avg, bool feedback, bool direct,
             uint32_t block = 256) {
  const int p = [] { int s; MPI_Comm_size(MPI_COMM_WORLD, &s); return s; }();
  const size_t in = coll == Coll::reduce_scatter ? n * p : n, out = coll == Coll::allgather ? n * p : n;
  const size_t w = dtype_size(t);
  std::vector<uint8_t> x = data(in, int(n + offset), t);
  CollArgs a;
  // The host reference: lossless codecs all restore the same bytes, so host lz4 stands in
  // for the GPU-only ones.
  a.spec = Spec{is_lossless(codec) ? CodecId::lz4 : codec, block};
  a.dtype = t;
  a.count = n;
  a.avg = avg;
  std::vector<uint8_t> y(out * w);
  std::vector<float> res_h(in, 0.f);
  a.residual = feedback ? res_h.data() : nullptr;
  collective(coll, MPI_COMM_WORLD, x.data(), y.data(), a);

  offset *= w;  // one element off the allocation's alignment
  uint8_t* dx = to_device(x, offset);
  uint8_t* dy = to_device(std::vector<uint8_t>(out * w, 0xEE), offset);
  uint8_t* dres = feedback ? to_device(std::vector<uint8_t>(in * 4, 0), 0) : nullptr;
  a.spec.id = codec;
  a.residual = reinterpret_cast<float*>(dres);
  a.engine = &cuda_engine(nullptr, direct);
  collective(coll, MPI_COMM_WORLD, dx, dy, a);
  a.engine->finish();
  std::vector<uint8_t> got = to_host(dy, out * w);
  std::string what = std::string(coll == Coll::allreduce ? "allreduce" : coll == Coll::allgather ? "allgather"
                                                                                                  : "reduce_scatter") +
                     " codec " + codec_name(codec) + " dtype " + dtype_name(t) + " n " + std::to_string(n) +
                     " offset " + std::to_string(offset) + " block " + std::to_string(block) + (avg ? " avg" : "") +
                     (feedback ? " feedback" : "");
  if (codec == CodecId::none && coll != Coll::allgather) {  // the host sums through MPI: another order
    bool close = true;
    for (size_t i = 0; i < out; ++i) {
      float a_ = load_f32(got.data(), t, i), b_ = load_f32(y.data(), t, i);
      close &= std::fabs(a_ - b_) <= (w == 2 ? 1e-2f : 1e-5f) * (std::fabs(b_) + 1.f);
    }
    expect(close, what + ": values");
  } else {
    expect(got == y, what + ": bytes");
  }
  if (feedback) expect(to_host(dres, in * 4) == to_host_bytes(res_h), what + ": residual");
  cudaFree(dx - offset);
  cudaFree(dy - offset);
  if (dres) cudaFree(dres);
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  if (argc != 3 && argc != 4)
    return std::fprintf(stderr, "usage: engine_check FAKE_NVCOMP.so staged|direct [ranks per node]\n"), 2;
  std::string why = cuda::nvcomp_load(argv[1]);
  if (!why.empty()) return std::fprintf(stderr, "nvcomp_load: %s\n", why.c_str()), 2;
  const bool direct = std::string(argv[2]) == "direct";
  Config cfg{0, 0, 256 << 10, true};  // compress everything, several segments per part
  cfg.gpu_segment_bytes = cfg.segment_bytes;  // the tiles shape lossy sums: the host's, to compare bytes
  if (argc == 4) {
    cfg.ranks_per_node = std::stoul(argv[3]);
    set_config(cfg);
    expect(node_layout(MPI_COMM_WORLD).hierarchical(), "the layout has nodes of several ranks");
  }
  set_config(cfg);
  const CodecId codecs[] = {CodecId::none, CodecId::fp16, CodecId::bf16, CodecId::int8, CodecId::int4,
                            CodecId::sign, CodecId::lz4,  CodecId::bitcomp, CodecId::ans};
  for (CodecId c : codecs)
    for (Coll coll : {Coll::allreduce, Coll::reduce_scatter, Coll::allgather})
      for (size_t n : {size_t(1000), size_t(3 * 65536 + 7), size_t(300001)})
        for (size_t offset : {size_t(0), size_t(1)}) run_one(coll, c, DType::f32, n, offset, false, false, direct);
  for (CodecId c : {CodecId::none, CodecId::bf16, CodecId::int8, CodecId::lz4, CodecId::ans})
    for (DType t : {DType::bf16, DType::f16})
      for (Coll coll : {Coll::allreduce, Coll::reduce_scatter, Coll::allgather})
        run_one(coll, c, t, 200001, 1, false, false, direct);
  for (CodecId c : {CodecId::int8, CodecId::lz4, CodecId::ans})
    for (DType t : {DType::f32, DType::bf16}) run_one(Coll::allreduce, c, t, 300001, 0, true, false, direct);
  run_one(Coll::allreduce, CodecId::int4, DType::f32, 300001, 0, false, true, direct);
  run_one(Coll::reduce_scatter, CodecId::sign, DType::f32, 100003, 0, false, true, direct);
  for (uint32_t block : {32u, 1056u})  // one row per warp; 33 rows, the last partial in every record
    for (CodecId c : {CodecId::int8, CodecId::int4, CodecId::sign})
      run_one(Coll::allreduce, c, DType::f32, 100003, 1, false, true, direct, block);

  // A frame corrupted on its way is a codec error, not a crash (zeros: every chunk compressed).
  std::vector<uint8_t> x(800000, 0);
  uint8_t* dx = to_device(x, 0);
  size_t room = encoded_bytes(Spec{CodecId::ans}, DType::f32, x.size() / 4);
  void* frame;
  cudaMalloc(&frame, room);
  size_t bytes = cuda::frame_encode(CodecId::ans, DType::f32, dx, x.size(), static_cast<uint8_t*>(frame), nullptr, nullptr);
  expect(bytes > 0 && bytes < x.size(), "ans frame of compressible data is smaller");
  static_cast<uint8_t*>(frame)[frame_header_bytes(frame_chunks(x.size()))] ^= 0x5A;  // chunk 0's first byte
  bool raised = false;
  try {
    cuda::frame_decode(CodecId::ans, static_cast<uint8_t*>(frame), nullptr, x.size(), dx, nullptr);
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
