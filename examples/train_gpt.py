"""Train a small GPT with data, tensor and pipeline parallelism over MPI, every collective
compressed by mpicomp according to a policy.

    mpiexec -n 4 python examples/train_gpt.py --dp 2 --tp 2 --pp 1 --policy hybrid --steps 200

The corpus is the Python standard library's own sources (of the interpreter running this
script), read as bytes: available offline on every machine, tokenised at byte level
(vocabulary 256). The policies reproduce the comparison of Xu et al. (arXiv 2409.02423):
"none" (baseline), "naive" (one aggressive codec for all traffic) and "hybrid" (aggressive
with error feedback for data-parallel gradients, mild for tensor/pipeline traffic).

Layout: Megatron-LM (Shoeybi et al. 2019) tensor parallelism inside each block (attention
heads and MLP columns split over mesh.tp), GPipe (Huang et al. 2019) micro-batches over
mesh.pp stages (blocks split evenly), gradients averaged over mesh.dp. Same --seed, same
flags: same losses and byte counts, run after run. Rank 0 prints progress and writes --log.
"""

import argparse
import json
import os
import statistics
import sys
import sysconfig
import time

import numpy as np
import torch
import torch.nn.functional as F
from mpi4py import MPI

import mpicomp
import mpicomp.torch as mt

VOCAB = 256


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--dp", type=int, default=None, help="data-parallel replicas (default: the rest of the ranks)")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel size (divides --heads)")
    p.add_argument("--pp", type=int, default=1, help="pipeline stages (divides --layers)")
    p.add_argument("--policy", choices=mt.Policy.PRESETS, default="hybrid", help="compression policy preset")
    p.add_argument("--aggressive", default="int4:block=32", help="codec of the aggressive traffic (naive: all; hybrid: dp)")
    p.add_argument("--mild", default="int8", help="codec of tp/pp traffic under the hybrid policy")
    p.add_argument("--min-bytes", type=int, default=0,
                   help="messages smaller than this go uncompressed (mpicomp.config.min_bytes); 0 compresses "
                        "everything, which a small model needs to show the policies' effect")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--context", type=int, default=64, help="tokens (bytes) per sequence")
    p.add_argument("--batch", type=int, default=16, help="sequences per step per data-parallel replica")
    p.add_argument("--micro-batches", type=int, default=2, help="GPipe micro-batches per step (divides --batch)")
    p.add_argument("--lr", type=float, default=3e-3, help="AdamW learning rate")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--corpus-bytes", type=int, default=4 << 20, help="bytes of standard-library source to train on")
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    p.add_argument("--log", default="train_gpt.json", help="JSON log written by rank 0")
    args = p.parse_args(argv)
    for name in ("layers", "width", "heads", "context", "batch", "micro_batches", "steps", "corpus_bytes", "threads"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    checks = [(args.width % args.heads, f"--width {args.width} must be a multiple of --heads {args.heads}"),
              (args.heads % args.tp, f"--heads {args.heads} must be a multiple of --tp {args.tp}"),
              (args.layers % args.pp, f"--layers {args.layers} must be a multiple of --pp {args.pp}"),
              (args.batch % args.micro_batches,
               f"--batch {args.batch} must be a multiple of --micro-batches {args.micro_batches}")]
    for bad, message in checks:
        if bad:
            p.error(message)
    return args


def load_corpus(limit):
    """The first `limit` bytes of the standard library's .py files, in sorted path order."""
    root = sysconfig.get_paths()["stdlib"]
    chunks, total = [], 0
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in ("site-packages", "dist-packages", "__pycache__"))
        for name in sorted(filenames):
            if name.endswith(".py") and total < limit:
                with open(os.path.join(dirpath, name), "rb") as f:
                    chunks.append(f.read())
                total += len(chunks[-1])
    data = np.frombuffer(b"".join(chunks)[:limit], dtype=np.uint8)
    if data.size < 2:
        raise SystemExit(f"no Python sources found under {root}")
    return data


def batch(data, args, step, dp_rank):
    """Inputs and next-byte targets for this replica at this step (a pure function of them)."""
    rng = np.random.default_rng([args.seed, step, dp_rank])
    starts = rng.integers(0, data.size - args.context - 1, size=args.batch)
    rows = np.stack([data[s:s + args.context + 1] for s in starts]).astype(np.int64)
    t = torch.from_numpy(rows)
    return t[:, :-1], t[:, 1:]


class Block(torch.nn.Module):
    """Pre-norm transformer block; attention heads and MLP columns split over mesh.tp."""

    def __init__(self, args, mesh, policy):
        super().__init__()
        w, tp = args.width, mesh.tp
        self.heads, self.head_dim = args.heads // mesh.tp_size, w // args.heads
        self.ln1, self.ln2 = torch.nn.LayerNorm(w), torch.nn.LayerNorm(w)
        self.qkv = mt.ColumnParallelLinear(w, 3 * w, tp, policy=policy)
        self.proj = mt.RowParallelLinear(w, w, tp, policy=policy)
        self.fc = mt.ColumnParallelLinear(w, 4 * w, tp, policy=policy)
        self.out = mt.RowParallelLinear(4 * w, w, tp, policy=policy)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, self.heads * self.head_dim))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class Stage(torch.nn.Module):
    """One pipeline stage: the embeddings on the first, the head on the last."""

    def __init__(self, args, mesh, policy):
        super().__init__()
        # Every rank builds every layer in the same order from the same seed and keeps its
        # own: the model is the same whatever the mesh.
        torch.manual_seed(args.seed)
        embed = torch.nn.Embedding(VOCAB, args.width)
        position = torch.nn.Embedding(args.context, args.width)
        blocks = [Block(args, mesh, policy) for _ in range(args.layers)]
        norm, head = torch.nn.LayerNorm(args.width), torch.nn.Linear(args.width, VOCAB)
        per = args.layers // mesh.pp_size
        self.blocks = torch.nn.ModuleList(blocks[mesh.pp_rank * per:(mesh.pp_rank + 1) * per])
        self.first, self.last = mesh.pp_rank == 0, mesh.pp_rank == mesh.pp_size - 1
        if self.first:
            self.embed, self.position = embed, position
        if self.last:
            self.norm, self.head = norm, head

    def forward(self, x):
        if self.first:
            x = self.embed(x) + self.position(torch.arange(x.shape[1]))
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x)) if self.last else x


