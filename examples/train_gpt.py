"""Train a small GPT with data, tensor and pipeline parallelism over MPI, every collective
compressed by mpicomp according to a policy.

    mpiexec -n 4 python examples/train_gpt.py --dp 2 --tp 2 --pp 1 --policy hybrid --steps 200
    mpiexec -n 4 python examples/train_gpt.py --optimizer acco --micro-batches 2 --steps 200
    mpiexec -n 4 python examples/train_gpt.py --optimizer amsp --shard 1,2,4 --ranks-per-node 2
    mpiexec -n 4 python examples/train_gpt.py --optimizer diloco --sync-every 50 --islands 2 --outer-codec int8

The corpus is the Python standard library's own sources (of the interpreter running this
script), read as bytes: available offline on every machine, tokenised at byte level
(vocabulary 256). The policies reproduce the comparison of Xu et al. (arXiv 2409.02423):
"none" (baseline), "naive" (one aggressive codec for all traffic) and "hybrid" (aggressive
with error feedback for data-parallel gradients, mild for tensor/pipeline traffic).

Layout: Megatron-LM (Shoeybi et al. 2019) tensor parallelism inside each block (attention
heads and MLP columns split over mesh.tp), GPipe (Huang et al. 2019) micro-batches over
mesh.pp stages (blocks split evenly), gradients averaged over mesh.dp. Same --seed, same
flags: same losses and byte counts, run after run. Rank 0 prints progress and, with --json,
writes a JSON log.

--optimizer: "adamw" (each rank keeps the whole AdamW state; gradients averaged with the
policy's dp codec), "zero1" (mpicomp.optim.ZeRO1 over mesh.dp: AdamW state sharded, gradient
reduce-scatter with the dp codec) or "acco" (mpicomp.optim.ACCO over mesh.dp: communication
overlapped with further micro-batches; --micro-batches bounds each round, --acco-max-micro-batches
lets fast ranks add more), or "amsp" (mpicomp.optim.AMSP over mesh.dp with --shard
s_p,s_g,s_os, default 1,1,dp: ZeRO-1; --amsp-codec on collectives between nodes, of
--ranks-per-node ranks each), or "diloco" (mpicomp.optim.DiLoCo: --islands groups of
mesh.dp replicas, gradients averaged exactly inside an island every step, the islands'
outer gradients averaged every --sync-every steps with --outer-codec, in --fragments
staggered fragments). zero1, acco and amsp need --pp 1 (GPipe owns the backward pass).
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
from mpicomp.optim import ACCO, AMSP, DiLoCo, ZeRO1

VOCAB = 256


def _islands(text):
    """--islands: a positive number of islands, or "nodes"."""
    if text == "nodes":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a number of islands or 'nodes', got {text!r}") from None


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
    p.add_argument("--optimizer", choices=("adamw", "zero1", "acco", "amsp", "diloco"), default="adamw",
                   help="adamw: replicated AdamW; zero1 / acco: mpicomp.optim over mesh.dp (see above)")
    p.add_argument("--acco-max-micro-batches", type=int, default=None,
                   help="acco: most micro-batches per round per rank (default: --micro-batches, deterministic)")
    p.add_argument("--shard", type=lambda t: tuple(int(x) for x in t.split(",")), default=None,
                   metavar="S_P,S_G,S_OS", help="amsp: the partition (default 1,1,dp)")
    p.add_argument("--ranks-per-node", type=int, default=None, help="amsp: ranks per node (default: MPI's)")
    p.add_argument("--amsp-codec", default="none", help="amsp: codec of the collectives between nodes")
    p.add_argument("--amsp-prefetch", choices=("on", "off"), default="on",
                   help="amsp: start the next module's parameter gather while this one computes (s_p > 1)")
    p.add_argument("--sync-every", type=int, default=50, help="diloco: H, inner steps per outer step")
    p.add_argument("--outer-codec", default="none", help="diloco: codec of the outer gradients (none, bf16, int8, int4)")
    p.add_argument("--outer-lr", type=float, default=0.7, help="diloco: outer Nesterov SGD learning rate")
    p.add_argument("--fragments", type=int, default=1, help="diloco: fragments of Streaming DiLoCo")
    p.add_argument("--overlap", action="store_true",
                   help="diloco: average outer gradients while the next inner step runs (tau = 1)")
    p.add_argument("--islands", type=_islands, default=None,
                   help="diloco: groups of data-parallel replicas, a number or 'nodes' (an island per node: "
                        "mpicomp.node_comms; default: every replica is its own island)")
    p.add_argument("--slow-rank", type=int, default=None,
                   help="this rank sleeps in every micro-batch as long as the micro-batch took (2x slower)")
    p.add_argument("--layers", type=int, default=2, help="transformer blocks")
    p.add_argument("--width", type=int, default=64, help="model width (embedding size)")
    p.add_argument("--heads", type=int, default=4, help="attention heads")
    p.add_argument("--context", type=int, default=64, help="tokens (bytes) per sequence")
    p.add_argument("--batch", type=int, default=16, help="sequences per step per data-parallel replica")
    p.add_argument("--micro-batches", type=int, default=2,
                   help="micro-batches per step (divides --batch): GPipe's, or gradient accumulation (zero1), "
                        "or per round (acco: two rounds per step)")
    p.add_argument("--lr", type=float, default=3e-3, help="AdamW learning rate")
    p.add_argument("--steps", type=int, default=100, help="optimizer steps")
    p.add_argument("--seed", type=int, default=0, help="seed of the model and the batches")
    p.add_argument("--corpus-bytes", type=int, default=4 << 20, help="bytes of standard-library source to train on")
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    p.add_argument("--json", "--log", dest="json", default=None, metavar="PATH",
                   help="write a JSON log of every step here (rank 0); default: none")
    args = p.parse_args(argv)
    for name in ("layers", "width", "heads", "context", "batch", "micro_batches", "steps", "corpus_bytes", "threads"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    checks = [(args.width % args.heads, f"--width {args.width} must be a multiple of --heads {args.heads}"),
              (args.heads % args.tp, f"--heads {args.heads} must be a multiple of --tp {args.tp}"),
              (args.layers % args.pp, f"--layers {args.layers} must be a multiple of --pp {args.pp}"),
              (args.batch % args.micro_batches,
               f"--batch {args.batch} must be a multiple of --micro-batches {args.micro_batches}")]
    if args.optimizer != "adamw":
        checks.append((args.pp != 1, f"--optimizer {args.optimizer} needs --pp 1"))
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


def progress(step, steps, loss, tokens_per_s, sent, plain, extra):
    width = 24
    done = width * step // steps
    ratio = plain / sent if sent else 1.0
    line = (f"[{'#' * done}{'.' * (width - done)}] step {step}/{steps} loss {loss:.4f} "
            f"{tokens_per_s:,.0f} tok/s {sent / 1e6:.3f} MB/step sent ({plain / 1e6:.3f} MB uncompressed, "
            f"{ratio:.2f}x){extra}")
    if sys.stdout.isatty():
        print("\r" + line, end="\n" if step == steps else "", flush=True)
    elif step == steps or step % max(1, steps // 10) == 0:
        print(line, flush=True)


def wire_bytes():
    """(bytes sent, bytes the same calls would send uncompressed, of mpicomp's own messages
    the bytes to other nodes and inside this one) by this rank's mpicomp collectives since the
    last mpicomp.reset_stats()."""
    s = mpicomp.stats().values()
    return tuple(sum(c[k] for c in s) for k in ("bytes_wire", "bytes_plain", "bytes_inter", "bytes_intra"))


class Trainer:
    """One optimizer step of the chosen --optimizer; returns (mean loss, micro-batches this
    rank ran, seconds it waited for communication, micro-batches of all ranks)."""

    def __init__(self, args, mesh, policy, model, data):
        self.args, self.mesh, self.policy, self.model, self.data = args, mesh, policy, model, data
        self.micro = args.batch // args.micro_batches
        self.pipe = mt.GPipe(model, mesh.pp, activation_shape=(self.micro, args.context, args.width), policy=policy)
        self.slow = args.slow_rank == mesh.comm.Get_rank()
        codec = policy.codec("dp", "gradients")
        if args.optimizer == "adamw":
            self.opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
        elif args.optimizer == "amsp":
            self.opt = AMSP(model, torch.optim.AdamW, shard=args.shard or (1, 1, mesh.dp_size), comm=mesh.dp,
                            ranks_per_node=args.ranks_per_node, codec={"intra": "none", "inter": args.amsp_codec},
                            prefetch=args.amsp_prefetch == "on", lr=args.lr, weight_decay=0.0)
        elif args.optimizer == "diloco":
            self.opt = self._diloco(args, mesh, model)
        elif args.optimizer == "zero1":
            self.opt = ZeRO1(model.parameters(), torch.optim.AdamW, comm=mesh.dp, grad_codec=codec,
                             error_feedback=policy.dp_error_feedback, lr=args.lr, weight_decay=0.0)
        else:
            # two rounds per step: half of --micro-batches in each, so a step sees as many
            # tokens as the other optimizers' (when fast ranks add none)
            k = max(1, args.micro_batches // 2)
            self.opt = ACCO(model.parameters(), torch.optim.AdamW, comm=mesh.dp, min_micro_batches=k,
                            max_micro_batches=args.acco_max_micro_batches or k, grad_codec=codec,
                            error_feedback=policy.dp_error_feedback, lr=args.lr, weight_decay=0.0)
            self.index = 0

    @staticmethod
    def _diloco(args, mesh, model):
        """DiLoCo over mesh.dp cut into --islands islands of consecutive replicas: exact
        gradient averaging inside an island (inner_comm), outer gradients across islands
        (comm: the replicas with the same place in their islands)."""
        if args.islands == "nodes":
            island, cross = mpicomp.node_comms(mesh.dp)
            per = island.Get_size()
        else:
            islands = args.islands or mesh.dp_size
            if islands < 1 or mesh.dp_size % islands:
                raise SystemExit(f"--islands {islands} must divide the {mesh.dp_size} data-parallel replicas")
            per = mesh.dp_size // islands
            island = mesh.dp.Split(mesh.dp_rank // per, mesh.dp_rank)
            cross = mesh.dp.Split(mesh.dp_rank % per, mesh.dp_rank)
        inner = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
        return DiLoCo(model, inner, comm=cross, inner_comm=island if per > 1 else None, sync_every=args.sync_every,
                      outer_lr=args.outer_lr, codec=args.outer_codec, error_feedback=args.outer_codec != "none",
                      fragments=args.fragments, overlap=args.overlap)

    def _slow_down(self, seconds):
        if self.slow:
            time.sleep(seconds)

    def _micro_batch(self):
        """ACCO's closure: the next micro-batch of this replica's stream, the same data the
        other optimizers see at the same token count."""
        step, part = divmod(self.index, self.args.micro_batches)
        self.index += 1
        inputs, targets = batch(self.data, self.args, step + 1, self.mesh.dp_rank)
        start = time.perf_counter()
        loss = self.pipe.step([inputs.split(self.micro)[part]], [targets.split(self.micro)[part]], cross_entropy)
        self._slow_down(time.perf_counter() - start)
        return loss

    def step(self, step):
        args, mesh = self.args, self.mesh
        if args.optimizer == "acco":
            loss = self.opt.step(self._micro_batch)
            return loss, self.opt.stats["micro_batches"], self.opt.stats["comm_wait_s"], \
                self.opt.stats["total_micro_batches"]
        inputs, targets = batch(self.data, args, step, mesh.dp_rank)
        self.opt.zero_grad(set_to_none=False)
        start = time.perf_counter()
        loss = self.pipe.step(list(inputs.split(self.micro)), list(targets.split(self.micro)), cross_entropy)
        self._slow_down(time.perf_counter() - start)
        if args.optimizer == "adamw":
            start = time.perf_counter()
            mt.allreduce_gradients(self.model, comm=mesh.dp, codec=self.policy.codec("dp", "gradients"),
                                   error_feedback=self.policy.dp_error_feedback)
            wait = time.perf_counter() - start
            self.opt.step()
        elif args.optimizer == "diloco":
            start = time.perf_counter()
            self.opt.step()  # inner step; an outer one (or a fragment's) when due
            wait = time.perf_counter() - start
        else:
            self.opt.step()
            wait = self.opt.stats["comm_wait_s"]
        return loss, args.micro_batches, wait, args.micro_batches * mesh.dp_size


def main(argv=None):
    args = parse_args(argv)
    world = MPI.COMM_WORLD
    torch.set_num_threads(args.threads)  # under mpiexec torch would drop to one thread
    mpicomp.config.min_bytes = args.min_bytes
    mesh = mt.Mesh(dp=args.dp, tp=args.tp, pp=args.pp, comm=world)
    policy = mt.Policy.preset(args.policy, aggressive=args.aggressive, mild=args.mild)
    data = load_corpus(args.corpus_bytes)
    model = Stage(args, mesh, policy)
    trainer = Trainer(args, mesh, policy, model, data)
    params = count_parameters(model, mesh)
    opt = trainer.opt
    log = {"args": vars(args), "world_size": world.Get_size(), "parameters": params,
           "mesh": {"dp": mesh.dp_size, "tp": mesh.tp_size, "pp": mesh.pp_size},
           "policy": policy.describe(), "corpus_bytes": int(data.size), "steps": []}

    if world.Get_rank() == 0:
        # DiLoCo averages whole models with its own codec: the policy's dp codec is not used there
        codecs = (f"outer codec {args.outer_codec} every {args.sync_every} steps, policy {args.policy} for tp/pp"
                  if args.optimizer == "diloco" else f"policy {args.policy}: {policy.describe()}")
        print(f"# {params:,} parameters, {mesh}, {codecs}, optimizer {args.optimizer}", flush=True)
    tokens = 0
    for step in range(1, args.steps + 1):
        mt.traffic.reset()
        mpicomp.reset_stats()
        start = time.perf_counter()
        loss, micro_batches, wait, total_micro = trainer.step(step)
        elapsed = world.allreduce(time.perf_counter() - start, op=MPI.MAX)
        loss = mesh.dp.allreduce(loss) / mesh.dp_size
        sent = world.gather((dict(mt.traffic.bytes), wire_bytes(), micro_batches, wait), root=0)
        outer = world.allreduce(opt.bytes_sent) if args.optimizer == "diloco" else None
        if world.Get_rank() == 0:
            by_kind = {}
            for rank_bytes, _, _, _ in sent:
                for (dim, kind), n in rank_bytes.items():
                    by_kind[f"{dim}.{kind}"] = by_kind.get(f"{dim}.{kind}", 0) + n
            total = sum(by_kind.values())
            wire, plain, inter, intra = (sum(s[1][i] for s in sent) for i in range(4))
            step_tokens = total_micro * trainer.micro * args.context
            tokens += step_tokens
            per_rank = [s[2] for s in sent]
            waits = [s[3] for s in sent]
            log["steps"].append({"step": step, "loss": loss, "seconds": elapsed, "tokens": tokens,
                                 "tokens_per_s": step_tokens / elapsed, "bytes": total, "bytes_by_kind": by_kind,
                                 "wire_bytes": wire, "plain_bytes": plain, "inter_bytes": inter,
                                 "intra_bytes": intra, "micro_batches": per_rank,
                                 "comm_wait_s": waits})
            extra = f" micro-batches {per_rank} comm wait {max(waits) * 1e3:.1f} ms"
            if outer is not None:  # diloco: what crossed between islands so far, all ranks
                log["steps"][-1]["outer_bytes"] = outer
                extra = (f" inner step {opt.inner_step} outer syncs {opt.outer_steps} outer bytes {outer / 1e6:.3f} MB"
                         f" wait {max(waits) * 1e3:.1f} ms")
            progress(step, args.steps, loss, step_tokens / elapsed, wire, plain, extra)
    inner = opt.inner_optimizer if args.optimizer == "diloco" else opt
    state = opt.optimizer_state_bytes() if hasattr(opt, "optimizer_state_bytes") else \
        sum(v.numel() * v.element_size() for s in inner.state.values() for v in s.values() if torch.is_tensor(v))
    states = world.gather(state, root=0)
    if hasattr(opt, "memory"):  # amsp: bytes held per rank, beside the planner's formula
        log["memory"] = world.gather(opt.memory(), root=0)
        log["amsp_modules"] = len(opt.units)  # for the planner: gathers and scatters per step
    if world.Get_rank() == 0:
        steps = log["steps"]
        tail = steps[-max(1, args.steps // 10):]
        log["final_loss"] = sum(s["loss"] for s in tail) / len(tail)
        log["optimizer_state_bytes"] = max(states)  # per rank, after the run (AdamW's moments and steps)
        log["bytes_per_step"] = sum(s["bytes"] for s in steps) / args.steps
        log["wire_bytes_per_step"] = sum(s["wire_bytes"] for s in steps) / args.steps
        log["plain_bytes_per_step"] = sum(s["plain_bytes"] for s in steps) / args.steps
        # Of mpicomp's own messages, what crossed between nodes: with nodes of several ranks the
        # total counts the traffic inside a node too (two levels send more, but less between nodes).
        log["inter_bytes_per_step"] = sum(s["inter_bytes"] for s in steps) / args.steps
        on_nodes = log["inter_bytes_per_step"] and any(s["intra_bytes"] for s in steps)
        between = f"; {log['inter_bytes_per_step'] / 1e6:.3f} MB of it between nodes" if on_nodes else ""
        # The median of the steps after the first (warm-up) ones: robust to a stray slow step.
        later = steps[min(5, args.steps - 1):]
        log["seconds_per_step"] = statistics.median(s["seconds"] for s in later)
        log["seconds_per_token"] = sum(s["seconds"] for s in later) / sum(s["tokens_per_s"] * s["seconds"]
                                                                           for s in later)
        log["comm_wait_s_per_step"] = statistics.median(max(s["comm_wait_s"]) for s in later)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(log, f, indent=1)
        print(f"final loss {log['final_loss']:.4f} (mean of the last {len(tail)} steps), "
              f"{log['wire_bytes_per_step'] / 1e6:.3f} MB sent per step (all ranks; uncompressed "
              f"{log['plain_bytes_per_step'] / 1e6:.3f} MB{between}), "
              f"{log['seconds_per_step'] * 1e3:.1f} ms per step (median), "
              f"{log['seconds_per_token'] * 1e6:.2f} us per token"
              + (f"; log: {args.json}" if args.json else ""), flush=True)


if __name__ == "__main__":
    main()
