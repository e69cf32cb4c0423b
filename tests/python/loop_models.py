"""Small models for the training-loop tests (test_training_loop.py) and the distributed runs
(distributed_train.py): a tiny transformer language model and a BatchNorm MLP, their batches, and the error
measure the tests use."""
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

VOCAB, DIM = 32, 16


class Block(nn.Module):
    """A pre-LN transformer block (causal SDPA, GELU MLP); ckpt: each half under torch.utils.checkpoint."""

    def __init__(self, d=DIM, heads=2, ff=2 * DIM, ckpt=False):
        super().__init__()
        self.heads, self.ckpt = heads, ckpt
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.up, self.down = nn.Linear(d, ff), nn.Linear(ff, d)

    def attention(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (t.view(b, s, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(a.transpose(1, 2).reshape(b, s, d))

    def mlp(self, x):
        return self.down(F.gelu(self.up(self.ln2(x))))

    def forward(self, x):
        if self.ckpt:
            x = x + checkpoint(self.attention, x, use_reentrant=False)
            return x + checkpoint(self.mlp, x, use_reentrant=False)
        x = x + self.attention(x)
        return x + self.mlp(x)


class TinyLM(nn.Module):
    """Embedding -> transformer block -> vocabulary head -> cross-entropy over every token."""

    def __init__(self, ckpt=False):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM)
        self.block = Block(ckpt=ckpt)
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, tokens, targets):
        logits = self.head(self.block(self.emb(tokens)))
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


class BatchNormMLP(nn.Module):
    """Linear -> BatchNorm1d -> ReLU -> Linear -> cross-entropy: train and eval compute differently."""

    def __init__(self):
        super().__init__()
        # (no bias before the batch norm: its gradient is zero, only rounding noise would compare)
        self.l1, self.bn, self.l2 = nn.Linear(8, 16, bias=False), nn.BatchNorm1d(16), nn.Linear(16, 4)

    def forward(self, x, y):
        return F.cross_entropy(self.l2(F.relu(self.bn(self.l1(x)))), y)


def lm_batch(batch=2, seq=8):
    return torch.randint(0, VOCAB, (batch, seq)), torch.randint(0, VOCAB, (batch, seq))


def mlp_batch(batch=8):
    return torch.randn(batch, 8), torch.randint(0, 4, (batch,))


def rel_err(a, b):
    """max |a - b| / max |b|; inf or NaN in either gives inf (never passes)."""
    a, b = a.detach().double(), b.detach().double()
    if not (torch.isfinite(a).all() and torch.isfinite(b).all()):
        return float("inf")
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-6)).item()
