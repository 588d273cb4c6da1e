/* An unmodified MPI program for the interposer: it knows nothing of mpicomp. Each rank
 * sums 4 Mi floats with MPI_Allreduce; under LD_PRELOAD=libmpicomp_pmpi.so they travel
 * compressed (README, docs/interposer.md).
 *
 *   .venv/bin/mpicc examples/allreduce.c -o allreduce
 *   .venv/bin/mpiexec -n 2 env LD_PRELOAD=$(.venv/bin/mpicomp-config --preload) MPICOMP_CODEC=int8 ./allreduce
 */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    const int n = 1 << 22;
    float *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y);
    for (int i = 0; i < n; i++) x[i] = sinf(0.001f * i + rank);
    double t = MPI_Wtime();
    MPI_Allreduce(x, y, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    t = MPI_Wtime() - t;
    double err = 0; /* against the sum computed here in double: every rank's x is known */
    for (int i = 0; i < n; i++) {
        double exact = 0;
        for (int r = 0; r < size; r++) exact += sinf(0.001f * i + r);
        err = fmax(err, fabs(y[i] - exact));
    }
    if (rank == 0) printf("%d ranks: MPI_Allreduce of %d floats in %.1f ms, max error %.2e\n", size, n, 1e3 * t, err);
    free(x);
    free(y);
    MPI_Finalize();
    return 0;
}
