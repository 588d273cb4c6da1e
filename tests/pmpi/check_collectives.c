/* An unmodified MPI program's view of the interposer: calls MPI_Allreduce,
 * MPI_Reduce_scatter_block, MPI_Allgather and MPI_Iallreduce as any program would, and checks
 * each result against a reference computed here in double precision, within the bound of the
 * codec named by argv[1] (what MPICOMP_CODEC is set to; "off" = pass-through). Calls that
 * must pass through (integers, MPI_MAX, small messages, codec off) are compared bit for bit
 * with the PMPI_ call; codec bound's small sums are mpicomp's, within its bound (MPI's own
 * sums may miss a fine one). Every rank generates every rank's input, so each knows the exact
 * answer. Exit status: number of failed checks (0 = all passed), agreed on all ranks. */
#include <math.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char* codec;
static double bound_abs;  /* codec "bound:abs=<e>": every result within e of the exact one, 0 otherwise */
static int failures;

static double value(int rank, size_t i) { /* deterministic, varied magnitudes per block */
  uint64_t h = (uint64_t)(rank + 1) * 0x9e3779b97f4a7c15ull ^ (uint64_t)i * 0xbf58476d1ce4e5b9ull;
  h ^= h >> 31;
  double u = (double)(h % 2000001) / 1000000.0 - 1.0;
  return u * (1.0 + (double)((i / 256) % 7));
}

/* Per-element bound of one encode/decode of x (n elements) with the codec under test. */
static void tolerance(const double* x, size_t n, double* tol) {
  int block = 256;
  if (bound_abs > 0) { /* the bound of the whole call, however many encodings */
    for (size_t i = 0; i < n; ++i) tol[i] = bound_abs;
    return;
  }
  double q = !strcmp(codec, "int8") ? 254.0 : !strcmp(codec, "int4") ? 14.0 : !strcmp(codec, "sign") ? 1.0 : 0.0;
  for (size_t b = 0; b < n; b += block) {
    double m = 0;
    size_t e = b + block < n ? b + block : n;
    for (size_t i = b; i < e; ++i) m = fmax(m, fabs(x[i]));
    for (size_t i = b; i < e; ++i) {
      double rel = !strcmp(codec, "fp16") ? ldexp(1, -11) : !strcmp(codec, "bf16") ? ldexp(1, -8) : 0;
      tol[i] += (q > 0 ? m / q + ldexp(m, -21) : 0) + rel * fabs(x[i]);  /* + float32 rounding, as codecs.py */
    }
  }
}

/* Codecs whose frames restore the bytes: doubles are then summed in double. */
static int lossless(void) {
  return !strcmp(codec, "off") || !strcmp(codec, "none") || !strcmp(codec, "lz4") || !strcmp(codec, "lossless") ||
         !strncmp(codec, "blosc", 5);
}

static int compressing(size_t bytes) {
  return strcmp(codec, "off") && bytes >= 65536;
}

/* result (n floats or doubles) against the exact sum over ranks of value(r, first + i). */
static void check_sum(const char* what, const void* result, int is_double, size_t n, size_t first, MPI_Comm comm,
                      int two_stages) {
  int size;
  MPI_Comm_size(comm, &size);
  double* exact = calloc(n, sizeof(double));
  double* tol = calloc(n, sizeof(double));
  double* x = malloc(n * sizeof(double));
  double* mag = calloc(n, sizeof(double));
  for (int r = 0; r < size; ++r) {
    for (size_t i = 0; i < n; ++i) x[i] = value(r, first + i);
    for (size_t i = 0; i < n; ++i) exact[i] += x[i], mag[i] += fabs(x[i]);
    if (compressing(n * (is_double ? 8 : 4))) tolerance(x, n, tol);
  }
  if (two_stages && compressing(n * (is_double ? 8 : 4))) tolerance(exact, n, tol);
  double worst = 0;
  size_t bad = 0;
  for (size_t i = 0; i < n; ++i) {
    double got = is_double ? ((const double*)result)[i] : ((const float*)result)[i];
    /* float32 sums in any order (the two-level one sums each node first): size roundings of
       at most the sum of magnitudes each; doubles of a lossless codec the same in double. */
    double err = fabs(got - exact[i]),
           allowed = is_double && lossless() ? ldexp(size + 1, -53) * mag[i]
                     : bound_abs > 0 ? bound_abs /* on the result, whatever the size (MPI's sums where they keep it) */
                                     : tol[i] * (1 + 1e-5) + 1e-5 * fabs(exact[i]) + 1e-6 +
                                           (is_double ? 0 : ldexp(size + 1, -24) * mag[i]);
    if (!(err <= allowed)) bad++;
    if (err / (allowed) > worst) worst = err / allowed;
  }
  if (bad) {
    fprintf(stderr, "FAIL %s (codec %s, %zu elements): %zu outside the bound, worst %.3gx the bound\n", what, codec,
            n, bad, worst);
    failures++;
  }
  free(exact), free(tol), free(x), free(mag);
}

