#!/usr/bin/env python3
"""Ratios of the lossless codecs on real training traffic: one forward and backward pass of a
small transformer language model (token embedding, 4 encoder layers, output head; GPT-2's
init, std 0.02) on Zipf-distributed tokens, as float32 and as bfloat16: its gradients, and
the ReLU activations of its first feed-forward block (what tensor and pipeline parallelism
send). The input embedding's gradient is zero in the rows of tokens not in the batch; the
other gradients are dense float noise. Host: lz4 (mpicomp's encoder) beside blosc (C-Blosc2:
"lossless" is byte shuffle + zstd level 1) with other filters and compressors; GPU (with
nvCOMP): nvcomp-lz4, nvcomp-bitcomp, nvcomp-ans. Encode and decode GB/s on one thread.

    python bench/lossless_ratios.py [--device cuda] [--codecs SPEC,...] [--json bench/results/lossless-ratios-<device>.json]
"""
import argparse
import time

import numpy as np
import torch

import mpicomp
from mpicomp import _core
from mpicomp.bench.report import write_json

IDS = {torch.float32: 0, torch.bfloat16: 2}


def gradients(device, vocab=16384, width=512, layers=4, batch=16, context=256, seed=0):
    """{parameter name: gradient} after one backward pass."""
    torch.manual_seed(seed)
    emb = torch.nn.Embedding(vocab, width)
    torch.nn.init.normal_(emb.weight, std=0.02)
    body = torch.nn.TransformerEncoder(torch.nn.TransformerEncoderLayer(width, 8, 4 * width, batch_first=True),
                                       layers)
    head = torch.nn.Linear(width, vocab, bias=False)
    model = torch.nn.ModuleDict(dict(emb=emb, body=body, head=head)).to(device)
    seen = {}
    body.layers[0].linear2.register_forward_pre_hook(lambda m, args: seen.update(relu=args[0].detach()))
    ranks = torch.arange(1, vocab + 1, dtype=torch.float64)
    tokens = torch.multinomial(ranks ** -1.1, batch * (context + 1), replacement=True).view(batch, context + 1)
    tokens = tokens.to(device)
    h = model["body"](model["emb"](tokens[:, :-1]))
    logits = model["head"](h)
    torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), tokens[:, 1:].reshape(-1)).backward()
    return {n: p.grad.detach().reshape(-1) for n, p in model.named_parameters()}, seen["relu"].reshape(-1)


def timed(fn, sync, reps=5):
    fn()
    sync()
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync()
        best = min(best, time.perf_counter() - t0)
    return best


def measure(name, x, device):
    """(frame bytes, encode s, decode s) of x under codec name, checking the round trip."""
    c = mpicomp.codec(name)
    if device == "cpu":
        a = x.view(torch.int16).numpy().view(np.float16) if x.dtype == torch.bfloat16 else x.numpy()
        frame = c.encode(a)
        enc = timed(lambda: c.encode(a), lambda: None)
        dec = timed(lambda: c.decode(frame, a.size, a.dtype), lambda: None)
        assert c.decode(frame, a.size, a.dtype).tobytes() == a.tobytes()
        return frame.size, enc, dec
    st = torch.cuda.current_stream().cuda_stream
    room = torch.zeros(c.encoded_bytes(x.numel(), x.dtype), dtype=torch.uint8, device=device)
    y = torch.empty_like(x)
    enc_call = lambda: _core.cuda_encode(c.id, 0, IDS[x.dtype], x.data_ptr(), x.numel(), 0, room.data_ptr(), st)  # noqa: E731
    size = enc_call()
    dec_call = lambda: _core.cuda_decode(c.id, 0, IDS[x.dtype], room.data_ptr(), x.numel(), 1.0, y.data_ptr(), st)  # noqa: E731
    enc, dec = timed(enc_call, torch.cuda.synchronize), timed(dec_call, torch.cuda.synchronize)
    assert torch.equal(y.view(torch.uint8), x.view(torch.uint8))
    return size, enc, dec


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--codecs", default="lz4,lossless,blosc:filter=bitshuffle,blosc:cname=lz4",
                   help="host codecs to compare (comma-separated specs; blosc options stay with their name)")
    p.add_argument("--json")
    a = p.parse_args()
    specs = [s.strip() for s in a.codecs.replace(",filter", ";filter").replace(",clevel", ";clevel").split(",")]
    host = [s.replace(";", ",") for s in specs]
    names = host if a.device == "cpu" else [n for n in mpicomp.available_codecs() if n.startswith("nvcomp-")]
    if not names:
        raise SystemExit("lossless_ratios: no nvCOMP codecs here (pip install 'mpicomp[cuda]')")
    mpicomp.config.codec_threads = 1
    grads, relu = gradients(a.device)
    where = torch.cuda.get_device_name() if a.device == "cuda" else "cpu"
    records = []
    print(f"# {where}: gradients of {sum(g.numel() for g in grads.values())} parameters")
    print(f"# {'codec':<34} {'dtype':<9} {'tensor':<22} {'MiB':>7} {'ratio':>7} {'enc GB/s':>9} {'dec GB/s':>9}")
    for dtype in (torch.float32, torch.bfloat16):
        parts = {"embedding": grads["emb.weight"], "dense layers": torch.cat([g for n, g in grads.items()
                                                                              if n != "emb.weight"])}
        parts["all (one bucket)"] = torch.cat(list(parts.values()))
        parts["ReLU activations"] = relu
        for label, g in parts.items():
            x = g.to(dtype).contiguous()
            for name in names:
                size, enc, dec = measure(name, x, a.device)
                rec = dict(device=where, codec=name, dtype=str(dtype)[6:], tensor=label, bytes=x.nbytes,
                           frame_bytes=size, ratio=x.nbytes / size, encode_gbps=x.nbytes / enc / 1e9,
                           decode_gbps=x.nbytes / dec / 1e9)
                records.append(rec)
                print(f"  {name:<34} {rec['dtype']:<9} {label:<22} {x.nbytes / 2**20:7.1f} {rec['ratio']:7.2f} "
                      f"{rec['encode_gbps']:9.2f} {rec['decode_gbps']:9.2f}")
    if a.json:
        write_json(a.json, records)


if __name__ == "__main__":
    main()
