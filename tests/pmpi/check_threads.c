/* Two threads of an unmodified MPI_THREAD_MULTIPLE program, each calling MPI_Allreduce on its
 * own communicator at the same time, under the interposer: the first call on each makes the
 * interposer's private duplicate (and its keyval), error feedback keeps one residual per
 * (communicator, buffer), and both count in the statistics. Inputs are integers in
 * [-127, 127] with 127 in every block of 256, so int8's first stage is exact and its second
 * errs by at most half a step of the sum's block maximum (<= 127 * size / 254, taken whole
 * below); the threads' inputs differ, so results crossed between them fail.
 * Exit status: failed checks, summed over ranks. */
#include <math.h>
#include <mpi.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#define N 50000
#define CALLS 50

static int size, failures[2];
static MPI_Comm comms[2];

static float value(int rank, int thread, int i) {
  return i % 256 == 0 ? 127.0f : (float)((i * 7 + rank * 13 + thread * 50) % 255 - 127);
}

static void* work(void* arg) {
  int t = (int)(long)arg, rank;
  MPI_Comm_rank(comms[t], &rank);
  float* x = malloc(N * sizeof(float));
  float* out = malloc((N + CALLS) * sizeof(float));
  for (int i = 0; i < N; ++i) x[i] = value(rank, t, i);
  for (int call = 0; call < CALLS; ++call) {
    float* y = out + call; /* a new buffer each call: a new residual, inserted while the other thread inserts */
    MPI_Allreduce(x, y, N, MPI_FLOAT, MPI_SUM, comms[t]);
    for (int i = 0; i < N; ++i) {
      double exact = 0;
      for (int r = 0; r < size; ++r) exact += value(r, t, i);
      if (fabs(y[i] - exact) > size * 127.0 / 254.0 + 1e-3) {
        if (failures[t]++ == 0) fprintf(stderr, "FAIL thread %d call %d: y[%d] = %g, exact %g\n", t, call, i, y[i], exact);
      }
    }
  }
  free(x);
  free(out);
  return NULL;
}

int main(int argc, char** argv) {
  int provided, rank, total = 0, mine;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (provided < MPI_THREAD_MULTIPLE) {
    fprintf(stderr, "FAIL: the MPI library gave thread level %d\n", provided);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Comm_dup(MPI_COMM_WORLD, &comms[0]);
  MPI_Comm_dup(MPI_COMM_WORLD, &comms[1]);
  pthread_t threads[2];
  /* Odd ranks start the threads in the other order: first calls meet in either order. */
  for (int k = 0; k < 2; ++k) pthread_create(&threads[k], NULL, work, (void*)(long)(rank % 2 ? 1 - k : k));
  for (int k = 0; k < 2; ++k) pthread_join(threads[k], NULL);
  mine = failures[0] + failures[1];
  MPI_Allreduce(&mine, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0) printf("threads: %d failed checks\n", total);
  MPI_Comm_free(&comms[0]);
  MPI_Comm_free(&comms[1]);
  MPI_Finalize();
  return total;
}
