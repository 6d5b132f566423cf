#!/usr/bin/python3
"""ResNets on Fashion-MNIST in PyTorch: the reference that bench/resnet_bench.sh measures FusionLLM against.

The models mirror configs/models/{resnet-fmnist,resnet18-small,resnet50-small,resnet101-small}.pbtxt
layer for layer (3x3 stride-1 stem without max pool, torchvision-style basic / v1.5 bottleneck
blocks, bias-free convolutions, batchnorm eps 1e-5 momentum 0.1, global average pool, linear),
initialised as our ops do (conv: normal, std sqrt(2 / (out k k)); linear: normal std 0.02, zero
bias; batchnorm: ones and zeros). Training follows configs/runs/resnet-fmnist.ini: the global
batch split into --micro-batches micro-batches (each with its own batchnorm statistics, the loss
of each scaled by 1/M, gradients accumulated), global-norm gradient clipping, AdamW with
decoupled weight decay on conv and linear weights only, linear warm-up then cosine to --min-lr
over the total steps (ops/optim.cpp lr_at). Data as core/image_source: pixels/255 normalised
with the training split's mean and std (population), epochs of a shuffled training set, random
crop from the image padded by --crop-padding pixels of (normalised) black, random horizontal
flip; evaluation on the test split, never augmented. Written for Debian's PyTorch 1.13
(python3-torch, no torchvision).

A shared start: --init-from takes the initial weights from a FusionLLM checkpoint
(`fusion-train --train.steps=0 --output.checkpoint=FILE` writes them) and --data-order fusion
draws FusionLLM's batches for --seed, image for image (core/image_source's shuffle, crops and
flips), so the two runs differ only in floating-point rounding; --loss-log keeps each step's
loss for a step-by-step comparison. --grad-check CKPT trains nothing: it compares step 1's
gradients, ours (from the checkpoint after one step) and float32 PyTorch's, with float64
PyTorch's. bench/resnet_bench.sh --shared-start does all of it.

    OMP_WAIT_POLICY=PASSIVE /usr/bin/python3 bench/resnet_torch.py --model resnet-fmnist --steps 1875
    OMP_WAIT_POLICY=PASSIVE /usr/bin/python3 bench/resnet_torch.py --model resnet50-small --steps 50 --skip 3

Progress goes to stderr; the last line on stdout is one JSON object:
    {"model", "parameters", "batch", "micro_batches", "steps", "skip", "threads", "images_per_s",
     "train_seconds", "eval_seconds", "seconds", "final_loss", "test_loss", "test_accuracy",
     "eval_images", "torch"}
images_per_s counts the steps after the first --skip ones (each step: batch assembly and
augmentation, forward, backward, clipping, the AdamW update), evaluation excluded.
test_accuracy is a fraction (0..1), test_loss the mean cross-entropy over the evaluated images.
"""

import argparse
import copy
import gzip
import json
import math
import os
import re
import struct
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from torch_common import lr_at

# (block kind, stem width, [(base width, blocks, stride) per stage]) of each model file.
MODELS = {
    "resnet-fmnist": ("basic", 16, [(16, 1, 1), (32, 1, 2), (64, 1, 2)]),
    "resnet18-small": ("basic", 64, [(64, 2, 1), (128, 2, 2), (256, 2, 2), (512, 2, 2)]),
    "resnet50-small": ("bottleneck", 64, [(64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)]),
    "resnet101-small": ("bottleneck", 64, [(64, 3, 1), (128, 4, 2), (256, 23, 2), (512, 3, 2)]),
}
BN_EPS, BN_MOMENTUM = 1e-5, 0.1


