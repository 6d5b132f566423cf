#!/usr/bin/python3
"""gpt-char-small in PyTorch: the reference that bench/train_bench.sh measures FusionLLM against.

Same model, shapes, optimizer and learning-rate schedule as
configs/models/gpt-char-small.pbtxt + configs/runs/char-small.ini, written for Debian's
PyTorch 1.13 (python3-torch; no F.scaled_dot_product_attention there, so attention is spelled out
by default; --attention sdpa uses the fused kernel of PyTorch 2.x, as bench/gpu_bench.sh also reports).

    OMP_WAIT_POLICY=PASSIVE /usr/bin/python3 bench/torch_char_gpt.py --steps 30 --warmup 5
    /usr/bin/python3 bench/torch_char_gpt.py --device cuda --vocab 50257 --context 1024 \
        --channels 768 --heads 12 --layers 12 --batch 8      # gpt2-124m (bench/gpu_bench.sh)

Shape legend: B batch, T context, C channels, V vocabulary, NH heads, HS head size (C / NH).

Prints one machine-readable line at the end:
    RESULT tokens_per_s=... peak_rss_mb=... loss=... steps=... warmup=... threads=... seconds=...
tokens_per_s counts only the timed steps (after --warmup untimed ones), each step being batch
sampling, forward, backward, gradient clipping and the AdamW update.
"""

import argparse
import contextlib
import math
import os
import resource
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

from torch_common import lr_at


