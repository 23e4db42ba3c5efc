# SPDX-License-Identifier: MIT
"""torch_gpt.py — the PyTorch side of bench/vs_torch.sh: what our users would run instead.

Trains a GPT-2-shaped model (pre-LN, tanh GELU, learned positions, LM head tied to the
token table, no dropout) eagerly on the GPU with bf16 autocast over fp32 weights and fused
AdamW, on random tokens, and prints one JSON line: tokens/s, seconds a step and peak device
memory (torch.cuda.max_memory_allocated), or {"oom": true} when the model does not fit.
`--probe` instead prints the GPU's measured bf16 GEMM rate and pinned host-to-device and
device-to-host bandwidth, which bench/vs_torch.sh uses for MFU and the crossover.

Usage: python3 bench/torch_gpt.py --layers 12 --dim 768 --batch 8 [--seq 1024] [--steps 10]
       python3 bench/torch_gpt.py --probe
"""
import argparse
import json
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.fc, self.out = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (t.view(b, s, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, layers, dim, vocab, seq):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, dim), nn.Embedding(seq, dim)
        self.blocks = nn.ModuleList(Block(dim, dim // 64) for _ in range(layers))
        self.ln_f = nn.LayerNorm(dim)
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, tokens, targets):
        x = self.wte(tokens) + self.wpe(torch.arange(tokens.shape[1], device=tokens.device))
        for block in self.blocks:
            x = block(x)
        logits = self.ln_f(x) @ self.wte.weight.t()   # tied head
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))


def train(args):
    dev = torch.device("cuda")
    torch.manual_seed(0)
    model = GPT(args.layers, args.dim, args.vocab, args.seq).to(dev)
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01, fused=True)
    tokens = torch.randint(0, args.vocab, (args.batch, args.seq), device=dev)
    targets = torch.roll(tokens, -1, dims=1)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(tokens, targets)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    step()   # warm-up: allocator, kernels, optimizer state
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        loss = step()
    torch.cuda.synchronize()
    seconds = (time.perf_counter() - t0) / args.steps
    return {"params": params, "step_seconds": seconds,
            "tokens_per_second": args.batch * args.seq / seconds,
            "device_peak": torch.cuda.max_memory_allocated(), "loss": float(loss)}


def probe():
    dev = torch.device("cuda")
    n = 8192
    a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    reps = 20
    t0 = time.perf_counter()
    for _ in range(reps):
        a @ b
    torch.cuda.synchronize()
    gemm = 2 * n ** 3 * reps / (time.perf_counter() - t0)
    size = 1 << 30
    host = torch.empty(size, dtype=torch.uint8, pin_memory=True)
    gpu = torch.empty(size, dtype=torch.uint8, device=dev)
    rates = {}
    for name, dst, src in (("h2d", gpu, host), ("d2h", host, gpu)):
        dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(5):
            dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize()
        rates[name] = 5 * size / (time.perf_counter() - t0)
    return {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
            "bf16_gemm_flops": gemm, "h2d_bytes_per_second": rates["h2d"],
            "d2h_bytes_per_second": rates["d2h"]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--probe", action="store_true")
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--dim", type=int, default=768)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=10)
    args = ap.parse_args()
    if args.probe:
        print(json.dumps(probe()))
        return
    try:
        print(json.dumps(train(args)))
    except torch.OutOfMemoryError as err:
        print(json.dumps({"oom": True, "error": str(err).splitlines()[0]}))
    except RuntimeError as err:   # the CPU side of a model beyond host memory
        if "out of memory" not in str(err).lower():
            raise
        print(json.dumps({"oom": True, "error": str(err).splitlines()[0]}))


if __name__ == "__main__":
    main()