def conv(cin, cout, k, stride=1):
    return nn.Conv2d(cin, cout, k, stride=stride, padding=k // 2, bias=False)


def bn(c):
    return nn.BatchNorm2d(c, eps=BN_EPS, momentum=BN_MOMENTUM)


class basic(nn.Module):
    """Two 3x3 convs (stride on the first); a 1x1 strided projection + batchnorm on the shortcut
    when the width or resolution changes (the model files' basic / basic_down templates)."""
    expansion = 1

    def __init__(self, cin, w, stride):
        super().__init__()
        self.c1, self.bn1 = conv(cin, w, 3, stride), bn(w)
        self.c2, self.bn2 = conv(w, w, 3), bn(w)
        self.proj = nn.Sequential(conv(cin, w, 1, stride), bn(w)) if stride != 1 or cin != w else None

    def forward(self, x):
        y = F.relu(self.bn1(self.c1(x)))
        y = self.bn2(self.c2(y))
        return F.relu((x if self.proj is None else self.proj(x)) + y)


class bottleneck(nn.Module):
    """1x1, 3x3 (stride here: torchvision v1.5), 1x1 to 4w; projection shortcut when needed
    (the model files' bottleneck / bottleneck_down templates)."""
    expansion = 4

    def __init__(self, cin, w, stride):
        super().__init__()
        out = 4 * w
        self.c1, self.bn1 = conv(cin, w, 1), bn(w)
        self.c2, self.bn2 = conv(w, w, 3, stride), bn(w)
        self.c3, self.bn3 = conv(w, out, 1), bn(out)
        self.proj = nn.Sequential(conv(cin, out, 1, stride), bn(out)) if stride != 1 or cin != out else None

    def forward(self, x):
        y = F.relu(self.bn1(self.c1(x)))
        y = F.relu(self.bn2(self.c2(y)))
        y = self.bn3(self.c3(y))
        return F.relu((x if self.proj is None else self.proj(x)) + y)


class resnet(nn.Module):
    def __init__(self, name, in_channels=1, classes=10):
        super().__init__()
        self.name = name
        kind, stem, stages = MODELS[name]
        block = basic if kind == "basic" else bottleneck
        self.conv1, self.bn1 = conv(in_channels, stem, 3), bn(stem)
        layers, cin = [], stem
        for w, n, stride in stages:
            for i in range(n):
                layers.append(block(cin, w, stride if i == 0 else 1))
                cin = w * block.expansion
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, classes)
        # Our initialisation (ops/cpu/conv.cpp, linear.cpp, batchnorm.cpp).
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.normal_(m.weight, std=math.sqrt(2.0 / (m.out_channels * m.kernel_size[0] * m.kernel_size[1])))
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=0.02)
                nn.init.zeros_(m.bias)

    def forward(self, x):
        x = self.layers(F.relu(self.bn1(self.conv1(x))))
        return self.fc(x.mean(dim=(2, 3)))


def read_idx(path):
    """An IDX file (gzip'd or raw) as a numpy uint8 array of its dimensions."""
    try:
        with (gzip.open if path.endswith(".gz") else open)(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        sys.exit(f"resnet_torch: cannot read {path}: {e.strerror or e}")
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != 8:
        sys.exit(f"resnet_torch: {path} is not an unsigned-byte IDX file")
    nd = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(nd)]
    data = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * nd)
    if data.size != int(np.prod(dims)):
        sys.exit(f"resnet_torch: {path} holds {data.size} values, its header says {dims}")
    return data.reshape(dims)


def find_idx(d, name):
    for p in (os.path.join(d, name + ".gz"), os.path.join(d, name)):
        if os.path.exists(p):
            return p
    sys.exit(f"resnet_torch: {os.path.join(d, name)}[.gz] not found (scripts/setup.sh installs dataset-fashion-mnist)")


def load_split(d, prefix):
    images = read_idx(find_idx(d, f"{prefix}-images-idx3-ubyte"))
    labels = read_idx(find_idx(d, f"{prefix}-labels-idx1-ubyte"))
    if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
        sys.exit(f"resnet_torch: {prefix}: {images.shape} images with {labels.shape} labels")
    return images, labels


# ---- a shared start with FusionLLM: its initial weights and its batches -----------------------------

