// Chooses the best SIMD target this CPU supports at start-up (no -march=native in builds).
#include <atomic>
#if defined(MPICOMP_X86_TARGETS)
#include <cpuid.h>
#endif

#include "codec.h"

namespace mpicomp {
namespace baseline { extern const CpuKernels kernels; }
#if defined(MPICOMP_X86_TARGETS)
namespace avx2 { extern const CpuKernels kernels; }
namespace avx512 { extern const CpuKernels kernels; }
#endif

namespace {
#if defined(MPICOMP_X86_TARGETS)
// From CPUID (leaf 1, ECX): clang's __builtin_cpu_supports knows no "f16c" before clang 16.
bool has_f16c() {
  unsigned a, b, c, d;
  return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
}
#endif

std::vector<const CpuKernels*> supported() {
  std::vector<const CpuKernels*> v;
#if defined(MPICOMP_X86_TARGETS)
  __builtin_cpu_init();
  bool has_avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && has_f16c();
  if (has_avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl"))
    v.push_back(&avx512::kernels);
  if (has_avx2) v.push_back(&avx2::kernels);
#endif
  v.push_back(&baseline::kernels);
  return v;
}
std::atomic<const CpuKernels*> g_active{nullptr};
}  // namespace

const CpuKernels& cpu_kernels() {
  const CpuKernels* k = g_active.load(std::memory_order_acquire);
  if (!k) {
    k = supported().front();
    g_active.store(k, std::memory_order_release);
  }
  return *k;
}

std::vector<std::string> cpu_targets() {
  std::vector<std::string> names;
  for (auto* k : supported()) names.emplace_back(k->target);
  return names;
}

bool set_cpu_target(const std::string& name) {
  for (auto* k : supported())
    if (name == k->target) {
      g_active.store(k, std::memory_order_release);
      return true;
    }
  return false;
}

}  // namespace mpicomp