class causal_self_attention(nn.Module):
    def __init__(self, C, NH, T, sdpa=False):
        super().__init__()
        self.NH = NH
        self.sdpa = sdpa
        self.c_attn = nn.Linear(C, 3 * C)
        self.c_proj = nn.Linear(C, C)
        self.register_buffer("mask", torch.tril(torch.ones(T, T, dtype=torch.bool)).view(1, 1, T, T))

    def forward(self, x):
        B, T, C = x.shape
        HS = C // self.NH
        q, k, v = self.c_attn(x).split(C, dim=2)
        q = q.view(B, T, self.NH, HS).transpose(1, 2)  # (B, NH, T, HS)
        k = k.view(B, T, self.NH, HS).transpose(1, 2)
        v = v.view(B, T, self.NH, HS).transpose(1, 2)
        if self.sdpa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).contiguous().view(B, T, C)
            return self.c_proj(y)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(HS))  # (B, NH, T, T)
        att = att.masked_fill(~self.mask[:, :, :T, :T], float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class block(nn.Module):
    def __init__(self, C, NH, T, sdpa=False):
        super().__init__()
        self.ln_1 = nn.LayerNorm(C, eps=1e-5)
        self.attn = causal_self_attention(C, NH, T, sdpa)
        self.ln_2 = nn.LayerNorm(C, eps=1e-5)
        self.c_fc = nn.Linear(C, 4 * C)
        self.c_proj = nn.Linear(4 * C, C)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.c_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class char_gpt(nn.Module):
    def __init__(self, V, T, C, NH, L, sdpa=False):
        super().__init__()
        self.wte = nn.Embedding(V, C)
        self.wpe = nn.Embedding(T, C)
        self.h = nn.ModuleList([block(C, NH, T, sdpa) for _ in range(L)])
        self.ln_f = nn.LayerNorm(C, eps=1e-5)
        self.lm_head = nn.Linear(C, V, bias=False)  # untied, as in the model file
        # Initialisation as the model file declares it (std 0.02, position 0.01, residual
        # projections 0.02/sqrt(2L), zero biases, unit norms), so losses are comparable.
        proj_std = 0.02 / math.sqrt(2 * L)
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif p.dim() == 1:
                nn.init.ones_(p)
            elif name == "wpe.weight":
                nn.init.normal_(p, std=0.01)
            elif name.endswith("c_proj.weight"):
                nn.init.normal_(p, std=proj_std)
            else:
                nn.init.normal_(p, std=0.02)

    def forward(self, idx, targets):
        B, T = idx.shape
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for b in self.h:
            x = b(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(B * T, -1), targets.reshape(B * T))


def load_tokens(path, val_fraction):
    """Character tokens of the corpus' training split; ids follow increasing byte value."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        sys.exit(f"torch_char_gpt: cannot read corpus {path}: {e.strerror} (run scripts/get-data.sh)")
    chars = sorted(set(raw))
    index = bytes(range(256)).maketrans(bytes(chars), bytes(range(len(chars))))
    tokens = torch.frombuffer(bytearray(raw.translate(index)), dtype=torch.uint8).long()
    n_train = len(tokens) - int(len(tokens) * val_fraction)
    return tokens[:n_train], len(chars)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap.add_argument("--steps", type=int, default=30, help="timed optimizer steps")
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps before the timed ones")
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)),
                    help="torch.set_num_threads (default: usable cores)")
    ap.add_argument("--data", default=os.path.join(root, "data", "kjv.txt"))
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=64)
    ap.add_argument("--channels", type=int, default=256)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--min-lr", type=float, default=1e-4)
    ap.add_argument("--lr-warmup", type=int, default=40, help="linear learning-rate warm-up steps")
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--log-every", type=int, default=0, help="print a progress line every N steps (0: none)")
    ap.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (bench/gpu_bench.sh)")
    ap.add_argument("--attention", choices=("spelled", "sdpa"), default="spelled",
                    help="spelled-out softmax(QK^T)V, or F.scaled_dot_product_attention (PyTorch >= 2.0)")
    ap.add_argument("--precision", choices=("fp32", "bf16"), default="fp32",
                    help="fp32, or bf16 autocast (bf16 matmuls and activations, fp32 weights; CUDA only)")
    ap.add_argument("--compile", action="store_true",
                    help="torch.compile the model (PyTorch >= 2.0; the warm-up steps absorb the compilation)")
    a = ap.parse_args()
    if a.steps < 1 or a.warmup < 0 or a.threads < 1:
        sys.exit("torch_char_gpt: need --steps >= 1, --warmup >= 0, --threads >= 1")

    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    gen = torch.Generator().manual_seed(a.seed)
    train, n_chars = load_tokens(a.data, 0.1)
    if n_chars > a.vocab:
        sys.exit(f"torch_char_gpt: corpus has {n_chars} distinct bytes, more than --vocab {a.vocab}")
    B, T = a.batch, a.context
    offsets = torch.arange(T + 1)

    device = torch.device(a.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("torch_char_gpt: --device cuda but torch sees no CUDA device")
    if a.attention == "sdpa" and not hasattr(F, "scaled_dot_product_attention"):
        sys.exit(f"torch_char_gpt: --attention sdpa needs PyTorch 2.0 or later (this is {torch.__version__})")
    if a.precision == "bf16" and device.type != "cuda":
        sys.exit("torch_char_gpt: --precision bf16 is for --device cuda")
    # fp32 matmuls stay IEEE fp32 (TF32 off, PyTorch's default); bf16 is torch.autocast, PyTorch's
    # usual mixed precision.
    torch.backends.cuda.matmul.allow_tf32 = False
    def autocast():
        if a.precision == "bf16":
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()
    model = char_gpt(a.vocab, T, a.channels, a.heads, a.layers, a.attention == "sdpa").to(device)
    if a.compile:
        if not hasattr(torch, "compile"):
            sys.exit(f"torch_char_gpt: --compile needs PyTorch 2.0 or later (this is {torch.__version__})")
        model = torch.compile(model)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8)
    total = a.warmup + a.steps
    n_params = sum(p.numel() for p in model.parameters())
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {n_params} parameters, "
          f"batch {B} x {T}, {a.precision}, {a.warmup} warm-up + {a.steps} timed steps", file=sys.stderr)

    loss_value = float("nan")
    t_start = time.perf_counter()
    for step in range(total):
        if step == a.warmup:
            t_start = time.perf_counter()
        starts = torch.randint(0, len(train) - T - 1, (B,), generator=gen)
        rows = train[starts[:, None] + offsets]  # (B, T+1)
        x, y = rows[:, :-1].to(device), rows[:, 1:].to(device)
        lr = lr_at(step, a.lr, a.min_lr, a.lr_warmup, total)
        for g in opt.param_groups:
            g["lr"] = lr
        with autocast():
            loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        loss_value = loss.item()  # waits for the step (also on a GPU)
        if a.log_every > 0 and (step + 1) % a.log_every == 0:
            print(f"step {step + 1}/{total} | loss {loss_value:.4f} | lr {lr:.2e}", file=sys.stderr)
    seconds = time.perf_counter() - t_start

    tokens_per_s = a.steps * B * T / seconds
    gpu = ""
    if device.type == "cuda":
        peak_rss_mb_gpu = torch.cuda.max_memory_allocated(device) / 2**20
        print(f"peak GPU memory allocated {peak_rss_mb_gpu:.0f} MiB", file=sys.stderr)
        gpu = f" peak_gpu_allocated_mib={peak_rss_mb_gpu:.0f}"
    peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # ru_maxrss is KiB on Linux
    print(f"RESULT tokens_per_s={tokens_per_s:.1f} peak_rss_mb={peak_rss_mb:.1f} loss={loss_value:.4f} "
          f"steps={a.steps} warmup={a.warmup} threads={torch.get_num_threads()} seconds={seconds:.3f}{gpu}")


if __name__ == "__main__":
    main()
