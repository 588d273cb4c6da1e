// The codec loops compiled for the baseline target (flags set in CMakeLists.txt).
#define MPICOMP_TARGET baseline
#define MPICOMP_TARGET_NAME "baseline"
#include "cpu_kernels.inc"