def count_parameters(model, mesh):
    """Parameters of the whole model: shards of tensor-parallel layers count tp times,
    replicated parameters once; stages add up."""
    sharded = set()
    for m in model.modules():
        if isinstance(m, mt.ColumnParallelLinear):
            sharded.update(id(p) for p in m.parameters())
        elif isinstance(m, mt.RowParallelLinear):
            sharded.add(id(m.weight))
    mine = sum(p.numel() * (mesh.tp_size if id(p) in sharded else 1) for p in model.parameters())
    return mesh.comm.allreduce(mine if mesh.dp_rank == 0 and mesh.tp_rank == 0 else 0)


def cross_entropy(logits, targets):
    return F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))


def progress(step, steps, loss, tokens_per_s, step_bytes):
    width = 24
    done = width * step // steps
    line = (f"[{'#' * done}{'.' * (width - done)}] step {step}/{steps} loss {loss:.4f} "
            f"{tokens_per_s:,.0f} tok/s {step_bytes / 1e6:.3f} MB/step")
    if sys.stdout.isatty():
        print("\r" + line, end="\n" if step == steps else "", flush=True)
    elif step == steps or step % max(1, steps // 10) == 0:
        print(line, flush=True)


def main(argv=None):
    args = parse_args(argv)
    world = MPI.COMM_WORLD
    torch.set_num_threads(args.threads)  # under mpiexec torch would drop to one thread
    mpicomp.config.min_bytes = args.min_bytes
    mpicomp.config.compress_local = 1  # one machine stands in for several nodes
    mesh = mt.Mesh(dp=args.dp, tp=args.tp, pp=args.pp, comm=world)
    policy = mt.Policy.preset(args.policy, aggressive=args.aggressive, mild=args.mild)
    data = load_corpus(args.corpus_bytes)
    model = Stage(args, mesh, policy)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    micro = args.batch // args.micro_batches
    pipe = mt.GPipe(model, mesh.pp, activation_shape=(micro, args.context, args.width), policy=policy)
    params = count_parameters(model, mesh)
    log = {"args": vars(args), "world_size": world.Get_size(), "parameters": params,
           "mesh": {"dp": mesh.dp_size, "tp": mesh.tp_size, "pp": mesh.pp_size},
           "policy": policy.describe(), "corpus_bytes": int(data.size), "steps": []}
    if world.Get_rank() == 0:
        print(f"# {params:,} parameters, {mesh}, policy {args.policy}: {policy.describe()}", flush=True)
    for step in range(1, args.steps + 1):
        mt.traffic.reset()
        start = time.perf_counter()
        inputs, targets = batch(data, args, step, mesh.dp_rank)
        optimizer.zero_grad(set_to_none=False)
        loss = pipe.step(list(inputs.split(micro)), list(targets.split(micro)), cross_entropy)
        mt.allreduce_gradients(model, comm=mesh.dp, codec=policy.codec("dp", "gradients"),
                               error_feedback=policy.dp_error_feedback)
        optimizer.step()
        elapsed = world.allreduce(time.perf_counter() - start, op=MPI.MAX)
        loss = mesh.dp.allreduce(loss) / mesh.dp_size
        sent = world.gather(dict(mt.traffic.bytes), root=0)
        if world.Get_rank() == 0:
            by_kind = {}
            for rank_bytes in sent:
                for (dim, kind), n in rank_bytes.items():
                    by_kind[f"{dim}.{kind}"] = by_kind.get(f"{dim}.{kind}", 0) + n
            total = sum(by_kind.values())
            tokens_per_s = mesh.dp_size * args.batch * args.context / elapsed
            log["steps"].append({"step": step, "loss": loss, "seconds": elapsed, "tokens_per_s": tokens_per_s,
                                 "bytes": total, "bytes_by_kind": by_kind})
            progress(step, args.steps, loss, tokens_per_s, total)
    if world.Get_rank() == 0:
        tail = log["steps"][-max(1, args.steps // 10):]
        log["final_loss"] = sum(s["loss"] for s in tail) / len(tail)
        log["bytes_per_step"] = sum(s["bytes"] for s in log["steps"]) / args.steps
        # The median of the steps after the first (warm-up) ones: robust to a stray slow step.
        log["seconds_per_step"] = statistics.median(s["seconds"] for s in log["steps"][min(5, args.steps - 1):])
        with open(args.log, "w") as f:
            json.dump(log, f, indent=1)
        print(f"final loss {log['final_loss']:.4f} (mean of the last {len(tail)} steps), "
              f"{log['bytes_per_step'] / 1e6:.3f} MB sent per step (all ranks), "
              f"{log['seconds_per_step'] * 1e3:.1f} ms per step (median); log: {args.log}", flush=True)


if __name__ == "__main__":
    main()
