"""PyTorch versions of evt's example models (examples/*.evt, written by examples/gen.py).

Each model is a function `loss = MODEL(cfg, t)`: `cfg` holds the knobs of gen.py (gen.DEFAULTS[name] or
gen.config(name, argv)[0]), `t` maps evt's input and param names (without '%') to torch tensors. Params
use evt's layouts (a linear weight is [in, out]), so evt's values copy over by name and gradients compare
by name. The computation is written independently with standard torch ops (F.linear-free matmuls,
F.layer_norm, F.scaled_dot_product_attention, F.conv2d, F.batch_norm, F.cross_entropy, ...), in fp32 or
fp64 on the CPU; only the dropout masks are evt's: `philox_keep` rebuilds them bit for bit from
kernels/philox.h (seed = 1, 2, 3, ... in order of appearance, offset 0, as gen.py assigns them).
"""
import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "examples"))
import gen  # noqa: E402  (examples/gen.py: DEFAULTS, config, build)

M32 = np.uint64(0xFFFFFFFF)


def philox_words(seed, counter):
    """Philox4x32-10's four output words (a 4 x len(counter) array) for a vector of 64-bit counters, step 0
    (kernels/philox.h)."""
    counter = np.asarray(counter, dtype=np.uint64)
    c0 = counter & M32
    c1 = counter >> np.uint64(32)
    c2 = np.zeros_like(c0)
    c3 = np.zeros_like(c0)
    k0 = np.uint64(seed & 0xFFFFFFFF)
    k1 = np.uint64((seed >> 32) & 0xFFFFFFFF)
    for _ in range(10):
        p0 = np.uint64(0xD2511F53) * c0
        p1 = np.uint64(0xCD9E8D57) * c2
        hi0, lo0 = p0 >> np.uint64(32), p0 & M32
        hi1, lo1 = p1 >> np.uint64(32), p1 & M32
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        k0 = (k0 + np.uint64(0x9E3779B9)) & M32
        k1 = (k1 + np.uint64(0xBB67AE85)) & M32
    return np.stack([c0, c1, c2, c3])


def philox_uniform(seed, offset, n):
    """evt_philox_uniform(seed, offset, step 0, i) for i in [0, n): stream element j = offset + i is word j % 4
    of counter j / 4, its top 24 bits * 2^-24 (one step's masks)."""
    j = np.arange(n, dtype=np.uint64) + np.uint64(offset)
    w = philox_words(seed, j >> np.uint64(2))[(j & np.uint64(3)).astype(np.int64), np.arange(n)]
    return (w >> np.uint64(8)).astype(np.float64) * (1.0 / 16777216.0)


def philox_keep(seed, offset, shape, p):
    """evt's dropout mask: element i (row-major) is kept iff its uniform >= p."""
    n = int(np.prod(shape)) if len(shape) else 1
    return torch.from_numpy(philox_uniform(seed, offset, n) >= p).reshape(shape)


class Dropper:
    """Dropout with evt's masks: the k-th call uses seed k, offset 0 (gen.Builder.dropout)."""

    def __init__(self, p):
        self.p, self.seed = p, 0

    def __call__(self, x):
        self.seed += 1
        keep = philox_keep(self.seed, 0, tuple(x.shape), self.p)
        return x * keep.to(x.dtype) / (1.0 - self.p)


def linear(t, prefix, x, bias=True):
    y = x @ t[f"{prefix}.w"]
    return y + t[f"{prefix}.b"] if bias else y


def layer_norm(t, prefix, x, eps=1e-5):
    return F.layer_norm(x, (x.shape[-1],), t[f"{prefix}.w"], t[f"{prefix}.b"], eps)


# ---- the models -----------------------------------------------------------------------------------------

def mlp(cfg, t):
    drop = Dropper(cfg["dropout"])
    x = t["x"]
    for i in range(cfg["layers"]):
        h = F.gelu(linear(t, f"l{i}.fc1", x), approximate="tanh" if cfg.get("gelu") == "tanh" else "none")
        h = drop(linear(t, f"l{i}.fc2", h))
        x = layer_norm(t, f"l{i}.ln", x + h)
    return F.cross_entropy(linear(t, "head", x), t["y"])


def self_attention(cfg, t, p, x2d, b, s, use_sdpa, drop):
    h, nh = x2d.shape[1], cfg["heads"]
    dh = h // nh

    def heads(name):  # [B*S,H] -> [B,nh,S,dh]
        return linear(t, f"{p}.{name}", x2d).reshape(b, s, nh, dh).transpose(1, 2)

    q, k, v = heads("q"), heads("k"), heads("v")
    if use_sdpa:
        ctx = F.scaled_dot_product_attention(q, k, v, scale=1.0 / math.sqrt(dh))
    else:
        probs = torch.softmax((q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(dh)), dim=-1)
        ctx = drop(probs) @ v
    return ctx.transpose(1, 2).reshape(b * s, h)


