// cpp/coll/mpi_count.h's int-count path (the one an MPI without the `_c` functions gets), with
// its limit lowered to a few elements so that every split runs on small buffers. Each check
// compares with values computed here: small integers in doubles, whose sums are exact.
// Prints "0 failed checks" from rank 0 when all ranks pass; exits 1 otherwise.
#include <cstdio>
#include <vector>

#include "../../cpp/coll/mpi_count.h"

using namespace mpicomp;

static int failures = 0;
static void expect(bool ok, const char* what, size_t n) {
  if (!ok) {
    std::fprintf(stderr, "FAIL %s n=%zu\n", what, n);
    ++failures;
  }
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  CommInfo ci(MPI_COMM_WORLD);
  const int r = ci.rank, p = ci.size;
  const size_t limit = MPICOMP_MPI_COUNT_MAX;
  for (size_t n : {size_t(1), limit - 1, limit, limit + 1, 3 * limit + 7}) {
    // A message of n bytes to the next rank, from the previous one: one request each way.
    std::vector<unsigned char> out(n), in(n, 0);
    for (size_t i = 0; i < n; ++i) out[i] = (unsigned char)(i * 7 + r);
    MPI_Request req[2];
    mpic::irecv_bytes(in.data(), n, (r + p - 1) % p, 5, MPI_COMM_WORLD, &req[0]);
    mpic::isend_bytes(out.data(), n, (r + 1) % p, 5, MPI_COMM_WORLD, &req[1]);
    MPI_Waitall(2, req, MPI_STATUSES_IGNORE);
    bool ok = true;
    for (size_t i = 0; i < n; ++i) ok &= in[i] == (unsigned char)(i * 7 + (r + p - 1) % p);
    expect(ok, "isend_bytes/irecv_bytes", n);
    std::vector<unsigned char> back(n, 0);
    if (r == 0) mpic::recv_bytes(back.data(), n, 1 % p, 6, MPI_COMM_WORLD);
    if (r == 1 % p) MPI_Send(out.data(), int(n), MPI_BYTE, 0, 6, MPI_COMM_WORLD);
    if (r == 0) {
      ok = true;
      for (size_t i = 0; i < n; ++i) ok &= back[i] == (unsigned char)(i * 7 + 1 % p);
      expect(ok, "recv_bytes", n);
    }

    // Element i of rank j's input is (i % 13) + 100 * j; sums over ranks are exact.
    auto value = [](size_t i, int j) { return double(i % 13) + 100.0 * j; };
    auto sum = [&](size_t i) {
      double s = 0;
      for (int j = 0; j < p; ++j) s += value(i, j);
      return s;
    };
    // Blocking, then started nonblocking (as under a timeout: deadline.h's mpi_collective).
    for (bool started : {false, true}) {
      mpic::Requests reqs;
      mpic::Requests* rs = started ? &reqs : nullptr;
      auto done = [&] {
        MPI_Waitall(int(reqs.size()), reqs.data(), MPI_STATUSES_IGNORE);
        reqs.clear();
      };
      std::vector<double> x(n * p), y(n * p, -1);
      for (size_t i = 0; i < n * p; ++i) x[i] = value(i, r);
      mpic::allreduce(x.data(), y.data(), n * p, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD, rs);
      done();
      ok = true;
      for (size_t i = 0; i < n * p; ++i) ok &= y[i] == sum(i);
      expect(ok, started ? "iallreduce" : "allreduce", n * p);
      std::vector<double> z(x);
      mpic::allreduce(MPI_IN_PLACE, z.data(), n * p, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD, rs);
      done();
      expect(z == y, started ? "iallreduce in place" : "allreduce in place", n * p);

      std::vector<double> part(n, -1);
      mpic::reduce_scatter_block(x.data(), part.data(), n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD, rs);
      done();
      ok = true;
      for (size_t i = 0; i < n; ++i) ok &= part[i] == sum(size_t(r) * n + i);
      expect(ok, started ? "ireduce_scatter_block" : "reduce_scatter_block", n);

      std::vector<double> mine(n), all(n * p, -1);
      for (size_t i = 0; i < n; ++i) mine[i] = value(i, r);
      mpic::allgather(mine.data(), all.data(), n, MPI_DOUBLE, MPI_COMM_WORLD, rs);
      done();
      ok = true;
      for (int j = 0; j < p; ++j)
        for (size_t i = 0; i < n; ++i) ok &= all[size_t(j) * n + i] == value(i, j);
      expect(ok, started ? "iallgather" : "allgather", n);
    }
  }
  int total = 0;
  MPI_Allreduce(&failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (r == 0) std::printf("%d failed checks\n", total);
  MPI_Finalize();
  return total ? 1 : 0;
}
