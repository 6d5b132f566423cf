"""Pieces the PyTorch reference peers (bench/torch_char_gpt.py, bench/resnet_torch.py) share."""
import math


def lr_at(step, lr, min_lr, warmup, total):
    """ops/optim.cpp lr_at: linear warm-up, then cosine from lr to min_lr at `total`."""
    if step < warmup:
        return lr * (step + 1) / warmup
    if step >= total:
        return min_lr
    progress = (step - warmup) / (total - warmup)
    return min_lr + 0.5 * (lr - min_lr) * (1.0 + math.cos(math.pi * progress))
