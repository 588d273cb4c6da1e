// nvcomp.cpp declares nvCOMP 6's batched C API itself (it loads the library at run time, so a
// build needs no nvCOMP). This checks those declarations against the real headers and
// library of nvidia-libnvcomp-cu13, on a machine without a GPU (tests/test_nvcomp_abi.py):
// at compile time, that every function takes and returns its arguments the way nvCOMP's
// declares them, that the option structs are nvCOMP's size with their fields where
// nvcomp.cpp writes them, and that the enum values it uses are nvCOMP's; at run time, that
// nvcomp_load() finds every function, and that nvCOMP, called through nvcomp.cpp's
// declarations with its options, accepts them and asks for no more alignment than frames
// give (kFrameAlign).
//   nvcomp_abi LIBNVCOMP.so.6
#include <nvcomp.h>

#include <cstdio>
#include <tuple>
#include <type_traits>

#include "../cpp/codecs/cuda/nvcomp.cpp"

namespace mpicomp::cuda {

void copy_chunks(const ChunkCopy*, size_t, void*) { std::abort(); }  // kernels.cu's; not reached here

namespace {

// How a value travels in a call: pointers alike whatever they point to, 4-byte integers and
// enums alike, structs over 16 bytes by size (x86-64 copies them to the stack in 8-byte
// slots, so alignments up to 8 travel alike; AArch64 passes a pointer to a copy).
template <size_t Size, size_t Align>
struct InMemory {};
template <class T>
auto passed() {
  if constexpr (std::is_pointer_v<T>)
    return static_cast<void*>(nullptr);
  else if constexpr (std::is_enum_v<T> || (std::is_integral_v<T> && sizeof(T) == 4))
    return int32_t{};
  else if constexpr (std::is_class_v<T>)
    return InMemory<sizeof(T), (alignof(T) > 8 ? alignof(T) : 8)>{};
  else
    return T{};
}
template <class F>
struct Call;
template <class R, class... A>
struct Call<R (*)(A...)> {
  using type = std::tuple<decltype(passed<R>()), decltype(passed<A>())...>;
};
template <class Ours, class Theirs>
constexpr bool same_call = std::is_same_v<typename Call<Ours>::type, typename Call<Theirs>::type>;

static_assert(same_call<GetProperties, decltype(&nvcompGetProperties)>);
static_assert(offsetof(nvcompProperties_t, version) == offsetof(Properties, version) &&
              offsetof(nvcompProperties_t, cudart_version) == offsetof(Properties, cudart_version));

#define SAME_API(N)                                                                                              \
  static_assert(same_call<MaxOutputChunk, decltype(&nvcompBatched##N##CompressGetMaxOutputChunkSize)>, #N);     \
  static_assert(same_call<TempSize, decltype(&nvcompBatched##N##CompressGetTempSize)>, #N);                     \
  static_assert(same_call<Compress, decltype(&nvcompBatched##N##CompressAsync)>, #N);                           \
  static_assert(same_call<TempSize, decltype(&nvcompBatched##N##DecompressGetTempSize)>, #N);                   \
  static_assert(same_call<Decompress, decltype(&nvcompBatched##N##DecompressAsync)>, #N);                       \
  static_assert(sizeof(Options) == sizeof(nvcompBatched##N##CompressOpts_t) &&                                  \
                    sizeof(Options) == sizeof(nvcompBatched##N##DecompressOpts_t) && sizeof(Options) > 16,        \
                #N " options")
SAME_API(LZ4);
SAME_API(Bitcomp);
SAME_API(ANS);

// Where compress_options / decompress_options write, and what zero means in the fields they
// leave zero: the defaults.
static_assert(offsetof(nvcompBatchedLZ4CompressOpts_t, data_type) == 0 && NVCOMP_TYPE_CHAR == 0);
static_assert(offsetof(nvcompBatchedBitcompCompressOpts_t, data_type) == 4 && BITCOMP_LOSSLESS == 0);
static_assert(offsetof(nvcompBatchedANSCompressOpts_t, data_type) == 4 && nvcomp_rANS == 0);
static_assert(offsetof(nvcompBatchedANSDecompressOpts_t, data_type) == 4 && NVCOMP_DECOMPRESS_BACKEND_DEFAULT == 0);
static_assert(kChar == NVCOMP_TYPE_CHAR && kUchar == NVCOMP_TYPE_UCHAR && kUshort == NVCOMP_TYPE_USHORT &&
              kUint == NVCOMP_TYPE_UINT && kUlonglong == NVCOMP_TYPE_ULONGLONG && kFloat16 == NVCOMP_TYPE_FLOAT16 &&
              kFloat32 == NVCOMP_TYPE_FLOAT32 && kBits == NVCOMP_TYPE_BITS && nvcompSuccess == 0);

int g_failed = 0;
void expect(bool ok, const std::string& what) {
  if (!ok) ++g_failed, std::fprintf(stderr, "FAIL %s\n", what.c_str());
}

template <class Opts>
Opts as(const Options& o) {
  Opts r;
  std::memcpy(&r, o.bytes, sizeof r);
  return r;
}

// nvCOMP's alignment needs for one codec and dtype, through its own declaration.
template <class Opts>
void alignments(void* lib, const char* name, const Options& o, const std::string& what) {
  using Fn = nvcompStatus_t (*)(Opts, nvcompAlignmentRequirements_t*);
  auto fn = reinterpret_cast<Fn>(dlsym(lib, name));
  nvcompAlignmentRequirements_t r{};
  expect(fn && fn(as<Opts>(o), &r) == nvcompSuccess, what + ": " + name);
  expect(kFrameAlign % r.input == 0 && kFrameAlign % r.output == 0 && 256 % r.temp == 0,
         what + ": alignment " + std::to_string(r.input) + "/" + std::to_string(r.output) + "/" +
             std::to_string(r.temp) + " exceeds what frames give");
}

}  // namespace
}  // namespace mpicomp::cuda

int main(int argc, char** argv) {
  using namespace mpicomp;
  using namespace mpicomp::cuda;
  if (argc != 2) return std::fprintf(stderr, "usage: nvcomp_abi LIBNVCOMP.so.6\n"), 2;
  std::string why = nvcomp_load(argv[1]);
  expect(why.empty(), "nvcomp_load: " + why);
  void* lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  expect(lib != nullptr, "dlopen");
  if (!why.empty() || !lib) return 1;
  for (CodecId c : {CodecId::lz4, CodecId::bitcomp, CodecId::ans})
    for (DType t : {DType::f32, DType::f16, DType::bf16, DType::f64, DType::i8, DType::i32, DType::i64}) {
      const std::string what = std::string(nv_name(c)) + " on " + std::to_string(dtype_size(t)) + "-byte " +
                               (is_float(t) ? "floats" : "integers");
      const Options o = compress_options(c, t);
      size_t max_out = 0;
      expect(api(c).max_out(kChunkBytes, o, &max_out) == 0 && max_out >= kChunkBytes && max_out < 2 * kChunkBytes,
             what + ": max output " + std::to_string(max_out));
      if (c == CodecId::lz4)
        alignments<nvcompBatchedLZ4CompressOpts_t>(lib, "nvcompBatchedLZ4CompressGetRequiredAlignments", o, what);
      else if (c == CodecId::bitcomp)
        alignments<nvcompBatchedBitcompCompressOpts_t>(lib, "nvcompBatchedBitcompCompressGetRequiredAlignments", o,
                                                       what);
      else
        alignments<nvcompBatchedANSCompressOpts_t>(lib, "nvcompBatchedANSCompressGetRequiredAlignments", o, what);
    }
  std::printf("nvcomp_abi: %d failed checks\n", g_failed);
  return g_failed ? 1 : 0;
}