def bert_layer(cfg, t, use_sdpa=False):
    drop = Dropper(cfg["dropout"])
    B, S, H = cfg["batch"], cfg["seq"], cfg["hidden"]
    x = t["x"].reshape(B * S, H)
    ctx = self_attention(cfg, t, "attn", x, B, S, use_sdpa, drop)
    x1 = layer_norm(t, "ln1", x + drop(linear(t, "attn.out", ctx)), cfg["eps"])
    h = drop(linear(t, "ffn.fc2", F.gelu(linear(t, "ffn.fc1", x1))))
    x2 = layer_norm(t, "ln2", x1 + h, cfg["eps"])
    labels = torch.where(t["mlm.u"] < cfg["mlm_prob"], t["tokens"], torch.full_like(t["tokens"], -100))
    return F.cross_entropy(linear(t, "mlm.decoder", x2), labels, ignore_index=-100)


def bert_layer_sdpa(cfg, t):
    return bert_layer(cfg, t, use_sdpa=True)


def vit(cfg, t):
    drop = Dropper(cfg["dropout"])
    B, P, D = cfg["batch"], cfg["patch"], cfg["hidden"]
    e = F.conv2d(t["image"], t["patch.w"], t["patch.b"], stride=P)      # [B,D,n,n]
    e = e.flatten(2).transpose(1, 2)                                     # [B,n,D]
    x = torch.cat([t["cls"].expand(B, 1, D), e], dim=1) + t["pos"]     # [B,T,D]
    T = x.shape[1]
    x = x.reshape(B * T, D)
    for i in range(cfg["layers"]):
        q = f"b{i}"
        ctx = self_attention(cfg, t, f"{q}.attn", layer_norm(t, f"{q}.ln1", x, cfg["eps"]), B, T, True, drop)
        x = x + drop(linear(t, f"{q}.attn.out", ctx))
        h = F.gelu(linear(t, f"{q}.mlp.fc1", layer_norm(t, f"{q}.ln2", x, cfg["eps"])))
        x = x + drop(linear(t, f"{q}.mlp.fc2", h))
    x = layer_norm(t, "ln_f", x, cfg["eps"]).reshape(B, T, D)
    return F.cross_entropy(linear(t, "head", x[:, 0]), t["y"])


def xmlcnn(cfg, t):
    drop = Dropper(cfg["dropout"])
    targets = (t["targets.u"] < cfg["density"]).to(t["targets.u"].dtype)
    e = F.embedding(t["tokens"], t["emb.w"])                             # [B,L,E]
    e = e.transpose(1, 2).unsqueeze(2)                                   # [B,E,1,L]
    feats = []
    for k in [int(k) for k in cfg["kernels"].split(",")]:
        c = F.relu(F.conv2d(e, t[f"conv{k}.w"], t[f"conv{k}.b"]))
        feats.append(F.adaptive_max_pool2d(c, (1, cfg["pool"])).flatten(1))
    h = drop(F.relu(linear(t, "fc", torch.cat(feats, dim=1))))
    return F.binary_cross_entropy_with_logits(linear(t, "out", h), targets)


def gcn(cfg, t):
    drop = Dropper(cfg["dropout"])
    rowptr, col, val = t["adj.rowptr"], t["adj.col"], t["adj.val"]
    n = rowptr.shape[0] - 1
    row = torch.repeat_interleave(torch.arange(n), rowptr[1:] - rowptr[:-1])

    def spmm(x):  # CSR A @ x as a scatter-add of val * x[col] into rows
        return torch.zeros(n, x.shape[1], dtype=x.dtype).index_add(0, row, val[:, None].to(x.dtype) * x[col])

    h = drop(F.relu(spmm(linear(t, "l1", t["x"], bias=False)) + t["l1.b"]))
    logits = spmm(linear(t, "l2", h, bias=False)) + t["l2.b"]
    return F.cross_entropy(logits, t["y"])


def resnet_block(cfg, t):
    x = t["x"]

    def conv_bn(prefix, z):
        c = F.conv2d(z, t[f"{prefix}.w"], padding=1)
        return F.batch_norm(c, None, None, t[f"{prefix}.bn.w"], t[f"{prefix}.bn.b"], training=True, eps=1e-5)

    for i in range(cfg["layers"]):
        h = F.relu(conv_bn(f"b{i}.c1", x))
        x = F.relu(conv_bn(f"b{i}.c2", h) + x)
    x = F.max_pool2d(x, 2, 2).mean(dim=(2, 3))
    return F.cross_entropy(linear(t, "head", x), t["y"])


MODELS = {
    "mlp": mlp,
    "bert_layer": bert_layer,
    "bert_layer_sdpa": bert_layer_sdpa,
    "vit": vit,
    "xmlcnn": xmlcnn,
    "gcn": gcn,
    "resnet_block": resnet_block,
}
assert set(MODELS) == set(gen.BUILDERS), "every example needs a PyTorch model"