static void fill(float* f, double* d, size_t n, int rank, size_t first) {
  for (size_t i = 0; i < n; ++i) {
    if (f) f[i] = (float)value(rank, first + i);
    if (d) d[i] = value(rank, first + i);
  }
}

static void same_bytes(const char* what, const void* a, const void* b, size_t bytes) {
  if (memcmp(a, b, bytes)) {
    fprintf(stderr, "FAIL %s (codec %s): differs from the PMPI_ call\n", what, codec);
    failures++;
  }
}

static void test_comm(MPI_Comm comm, const char* name) {
  int rank, size;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  char what[128];
  size_t sizes[] = {1000, 70001, 300000};
  for (int s = 0; s < 3; ++s) {
    size_t n = sizes[s];
    float* xf = malloc(n * sizeof(float));
    float* yf = malloc(n * sizeof(float));
    double* xd = malloc(n * sizeof(double));
    double* yd = malloc(n * sizeof(double));
    fill(xf, xd, n, rank, 0);
    snprintf(what, sizeof what, "%s MPI_Allreduce float n=%zu", name, n);
    MPI_Allreduce(xf, yf, (int)n, MPI_FLOAT, MPI_SUM, comm);
    check_sum(what, yf, 0, n, 0, comm, 1);
    snprintf(what, sizeof what, "%s MPI_Allreduce double n=%zu", name, n);
    MPI_Allreduce(xd, yd, (int)n, MPI_DOUBLE, MPI_SUM, comm);
    check_sum(what, yd, 1, n, 0, comm, 1);
    snprintf(what, sizeof what, "%s MPI_Allreduce MPI_IN_PLACE n=%zu", name, n);
    memcpy(yf, xf, n * sizeof(float));
    MPI_Allreduce(MPI_IN_PLACE, yf, (int)n, MPI_FLOAT, MPI_SUM, comm);
    check_sum(what, yf, 0, n, 0, comm, 1);
    snprintf(what, sizeof what, "%s MPI_Iallreduce n=%zu", name, n);
    MPI_Request req;
    MPI_Iallreduce(xf, yf, (int)n, MPI_FLOAT, MPI_SUM, comm, &req);
    MPI_Wait(&req, MPI_STATUS_IGNORE);
    check_sum(what, yf, 0, n, 0, comm, 1);

    /* Pass-through, bit-exact: MPI_MAX, integers, and (below the threshold) small sums. */
    float* ref = malloc(n * sizeof(float));
    MPI_Allreduce(xf, yf, (int)n, MPI_FLOAT, MPI_MAX, comm);
    PMPI_Allreduce(xf, ref, (int)n, MPI_FLOAT, MPI_MAX, comm);
    snprintf(what, sizeof what, "%s MPI_Allreduce MPI_MAX n=%zu", name, n);
    same_bytes(what, yf, ref, n * sizeof(float));
    int* xi = malloc(n * sizeof(int));
    int* yi = malloc(n * sizeof(int));
    int* ri = malloc(n * sizeof(int));
    for (size_t i = 0; i < n; ++i) xi[i] = (int)(i * 7 + rank);
    MPI_Allreduce(xi, yi, (int)n, MPI_INT, MPI_SUM, comm);
    PMPI_Allreduce(xi, ri, (int)n, MPI_INT, MPI_SUM, comm);
    snprintf(what, sizeof what, "%s MPI_Allreduce MPI_INT n=%zu", name, n);
    same_bytes(what, yi, ri, n * sizeof(int));
    if (!compressing(n * sizeof(float)) && bound_abs == 0) {
      MPI_Allreduce(xf, yf, (int)n, MPI_FLOAT, MPI_SUM, comm);
      PMPI_Allreduce(xf, ref, (int)n, MPI_FLOAT, MPI_SUM, comm);
      snprintf(what, sizeof what, "%s MPI_Allreduce pass-through n=%zu", name, n);
      same_bytes(what, yf, ref, n * sizeof(float));
    }

    /* Reduce_scatter_block: n elements per rank out of size * n. */
    float* big = malloc(n * size * sizeof(float));
    fill(big, NULL, n * size, rank, 0);
    snprintf(what, sizeof what, "%s MPI_Reduce_scatter_block n=%zu", name, n);
    MPI_Reduce_scatter_block(big, yf, (int)n, MPI_FLOAT, MPI_SUM, comm);
    check_sum(what, yf, 0, n, (size_t)rank * n, comm, 0);
    snprintf(what, sizeof what, "%s MPI_Reduce_scatter_block MPI_IN_PLACE n=%zu", name, n);
    MPI_Reduce_scatter_block(MPI_IN_PLACE, big, (int)n, MPI_FLOAT, MPI_SUM, comm);
    check_sum(what, big, 0, n, (size_t)rank * n, comm, 0);

    /* Allgather: every rank's n elements; rank r's part must be within one encode of its x. */
    float* all = malloc(n * size * sizeof(float));
    MPI_Allgather(xf, (int)n, MPI_FLOAT, all, (int)n, MPI_FLOAT, comm);
    for (int r = 0; r < size; ++r) {
      double* xr = malloc(n * sizeof(double));
      double* tol = calloc(n, sizeof(double));
      fill(NULL, xr, n, r, 0);
      if (compressing(n * sizeof(float))) tolerance(xr, n, tol);
      for (size_t i = 0; i < n; ++i)
        if (!(fabs(all[r * n + i] - xr[i]) <= (bound_abs > 0 ? bound_abs
                                                             : tol[i] * (1 + 1e-5) + 1e-6 * fabs(xr[i]) + 1e-7))) {
          fprintf(stderr, "FAIL %s MPI_Allgather part %d n=%zu (codec %s) element %zu\n", name, r, n, codec, i);
          failures++;
          break;
        }
      free(xr), free(tol);
    }
    free(xf), free(yf), free(xd), free(yd), free(ref), free(xi), free(yi), free(ri), free(big), free(all);
  }
}

