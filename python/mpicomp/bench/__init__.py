"""OSU-style microbenchmarks of mpicomp: python -m mpicomp.bench --help."""