def read_fusion_checkpoint(path):
    """A FusionLLM checkpoint (format: core/checkpoint.hpp): its step and its f32 tensors as
    {name: ndarray}.
    The trailing XXH64 is not checked (the standard library has no XXH64): a damaged file shows
    as the shared start's first-step loss mismatch."""
    try:
        raw = open(path, "rb").read()
    except OSError as e:
        sys.exit(f"resnet_torch: cannot read checkpoint {path}: {e.strerror or e}")
    bad = f"resnet_torch: {path} is not a FusionLLM checkpoint (format version 1)"
    if len(raw) < 44 or raw[:8] != b"FUSNCKPT" or struct.unpack_from("<I", raw, 8)[0] != 1:
        sys.exit(bad)
    try:
        step, count = struct.unpack_from("<QI", raw, 24)
        o = 36
        for _ in range(2):  # model name, meta
            o += 4 + struct.unpack_from("<I", raw, o)[0]
        out = {}
        for _ in range(count):
            n = struct.unpack_from("<I", raw, o)[0]
            name = raw[o + 4:o + 4 + n].decode()
            o += 4 + n
            dt, rank = raw[o], raw[o + 1]
            o += 4
            dims = struct.unpack_from(f"<{rank}q", raw, o)
            o += 8 * rank
            nbytes = struct.unpack_from("<Q", raw, o)[0]
            o += 8
            if o + nbytes > len(raw) - 8:
                sys.exit(f"resnet_torch: {path} is truncated (tensor {name})")
            if dt == 0:
                out[name] = np.frombuffer(raw, dtype="<f4", count=nbytes // 4, offset=o).reshape(dims)
            o += nbytes
    except (struct.error, UnicodeDecodeError, ValueError):
        sys.exit(bad)
    return step, out


def fusion_names(ckpt, model, path):
    """{checkpoint tensor: model state_dict entry} for every parameter and running statistic of
    `model` in the FusionLLM checkpoint `ckpt` (read from `path`); stops naming the first tensor
    that does not fit. Our residual blocks (s<stage><letters><index>: s2a0, s2b1, ...) in stage
    and index order are model.layers in order; c1/bn1/... keep their names inside a block, and
    the shortcut's proj/pbn are proj.0/proj.1."""
    blocks = sorted({k.split(".")[0] for k in ckpt if re.match(r"s\d[a-z]*\d+\.", k)},
                    key=lambda p: (int(p[1]), re.sub(r"\d+$", "", p[2:]), int(re.search(r"\d+$", p).group())))
    if len(blocks) != len(model.layers):
        sys.exit(f"resnet_torch: {path} holds {len(blocks)} residual blocks, model {model.name} "
                 f"{len(model.layers)}: not a checkpoint of this model")
    state = model.state_dict()
    names = {}
    for fusion_name, value in ckpt.items():
        if fusion_name.endswith((".m", ".v")) or "/" not in fusion_name:
            continue  # AdamW moments, not model state
        op, leaf = fusion_name.split("/", 1)
        block, _, inner = op.partition(".")
        if inner:
            op = f"layers.{blocks.index(block)}.{ {'proj': 'proj.0', 'pbn': 'proj.1'}.get(inner, inner) }"
        torch_name = f"{op}.{leaf}"
        if torch_name not in state:
            sys.exit(f"resnet_torch: {path}: tensor {fusion_name} has no counterpart ({torch_name}) in model {model.name}")
        if tuple(state[torch_name].shape) != value.shape:
            sys.exit(f"resnet_torch: {path}: {fusion_name} is {value.shape}, {torch_name} {tuple(state[torch_name].shape)}")
        names[fusion_name] = torch_name
    missing = set(state) - set(names.values())
    missing = sorted(k for k in missing if not k.endswith("num_batches_tracked"))
    if missing:
        sys.exit(f"resnet_torch: {path} lacks {len(missing)} tensors of model {model.name}, e.g. {missing[0]}")
    return names


def load_fusion_init(model, path):
    """Copies a FusionLLM checkpoint's parameters and batchnorm running statistics into `model`
    (AdamW's moments start at zero on both sides)."""
    _, ckpt = read_fusion_checkpoint(path)
    state = model.state_dict()
    for fusion_name, torch_name in fusion_names(ckpt, model, path).items():
        state[torch_name] = torch.from_numpy(ckpt[fusion_name].copy())
    model.load_state_dict(state)


def grad_check(model, x, y, M, clip, beta1, path):
    """Step 1's clipped gradients, FusionLLM's (read back from its step-1 checkpoint `path`:
    AdamW's first moment after one step is (1 - beta1) * gradient) and float32 PyTorch's, against
    float64 PyTorch's from the same weights and batch. Prints a table; returns 0 when ours is
    no further from float64 than float32 PyTorch is, up to rounding noise (median over
    tensors, 1.5x)."""
    step, ckpt = read_fusion_checkpoint(path)
    if step != 1:
        sys.exit(f"resnet_torch: {path} is the checkpoint of step {step}; the gradient check needs step 1's")
    names = fusion_names(ckpt, model, path)

    def grads(m, xb):
        m.zero_grad(set_to_none=True)
        for xm, ym in zip(xb.chunk(M), y.chunk(M)):
            (F.cross_entropy(m(xm), ym) / M).backward()
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(m.parameters(), clip)
        return {n: p.grad.detach().double() for n, p in m.named_parameters()}

    exact = grads(copy.deepcopy(model).double(), x.double())
    f32 = grads(model, x)
    rows = []
    for fusion_name, torch_name in names.items():
        if torch_name not in exact:
            continue  # running statistics
        if fusion_name + ".m" not in ckpt:
            sys.exit(f"resnet_torch: {path} has no AdamW moment {fusion_name}.m: not a checkpoint of step 1")
        ours = torch.from_numpy(ckpt[fusion_name + ".m"].astype(np.float64)) / (1.0 - beta1)
        ref = exact[torch_name]
        scale = float(ref.norm()) or 1.0
        rows.append((torch_name, float((ours - ref).norm()) / scale, float((f32[torch_name] - ref).norm()) / scale))
    med_ours = float(np.median([r[1] for r in rows]))
    med_torch = float(np.median([r[2] for r in rows]))
    print(f"step 1 gradients against float64 PyTorch (relative L2 error per tensor, {len(rows)} tensors):")
    print("| tensor | FusionLLM | PyTorch float32 |\n|---|---:|---:|")
    last_conv = [n for n, _ in model.layers[-1].named_parameters() if n.startswith("c")][-1]
    shown = ("conv1.weight", "layers.0.c1.weight", f"layers.{len(model.layers) - 1}.{last_conv}", "fc.weight")
    for name, e_ours, e_torch in rows:
        if name in shown:
            print(f"| {name} | {e_ours:.2e} | {e_torch:.2e} |")
    print(f"| median | {med_ours:.2e} | {med_torch:.2e} |")
    print(f"| largest | {max(r[1] for r in rows):.2e} | {max(r[2] for r in rows):.2e} |")
    return 0 if med_ours <= 1.5 * med_torch else 1


M64 = (1 << 64) - 1


def splitmix64(x):
    """core/data.cpp splitmix64."""
    x = (x + 0x9E3779B97F4A7C15) & M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


def below(h, n):
    """core/image_source.cpp below: h mapped onto [0, n) by a 128-bit multiply."""
    return (h * n) >> 64


class fusion_order:
    """core/image_source.cpp's batches: the shuffle (epoch-wise Fisher-Yates keyed by the seed) and
    the augmentation draws (crop offsets, flip bit) of each row, bit for bit."""
    PERM_SALT = 0x5045524D55544531  # "PERMUTE1"

    def __init__(self, seed, n):
        self.seed, self.n, self.epoch, self.perm = seed & M64, n, -1, None

    def index(self, step, B, r):
        p = step * B + r
        e = p // self.n
        if e != self.epoch:
            key = splitmix64(splitmix64(self.seed ^ self.PERM_SALT) ^ e)
            perm = list(range(self.n))
            for i in range(self.n - 1, 0, -1):
                j = below(splitmix64(key ^ i), i + 1)
                perm[i], perm[j] = perm[j], perm[i]
            self.epoch, self.perm = e, perm
        return self.perm[p % self.n]

    def augmentation(self, step, r, pad):
        step_key = splitmix64(splitmix64(self.seed) ^ step)
        h1 = splitmix64(step_key ^ r)
        h2 = splitmix64(h1)
        h3 = splitmix64(h2)
        return below(h1, 2 * pad + 1), below(h2, 2 * pad + 1), (h3 >> 63) != 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="resnet-fmnist", choices=sorted(MODELS))
    ap.add_argument("--batch", type=int, default=64, help="global batch (images per optimizer step)")
    ap.add_argument("--micro-batches", type=int, default=2, help="micro-batches per step (divides --batch)")
    ap.add_argument("--steps", type=int, default=0, help="optimizer steps (default: --epochs' worth)")
    ap.add_argument("--epochs", type=float, default=1.0, help="training epochs when --steps is not given")
    ap.add_argument("--skip", type=int, default=5, help="first steps left out of images_per_s")
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)),
                    help="torch.set_num_threads (default: usable cores)")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--min-lr", type=float, default=1e-4)
    ap.add_argument("--warmup-steps", type=int, default=100, help="linear learning-rate warm-up steps")
    ap.add_argument("--total-steps", type=int, default=0, help="cosine schedule length (0: --steps)")
    ap.add_argument("--weight-decay", type=float, default=0.05, help="decoupled, conv and linear weights only")
    ap.add_argument("--beta1", type=float, default=0.9)
    ap.add_argument("--beta2", type=float, default=0.95)
    ap.add_argument("--eps", type=float, default=1e-8)
    ap.add_argument("--grad-clip", type=float, default=1.0, help="max global gradient norm (0: off)")
    ap.add_argument("--crop-padding", type=int, default=2, help="random-crop padding in pixels (0: no crop)")
    ap.add_argument("--flip", type=int, default=1, choices=(0, 1), help="random horizontal flip")
    ap.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--eval-every", type=int, default=0, help="evaluate every N steps too (0: at the end only)")
    ap.add_argument("--eval-images", type=int, default=0,
                    help="evaluate on the first N test images (0: all of them)")
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--init-from", default="",
                    help="start from this FusionLLM checkpoint's weights and running statistics "
                         "(fusion-train --train.steps=0 --output.checkpoint=FILE writes the initial ones)")
    ap.add_argument("--data-order", default="torch", choices=("torch", "fusion"),
                    help="torch: batches shuffled and augmented by torch's generator from --seed; "
                         "fusion: FusionLLM's batches for --seed (core/image_source), image for image")
    ap.add_argument("--loss-log", default="", help="write each step's training loss to this file, one per line")
    ap.add_argument("--grad-check", default="", metavar="CKPT",
                    help="instead of training: compare step 1's gradients, FusionLLM's (its checkpoint after "
                         "one step, CKPT) and float32 PyTorch's, with float64 PyTorch's; needs --init-from "
                         "and --data-order fusion; exit status 1 when ours is the less accurate")
    ap.add_argument("--log-every", type=int, default=50, help="progress line every N steps (0: none)")
    ap.add_argument("--json", default="", help="also write the result JSON to this file")
    a = ap.parse_args()
    if a.batch < 1 or a.micro_batches < 1 or a.batch % a.micro_batches:
        sys.exit(f"resnet_torch: --micro-batches {a.micro_batches} must divide --batch {a.batch}")
    if a.batch // a.micro_batches < 2:
        sys.exit("resnet_torch: batchnorm needs at least 2 images per micro-batch")
    if a.grad_check and (not a.init_from or a.data_order != "fusion"):
        sys.exit("resnet_torch: --grad-check needs --init-from (the same initial weights) and --data-order fusion")
    if a.threads < 1 or a.skip < 0 or a.steps < 0 or a.eval_images < 0 or a.eval_every < 0:
        sys.exit("resnet_torch: need --threads >= 1 and --skip, --steps, --eval-images, --eval-every >= 0")

    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    gen = torch.Generator().manual_seed(a.seed)

    # ---- data ------------------------------------------------------------------------------------
    train_px, train_y = load_split(a.data_dir, "train")
    test_px, test_y = load_split(a.data_dir, "t10k")
    N, H, W = train_px.shape
    if test_px.shape[1:] != (H, W):
        sys.exit(f"resnet_torch: test images are {test_px.shape[1:]}, training images {(H, W)}")
    # Mean and population std of the training pixels in [0, 1], from a histogram (image_source.cpp).
    counts = np.bincount(train_px.reshape(-1), minlength=256).astype(np.float64)
    v = np.arange(256) / 255.0
    mean = float((counts * v).sum() / counts.sum())
    std = float(math.sqrt((counts * (v - mean) ** 2).sum() / counts.sum()))
    lut = ((v - mean) / std).astype(np.float32)  # normalised value of each raw pixel value
    black = float(lut[0])
    train_x = torch.from_numpy(lut[train_px]).unsqueeze(1)  # (N, 1, H, W) f32
    train_t = torch.from_numpy(train_y.astype(np.int64))
    n_eval = len(test_px) if a.eval_images == 0 else min(a.eval_images, len(test_px))
    test_x = torch.from_numpy(lut[test_px[:n_eval]]).unsqueeze(1)
    test_t = torch.from_numpy(test_y[:n_eval].astype(np.int64))

    B, M, P = a.batch, a.micro_batches, a.crop_padding
    steps = a.steps if a.steps > 0 else max(1, math.ceil(a.epochs * N / B))
    total = a.total_steps if a.total_steps > 0 else steps
    if a.skip >= steps:
        sys.exit(f"resnet_torch: --skip {a.skip} leaves no timed step of {steps}")
    rows = torch.arange(H).view(1, H, 1)
    cols = torch.arange(W).view(1, 1, W)

    perm, perm_epoch = None, -1
    order = fusion_order(a.seed, N) if a.data_order == "fusion" else None

    def draws(step):
        """Batch `step`'s images and augmentation: idx (B,), crop offsets dy, dx (B, 1, 1) (None
        without padding) and flip (B,) (None without flips), from FusionLLM's draws (order) or
        torch's generator."""
        if order is not None:
            idx = torch.tensor([order.index(step, B, r) for r in range(B)], dtype=torch.int64)
            aug = torch.tensor([order.augmentation(step, r, P) for r in range(B)], dtype=torch.int64)
            dy, dx = aug[:, 0].view(B, 1, 1), aug[:, 1].view(B, 1, 1)
            return idx, dy, dx, aug[:, 2] != 0
        nonlocal perm, perm_epoch
        idx = torch.empty(B, dtype=torch.int64)
        for r in range(B):  # at most one epoch boundary per batch; cheap next to a step
            p = step * B + r
            e = p // N
            if e != perm_epoch:
                perm, perm_epoch = torch.randperm(N, generator=gen), e
            idx[r] = perm[p % N]
        dy = dx = flip = None
        if P > 0:
            dy = torch.randint(0, 2 * P + 1, (B, 1, 1), generator=gen)
            dx = torch.randint(0, 2 * P + 1, (B, 1, 1), generator=gen)
        if a.flip:
            flip = torch.rand(B, generator=gen) < 0.5
        return idx, dy, dx, flip

    def train_batch(step):
        """Rows step*B .. step*B+B-1 of the epoch-wise shuffled training set, augmented."""
        idx, dy, dx, flip = draws(step)
        x = train_x[idx]
        if P > 0:
            padded = F.pad(x, (P, P, P, P), value=black)  # (B, 1, H+2P, W+2P)
            b = torch.arange(B).view(B, 1, 1)
            x = padded[b, 0, rows + dy, cols + dx].unsqueeze(1)
        if a.flip:  # after the crop, as core/image_source mirrors the cropped image
            x = torch.where(flip.view(B, 1, 1, 1), x.flip(-1), x)
        return x.contiguous(), train_t[idx]

    # ---- model and optimizer -----------------------------------------------------------------------
    model = resnet(a.model)
    if a.init_from:
        load_fusion_init(model, a.init_from)
    n_params = sum(p.numel() for p in model.parameters())
    decay = [p for p in model.parameters() if p.dim() >= 2]     # conv and linear weights
    no_decay = [p for p in model.parameters() if p.dim() < 2]   # batchnorm weights and biases, linear bias
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(a.beta1, a.beta2), eps=a.eps)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_at(s, a.lr, a.min_lr, a.warmup_steps, total) / a.lr)
    print(f"resnet_torch: torch {torch.__version__}, {torch.get_num_threads()} threads, model {a.model}, "
          f"{n_params} parameters, batch {B} in {M} micro-batches, {steps} steps ({steps * B / N:.2f} epochs), "
          f"first {a.skip} untimed; data: {N} training and {len(test_px)} test images of {H}x{W}, "
          f"pixel mean {mean:.4f}, std {std:.4f}, crop padding {P}, flip {bool(a.flip)}; "
          f"evaluating on {n_eval} test images; {a.data_order}'s batches for seed {a.seed}, "
          f"initial weights {'from ' + a.init_from if a.init_from else 'drawn by torch'}",
          file=sys.stderr, flush=True)

    if a.grad_check:
        x, y = train_batch(0)
        sys.exit(grad_check(model, x, y, M, a.grad_clip, a.beta1, a.grad_check))

    def evaluate():
        model.eval()
        loss_sum, correct = 0.0, 0
        with torch.no_grad():
            for i in range(0, n_eval, B):
                logits = model(test_x[i:i + B])
                loss_sum += F.cross_entropy(logits, test_t[i:i + B], reduction="sum").item()
                correct += int((logits.argmax(1) == test_t[i:i + B]).sum())
        model.train()
        return loss_sum / n_eval, correct / n_eval

    # ---- training --------------------------------------------------------------------------------
    model.train()
    timed_s = train_s = eval_s = 0.0
    loss_value = float("nan")
    test_loss = test_acc = float("nan")
    loss_log = open(a.loss_log, "w") if a.loss_log else None
    t_all = time.perf_counter()
    for step in range(steps):
        t0 = time.perf_counter()
        x, y = train_batch(step)
        lr = opt.param_groups[0]["lr"]
        opt.zero_grad(set_to_none=True)
        loss_sum = 0.0
        for xm, ym in zip(x.chunk(M), y.chunk(M)):
            loss = F.cross_entropy(model(xm), ym) / M
            loss.backward()
            loss_sum += loss.item()
        if a.grad_clip > 0:
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), a.grad_clip)
        else:
            norm = torch.sqrt(sum((p.grad.double() ** 2).sum() for p in model.parameters() if p.grad is not None))
        if not math.isfinite(loss_sum) or not math.isfinite(float(norm)):
            sys.exit(f"resnet_torch: diverged at step {step + 1} (loss {loss_sum}, gradient norm {float(norm)})")
        opt.step()
        sched.step()
        loss_value = loss_sum
        if loss_log:
            loss_log.write(f"{loss_sum:.9g}\n")
            loss_log.flush()
        dt = time.perf_counter() - t0
        train_s += dt
        if step >= a.skip:
            timed_s += dt
        if a.log_every > 0 and ((step + 1) % a.log_every == 0 or step + 1 == steps):
            rate = (step + 1 - a.skip) * B / timed_s if step >= a.skip else (step + 1) * B / train_s
            print(f"step {step + 1}/{steps} | loss {loss_value:.4f} | lr {lr:.2e} | grad_norm {float(norm):.3f} | "
                  f"{rate:.0f} img/s", file=sys.stderr, flush=True)
        if step + 1 == steps or (a.eval_every > 0 and (step + 1) % a.eval_every == 0):
            t1 = time.perf_counter()
            test_loss, test_acc = evaluate()
            eval_s += time.perf_counter() - t1
            print(f"step {step + 1} | test_loss {test_loss:.4f} | test_accuracy {100 * test_acc:.2f}%",
                  file=sys.stderr, flush=True)
    seconds = time.perf_counter() - t_all
    if loss_log:
        loss_log.close()

    result = {
        "model": a.model, "parameters": n_params, "batch": B, "micro_batches": M, "steps": steps, "skip": a.skip,
        "threads": torch.get_num_threads(), "images_per_s": round((steps - a.skip) * B / timed_s, 2),
        "train_seconds": round(train_s, 3), "eval_seconds": round(eval_s, 3), "seconds": round(seconds, 3),
        "final_loss": round(loss_value, 6), "test_loss": round(test_loss, 6), "test_accuracy": round(test_acc, 6),
        "eval_images": n_eval, "torch": torch.__version__,
    }
    line = json.dumps(result)
    print(f"resnet_torch: {steps} steps in {train_s:.1f} s, {result['images_per_s']:.0f} images/s, "
          f"test loss {test_loss:.4f}, test accuracy {100 * test_acc:.2f}%", file=sys.stderr, flush=True)
    if a.json:
        with open(a.json, "w") as f:
            f.write(line + "\n")
    print(line, flush=True)


if __name__ == "__main__":
    main()