/* MPI_OP_NULL in a reduction is MPI's own error, through the communicator's error handler
   (set to return here), as without the interposer; it was once compressed and summed. */
static void test_op_null(void) {
  size_t n = 1 << 16;
  float* x = calloc(2 * n, sizeof(float));
  float* y = calloc(2 * n, sizeof(float));
  MPI_Comm c;
  MPI_Comm_dup(MPI_COMM_WORLD, &c);
  MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN);
  if (MPI_Allreduce(x, y, (int)n, MPI_FLOAT, MPI_OP_NULL, c) == MPI_SUCCESS) {
    fprintf(stderr, "FAIL MPI_Allreduce with MPI_OP_NULL succeeded (codec %s)\n", codec);
    failures++;
  }
  if (MPI_Reduce_scatter_block(x, y, (int)n / 2, MPI_FLOAT, MPI_OP_NULL, c) == MPI_SUCCESS) {
    fprintf(stderr, "FAIL MPI_Reduce_scatter_block with MPI_OP_NULL succeeded (codec %s)\n", codec);
    failures++;
  }
  MPI_Comm_free(&c);
  free(x), free(y);
}

static void test_comms(int rank) {
  test_comm(MPI_COMM_WORLD, "world");
  MPI_Comm half;
  MPI_Comm_split(MPI_COMM_WORLD, rank % 2, rank, &half);
  test_comm(half, "split");
  MPI_Comm_free(&half);
}

int main(int argc, char** argv) {
  int provided, rank;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  codec = argc > 1 ? argv[1] : "off";
  if (!strncmp(codec, "bound:abs=", 10)) bound_abs = atof(codec + 10);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (argc > 2 && !strcmp(argv[2], "op-null"))
    test_op_null();
  else
    test_comms(rank);
  int total = 0;
  PMPI_Allreduce(&failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0) printf("%s: %d failed checks\n", codec, total);
  MPI_Finalize();
  return total ? 1 : 0;
}
