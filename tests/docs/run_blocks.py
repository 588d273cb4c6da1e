"""Runs the Python code blocks of the README and docs/ (a JSON file of [where, code] pairs),
one after another, each as a program of its own: a fresh namespace named "__main__", the
current directory a scratch one, torch.distributed torn down after it. Rank 0 prints "ok
<where>" per block; any rank prints the traceback of a block that failed. Exits 1 if one did.
Run under mpiexec by tests/test_docs_code.py."""
import json
import sys
import time
import traceback

from mpi4py import MPI


def _tear_down():
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def main():
    comm, failed = MPI.COMM_WORLD, 0
    for where, code in json.loads(open(sys.argv[1]).read()):
        start = time.perf_counter()
        try:
            exec(compile(code, where, "exec"), {"__name__": "__main__"})
            _tear_down()
        except BaseException:
            failed += 1
            print(f"FAILED {where} (rank {comm.rank}):\n{traceback.format_exc()}", flush=True)
        if comm.allreduce(failed, op=MPI.MAX):
            break  # a rank that failed may have left the others' collectives unmatched
        if comm.rank == 0:
            print(f"ok {where} {time.perf_counter() - start:.1f} s", flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
