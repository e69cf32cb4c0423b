#!/usr/bin/env python3
"""Writes evt's example training steps as `.evt` text (docs/text-format.md), at any size.

    python3 examples/gen.py MODEL [--batch N --seq N --hidden N ...] [-o FILE]   one model, to stdout or FILE
    python3 examples/gen.py all [--outdir examples]                           every model at its default size
    python3 examples/gen.py MODEL --help                                       the knobs of MODEL

The committed files examples/*.evt are `gen.py all` at the default (small) sizes, which train one step
on the CPU interpreter in about a second. The same structure reaches the paper's configurations, e.g.

    python3 examples/gen.py bert_layer --batch 32 --seq 512 --hidden 1024 --heads 16 --ffn 4096 --vocab 30522
    python3 examples/gen.py vit --batch 128 --image 224 --patch 14 --hidden 768 --heads 12 --ffn 3072 --layers 12
    python3 examples/gen.py xmlcnn --batch 1024 --seq 512 --emb 304 --filters 32 --hidden 512 --labels 670208
    python3 examples/gen.py gcn --nodes 736389 --features 128 --hidden 64 --classes 352 --degree 8
    python3 examples/gen.py resnet_block --batch 128 --channels 64 --image 56
    python3 examples/gen.py vit --paper                  (the preset of the paper's table; see PAPER)

Every model ends in a scalar loss (`loss %loss`); its parameters are `param` nodes, its data `input` nodes
with an init attribute saying how `evtc run` and the tests fill them. Dropout nodes get seeds 1, 2, 3, ...
in the order they appear (offset 0), so a reference model can rebuild the same Philox masks.

The module is also imported by tests/python (DEFAULTS, config(), build()), so the PyTorch reference models
and the committed files cannot drift apart silently: a test regenerates every file and compares.
"""
import argparse
import math
import os
import sys


def fan_in_std(fan_in, gain=1.0):
    """gain / sqrt(fan_in), to 4 significant digits (so the text stays readable)."""
    return float(f"{gain / math.sqrt(fan_in):.4g}")


class Value:
    """A named node of the graph being written: its %name, dtype and shape."""

    def __init__(self, name, dtype, shape):
        self.name, self.dtype, self.shape = name, dtype, list(shape)

    def __str__(self):
        return "%" + self.name


def fmt_attr(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(str(int(x)) for x in v) + "]"
    if isinstance(v, float):
        r = repr(v)
        return r if ("." in r or "e" in r or "inf" in r) else r + ".0"
    return str(v)


class Builder:
    """Writes one `graph NAME { ... }` block. Every statement carries its full type, so a shape mistake in
    this generator shows up as a type error from `evtc check`."""

    def __init__(self, name, header, dtype):
        self.name, self.header, self.dtype = name, header, dtype
        self.lines = []
        self.names = set()
        self.dropout_seed = 0

    def comment(self, text):
        self.lines.append("  # " + text)

    def node(self, name, dtype, shape, op, operands=(), /, **attrs):
        assert name not in self.names, name
        self.names.add(name)
        args = [str(o) for o in operands] + [f"{k}={fmt_attr(v)}" for k, v in attrs.items()]
        ty = f"{dtype}[{','.join(str(int(d)) for d in shape)}]"
        self.lines.append(f"  %{name}: {ty} = {op}({', '.join(args)})")
        return Value(name, dtype, shape)

    # sources
    def input(self, name, shape, dtype=None, **init):
        return self.node(name, dtype or self.dtype, shape, "input", **init)

    def param(self, name, shape, **init):
        return self.node(name, self.dtype, shape, "param", **init)

    def scalar(self, name, value, dtype=None):
        return self.node(name, dtype or self.dtype, [], "scalar", value=value)

    # helpers that infer the output shape the way evt does
    def unary(self, name, op, x, **attrs):
        return self.node(name, x.dtype, x.shape, op, [x], **attrs)

    def binary(self, name, op, a, b, dtype=None):
        r = max(len(a.shape), len(b.shape))
        sa = [1] * (r - len(a.shape)) + a.shape
        sb = [1] * (r - len(b.shape)) + b.shape
        out = []
        for x, y in zip(sa, sb):
            assert x == y or x == 1 or y == 1, (name, a.shape, b.shape)
            out.append(y if x == 1 else x)
        return self.node(name, dtype or (a.dtype if a.shape or not b.shape else b.dtype), out, op, [a, b])

    def mm(self, name, a, b):
        assert a.shape[1] == b.shape[0], (name, a.shape, b.shape)
        return self.node(name, a.dtype, [a.shape[0], b.shape[1]], "mm", [a, b])

    def bmm(self, name, a, b):
        assert a.shape[:-2] == b.shape[:-2] and a.shape[-1] == b.shape[-2], (name, a.shape, b.shape)
        return self.node(name, a.dtype, a.shape[:-1] + [b.shape[-1]], "bmm", [a, b])

    def linear(self, prefix, x, n_out, std=None, bias=True):
        """x [M,K] @ w [K,N] + b [N]; parameters <prefix>.w and <prefix>.b."""
        k = x.shape[1]
        w = self.param(f"{prefix}.w", [k, n_out], init="normal", std=std if std else fan_in_std(k))
        y = self.mm(f"{prefix}.mm", x, w)
        if not bias:
            return y
        b = self.param(f"{prefix}.b", [n_out], init="zeros")
        return self.binary(f"{prefix}.out", "add", y, b)

    def reshape(self, name, x, shape):
        assert math.prod(shape) == math.prod(x.shape), (name, x.shape, shape)
        return self.node(name, x.dtype, shape, "reshape", [x], shape=shape)

    def permute(self, name, x, dims):
        return self.node(name, x.dtype, [x.shape[d] for d in dims], "permute", [x], dims=dims)

    def layer_norm(self, prefix, x, eps=None):
        d = x.shape[-1]
        w = self.param(f"{prefix}.w", [d], init="ones")
        b = self.param(f"{prefix}.b", [d], init="zeros")
        attrs = {} if eps is None else {"eps": eps}
        return self.node(f"{prefix}.out", x.dtype, x.shape, "layer_norm", [x, w, b], **attrs)

    def dropout(self, name, x, p):
        self.dropout_seed += 1
        return self.node(name, x.dtype, x.shape, "dropout", [x], p=p, seed=self.dropout_seed, offset=0)

    def conv2d(self, name, x, w, stride=(1, 1), padding=(0, 0)):
        n, c, h, wd = x.shape
        o, cg, kh, kw = w.shape
        assert cg == c, (name, x.shape, w.shape)
        ho = (h + 2 * padding[0] - kh) // stride[0] + 1
        wo = (wd + 2 * padding[1] - kw) // stride[1] + 1
        attrs = {}
        if list(stride) != [1, 1]:
            attrs["stride"] = list(stride)
        if list(padding) != [0, 0]:
            attrs["padding"] = list(padding)
        return self.node(name, x.dtype, [n, o, ho, wo], "conv2d", [x, w], **attrs)

    def channel_bias(self, prefix, x):
        """x [N,C,H,W] + b [C] (parameter <prefix>.b, viewed as [C,1,1])."""
        c = x.shape[1]
        b = self.param(f"{prefix}.b", [c], init="zeros")
        b3 = self.reshape(f"{prefix}.b3", b, [c, 1, 1])
        return self.binary(f"{prefix}.out", "add", x, b3)

    def cross_entropy(self, name, logits, target, **attrs):
        return self.node(name, logits.dtype, [], "cross_entropy", [logits, target], **attrs)

    def text(self):
        out = [f"# {line}".rstrip() for line in self.header.strip("\n").split("\n")]
        out.append(f"graph {self.name} {{")
        out += self.lines
        out.append("}")
        return "\n".join(out) + "\n"


# ---- the models ---------------------------------------------------------------------------------------

def attention_bmm(g, p, x2d, b, s, heads, cfg):
    """BERT self-attention with explicit bmm + softmax; x2d [B*S,H] -> [B*S,H] (before the output dense)."""
    h = x2d.shape[1]
    dh = h // heads

    def split_heads(name, t, dims):
        t4 = g.reshape(f"{p}.{name}.split", t, [b, s, heads, dh])
        return g.permute(f"{p}.{name}.heads", t4, dims)

    q = split_heads("q", g.linear(f"{p}.q", x2d, h, std=cfg["init_std"]), [0, 2, 1, 3])   # [B,nh,S,dh]
    kt = split_heads("k", g.linear(f"{p}.k", x2d, h, std=cfg["init_std"]), [0, 2, 3, 1])  # [B,nh,dh,S]
    v = split_heads("v", g.linear(f"{p}.v", x2d, h, std=cfg["init_std"]), [0, 2, 1, 3])   # [B,nh,S,dh]
    scores = g.bmm(f"{p}.scores", q, kt)
    scale = g.scalar(f"{p}.scale", 1.0 / math.sqrt(dh))
    scaled = g.binary(f"{p}.scaled", "mul", scores, scale)
    probs = g.unary(f"{p}.probs", "softmax", scaled, dim=-1)
    probs = g.dropout(f"{p}.probs.drop", probs, cfg["dropout"])
    ctx = g.bmm(f"{p}.ctx", probs, v)                                                       # [B,nh,S,dh]
    ctx = g.permute(f"{p}.ctx.merge", ctx, [0, 2, 1, 3])
    return g.reshape(f"{p}.ctx.flat", ctx, [b * s, h])


def attention_sdpa(g, p, x2d, b, s, heads, cfg):
    """The same self-attention as one sdpa node (no dropout on the probabilities: sdpa has none)."""
    h = x2d.shape[1]
    dh = h // heads

    def split_heads(name, t):
        t4 = g.reshape(f"{p}.{name}.split", t, [b, s, heads, dh])
        return g.permute(f"{p}.{name}.heads", t4, [0, 2, 1, 3])

    q = split_heads("q", g.linear(f"{p}.q", x2d, h, std=cfg["init_std"]))
    k = split_heads("k", g.linear(f"{p}.k", x2d, h, std=cfg["init_std"]))
    v = split_heads("v", g.linear(f"{p}.v", x2d, h, std=cfg["init_std"]))
    ctx = g.node(f"{p}.ctx", q.dtype, q.shape, "sdpa", [q, k, v], scale=1.0 / math.sqrt(dh))
    ctx = g.permute(f"{p}.ctx.merge", ctx, [0, 2, 1, 3])
    return g.reshape(f"{p}.ctx.flat", ctx, [b * s, h])


def gelu_attrs(cfg):
    """gelu's attributes for the knob --gelu: erf (exact, the default) or tanh (PyTorch's approximate="tanh")."""
    assert cfg["gelu"] in ("erf", "tanh"), "--gelu must be erf or tanh"
    return {"approximate": "tanh"} if cfg["gelu"] == "tanh" else {}


def mlp(cfg):
    B, H, F, L, C, p = cfg["batch"], cfg["hidden"], cfg["ffn"], cfg["layers"], cfg["classes"], cfg["dropout"]
    g = Builder("mlp", f"""
mlp: {L} residual feed-forward blocks (post-LN) and a linear classifier with a cross-entropy loss.
  block: y = layer_norm(x + dropout(gelu(x @ w1 + b1) @ w2 + b2))
  x [{B},{H}] ~ N(0,1), labels [{B}] in [0,{C}); the batch stays the same every step.
generated by examples/gen.py ({knobs_str('mlp', cfg)}); edit gen.py, not this file
""", cfg["dtype"])
    x = g.input("x", [B, H], init="normal", std=1.0)
    y = g.input("y", [B], dtype="i64", init="randint", lo=0, hi=C)
    for i in range(L):
        p_ = f"l{i}"
        h = g.unary(f"{p_}.act", "gelu", g.linear(f"{p_}.fc1", x, F), **gelu_attrs(cfg))
        h = g.dropout(f"{p_}.drop", g.linear(f"{p_}.fc2", h, H), p)
        x = g.layer_norm(f"{p_}.ln", g.binary(f"{p_}.res", "add", x, h))
    logits = g.linear("head", x, C)
    g.cross_entropy("loss", logits, y)
    g.lines.append("  loss %loss")
    return g.text()


def bert_mlm_loss(g, x2d, cfg):
    """Masked-LM-style loss: vocab projection of every token, cross_entropy over the selected ~mlm_prob of
    tokens. The label of an unselected token is set to -100 (ignore_index) inside the graph:
    labels = where(u < mlm_prob, tokens, -100), with u ~ U[0,1) an input."""
    n, V = x2d.shape[0], cfg["vocab"]
    tokens = g.input("tokens", [n], dtype="i64", init="randint", lo=0, hi=V)
    u = g.input("mlm.u", [n], init="uniform", lo=0.0, hi=1.0)
    prob = g.scalar("mlm.prob", cfg["mlm_prob"])
    sel = g.binary("mlm.sel", "lt", u, prob, dtype="bool")
    ignore = g.scalar("mlm.ignore", -100, dtype="i64")
    g.comment("labels: the token where selected, else -100 (ignored by cross_entropy)")
    labels = g.node("labels", "i64", [n], "where", [sel, tokens, ignore])
    logits = g.linear("mlm.decoder", x2d, V, std=cfg["init_std"])
    g.cross_entropy("loss", logits, labels, ignore_index=-100)
    g.lines.append("  loss %loss")


def bert_layer(cfg, sdpa=False):
    B, S, H, nh, F, p = cfg["batch"], cfg["seq"], cfg["hidden"], cfg["heads"], cfg["ffn"], cfg["dropout"]
    assert H % nh == 0, "hidden must be a multiple of heads"
    name = "bert_layer_sdpa" if sdpa else "bert_layer"
    att = "one sdpa node (no dropout on the attention probabilities)" if sdpa else \
        "bmm(q, k^T) * 1/sqrt(d), softmax, dropout, bmm(., v)"
    g = Builder(name, f"""
{name}: one post-LN BERT encoder layer and a masked-LM-style loss.
  attention: {att}; heads by reshape + permute
  x1 = layer_norm(x + dropout(attention(x) @ wo + bo));  x2 = layer_norm(x1 + dropout(gelu(x1 @ w1 + b1) @ w2 + b2))
  loss: cross_entropy(x2 @ w_vocab + b_vocab, labels, ignore_index=-100); labels = tokens where an input
  u ~ U[0,1) is below {cfg['mlm_prob']}, else -100.
  x [{B},{S},{H}] ~ N(0,1) (the hidden states entering the layer).
generated by examples/gen.py ({knobs_str(name, cfg)}); edit gen.py, not this file
""", cfg["dtype"])
    x = g.input("x", [B, S, H], init="normal", std=1.0)
    x2 = g.reshape("x.flat", x, [B * S, H])
    L = cfg["layers"]
    for i in range(L):  # one layer keeps the plain names; a stack prefixes them with l<i>.
        pre = f"l{i}." if L > 1 else ""
        x2d = x2
        ctx = (attention_sdpa if sdpa else attention_bmm)(g, pre + "attn", x2d, B, S, nh, cfg)
        a = g.dropout(pre + "attn.drop", g.linear(pre + "attn.out", ctx, H, std=cfg["init_std"]), p)
        x1 = g.layer_norm(pre + "ln1", g.binary(pre + "attn.res", "add", x2d, a), eps=cfg["eps"])
        h = g.unary(pre + "ffn.act", "gelu", g.linear(pre + "ffn.fc1", x1, F, std=cfg["init_std"]))
        h = g.dropout(pre + "ffn.drop", g.linear(pre + "ffn.fc2", h, H, std=cfg["init_std"]), p)
        x2 = g.layer_norm(pre + "ln2", g.binary(pre + "ffn.res", "add", x1, h), eps=cfg["eps"])
    bert_mlm_loss(g, x2, cfg)
    return g.text()


def vit(cfg):
    B, I, P, Cin, D = cfg["batch"], cfg["image"], cfg["patch"], cfg["channels"], cfg["hidden"]
    nh, F, L, C, p = cfg["heads"], cfg["ffn"], cfg["layers"], cfg["classes"], cfg["dropout"]
    assert I % P == 0 and D % nh == 0
    n = (I // P) ** 2
    T = n + 1
    g = Builder("vit", f"""
vit: a vision transformer. Patch embedding as conv2d (kernel = stride = {P}), tokens by reshape + permute,
  a class token (param expanded over the batch) concatenated in front, learned position embedding,
  {L} pre-LN blocks (x += dropout(sdpa-attention(layer_norm(x)) @ wo + bo); x += dropout(mlp(layer_norm(x)))),
  final layer_norm, linear head on the class token (slice), cross_entropy.
  images [{B},{Cin},{I},{I}] ~ N(0,1), labels in [0,{C}).
generated by examples/gen.py ({knobs_str('vit', cfg)}); edit gen.py, not this file
""", cfg["dtype"])
    img = g.input("image", [B, Cin, I, I], init="normal", std=1.0)
    y = g.input("y", [B], dtype="i64", init="randint", lo=0, hi=C)
    pw = g.param("patch.w", [D, Cin, P, P], init="normal", std=fan_in_std(Cin * P * P))
    e = g.channel_bias("patch", g.conv2d("patch.conv", img, pw, stride=(P, P)))      # [B,D,I/P,I/P]
    e = g.permute("patch.tokens", g.reshape("patch.flat", e, [B, D, n]), [0, 2, 1])   # [B,n,D]
    cls = g.param("cls", [1, 1, D], init="normal", std=0.02)
    cls_b = g.node("cls.expand", cls.dtype, [B, 1, D], "expand", [cls], shape=[B, 1, D])
    t = g.node("tokens", e.dtype, [B, T, D], "concat", [cls_b, e], dim=1)
    pos = g.param("pos", [1, T, D], init="normal", std=0.02)
    x = g.reshape("x0", g.binary("tokens.pos", "add", t, pos), [B * T, D])
    for i in range(L):
        q = f"b{i}"
        h = g.layer_norm(f"{q}.ln1", x, eps=cfg["eps"])
        ctx = attention_sdpa(g, f"{q}.attn", h, B, T, nh, cfg)
        a = g.dropout(f"{q}.attn.drop", g.linear(f"{q}.attn.out", ctx, D, std=cfg["init_std"]), p)
        x = g.binary(f"{q}.res1", "add", x, a)
        h = g.layer_norm(f"{q}.ln2", x, eps=cfg["eps"])
        h = g.unary(f"{q}.mlp.act", "gelu", g.linear(f"{q}.mlp.fc1", h, F, std=cfg["init_std"]))
        h = g.dropout(f"{q}.mlp.drop", g.linear(f"{q}.mlp.fc2", h, D, std=cfg["init_std"]), p)
        x = g.binary(f"{q}.res2", "add", x, h)
    x = g.layer_norm("ln_f", x, eps=cfg["eps"])
    x3 = g.reshape("ln_f.tokens", x, [B, T, D])
    c = g.node("cls.out", x3.dtype, [B, 1, D], "slice", [x3], dim=1, start=0, end=1)
    c = g.reshape("cls.flat", c, [B, D])
    logits = g.linear("head", c, C)
    g.cross_entropy("loss", logits, y)
    g.lines.append("  loss %loss")
    return g.text()


def xmlcnn(cfg):
    B, L, V, E, Fn, P = cfg["batch"], cfg["seq"], cfg["vocab"], cfg["emb"], cfg["filters"], cfg["pool"]
    H, NL, p = cfg["hidden"], cfg["labels"], cfg["dropout"]
    ks = [int(k) for k in cfg["kernels"].split(",")]
    assert all(L - k + 1 >= P for k in ks), "seq - kernel + 1 must be >= pool"
    g = Builder("xmlcnn", f"""
xmlcnn: XML-CNN for extreme multi-label text classification. Word embedding, 1-D convolutions over the
  sequence written as conv2d on [N,E,1,L] with kernels [1,k] for k in {{{','.join(map(str, ks))}}} ({Fn} filters each),
  relu, dynamic max pooling to {P} chunks (adaptive_max_pool2d to [1,{P}]), concat, bottleneck linear
  + relu + dropout, the label layer ({NL} labels) and bce_with_logits against multi-hot targets.
  targets = cast(u < {cfg['density']}) with an input u ~ U[0,1): about {cfg['density']:.0%} of labels on.
generated by examples/gen.py ({knobs_str('xmlcnn', cfg)}); edit gen.py, not this file
""", cfg["dtype"])
    tok = g.input("tokens", [B, L], dtype="i64", init="randint", lo=0, hi=V)
    u = g.input("targets.u", [B, NL], init="uniform", lo=0.0, hi=1.0)
    dens = g.scalar("targets.density", cfg["density"])
    on = g.binary("targets.on", "lt", u, dens, dtype="bool")
    target = g.node("targets", cfg["dtype"], [B, NL], "cast", [on], dtype=cfg["dtype"])
    emb = g.param("emb.w", [V, E], init="normal", std=cfg["emb_std"])
    e = g.node("emb", emb.dtype, [B, L, E], "embedding", [emb, tok])
    e = g.reshape("emb.img", g.permute("emb.chw", e, [0, 2, 1]), [B, E, 1, L])   # [B,E,1,L]
    pooled = []
    for k in ks:
        w = g.param(f"conv{k}.w", [Fn, E, 1, k], init="normal", std=fan_in_std(E * k))
        c = g.channel_bias(f"conv{k}", g.conv2d(f"conv{k}.conv", e, w))           # [B,F,1,L-k+1]
        c = g.unary(f"conv{k}.relu", "relu", c)
        c = g.node(f"conv{k}.pool", c.dtype, [B, Fn, 1, P], "adaptive_max_pool2d", [c], shape=[1, P])
        pooled.append(g.reshape(f"conv{k}.flat", c, [B, Fn * P]))
    z = g.node("features", pooled[0].dtype, [B, Fn * P * len(ks)], "concat", pooled, dim=1)
    h = g.dropout("fc.drop", g.unary("fc.relu", "relu", g.linear("fc", z, H)), p)
    logits = g.linear("out", h, NL)
    g.node("loss", logits.dtype, [], "bce_with_logits", [logits, target])
    g.lines.append("  loss %loss")
    return g.text()


def gcn(cfg):
    N, Fi, H, C, deg, p = cfg["nodes"], cfg["features"], cfg["hidden"], cfg["classes"], cfg["degree"], cfg["dropout"]
    nnz = N * deg
    g = Builder("gcn", f"""
gcn: a 2-layer graph convolutional network (Kipf & Welling) on a sparse adjacency in CSR form.
  h = dropout(relu(spmm(A, x @ w1) + b1)); logits = spmm(A, h @ w2) + b2; cross_entropy over all nodes.
  A: {N} nodes, {deg} nonzeros per row (rowptr[i] = {deg}*i), random columns, values ~ U[0,{2.0 / deg:g}).
generated by examples/gen.py ({knobs_str('gcn', cfg)}); edit gen.py, not this file
""", cfg["dtype"])
    x = g.input("x", [N, Fi], init="normal", std=1.0)
    y = g.input("y", [N], dtype="i64", init="randint", lo=0, hi=C)
    rowptr = g.input("adj.rowptr", [N + 1], dtype="i64", init="rowptr", lo=deg)
    col = g.input("adj.col", [nnz], dtype="i64", init="randint", lo=0, hi=N)
    val = g.input("adj.val", [nnz], init="uniform", lo=0.0, hi=2.0 / deg)
    adj = [rowptr, col, val]
    h = g.linear("l1", x, H, bias=False)
    h = g.node("l1.agg", h.dtype, [N, H], "spmm", adj + [h])
    b1 = g.param("l1.b", [H], init="zeros")
    h = g.dropout("l1.drop", g.unary("l1.relu", "relu", g.binary("l1.out", "add", h, b1)), p)
    h = g.linear("l2", h, C, bias=False)
    h = g.node("l2.agg", h.dtype, [N, C], "spmm", adj + [h])
    b2 = g.param("l2.b", [C], init="zeros")
    logits = g.binary("l2.out", "add", h, b2)
    g.cross_entropy("loss", logits, y)
    g.lines.append("  loss %loss")
    return g.text()


def resnet_block(cfg):
    B, C, I, K, L = cfg["batch"], cfg["channels"], cfg["image"], cfg["classes"], cfg["layers"]
    g = Builder("resnet_block", f"""
resnet_block: {L} ResNet basic block(s) and a classifier.
  block: y = relu(bn(conv3x3(relu(bn(conv3x3(x))))) + x)   (batch_norm in training mode, batch statistics)
  then max_pool2d 2x2 stride 2, global average pool (mean over [2,3]), linear head, cross_entropy.
  x [{B},{C},{I},{I}] ~ N(0,1), labels in [0,{K}).
generated by examples/gen.py ({knobs_str('resnet_block', cfg)}); edit gen.py, not this file
""", cfg["dtype"])
    x = g.input("x", [B, C, I, I], init="normal", std=1.0)
    y = g.input("y", [B], dtype="i64", init="randint", lo=0, hi=K)

    def conv_bn(prefix, t):
        w = g.param(f"{prefix}.w", [C, C, 3, 3], init="normal", std=fan_in_std(C * 9, math.sqrt(2.0)))
        c = g.conv2d(f"{prefix}.conv", t, w, padding=(1, 1))
        bw = g.param(f"{prefix}.bn.w", [C], init="ones")
        bb = g.param(f"{prefix}.bn.b", [C], init="zeros")
        return g.node(f"{prefix}.bn", c.dtype, c.shape, "batch_norm", [c, bw, bb])

    for i in range(L):
        q = f"b{i}"
        h = g.unary(f"{q}.relu1", "relu", conv_bn(f"{q}.c1", x))
        h = conv_bn(f"{q}.c2", h)
        x = g.unary(f"{q}.relu2", "relu", g.binary(f"{q}.res", "add", h, x))
    pooled_hw = (I - 2) // 2 + 1
    x = g.node("pool", x.dtype, [B, C, pooled_hw, pooled_hw], "max_pool2d", [x], kernel=[2, 2], stride=[2, 2])
    x = g.node("gap", x.dtype, [B, C], "mean", [x], dims=[2, 3])
    logits = g.linear("head", x, K)
    g.cross_entropy("loss", logits, y)
    g.lines.append("  loss %loss")
    return g.text()


# ---- knobs --------------------------------------------------------------------------------------------

COMMON = {"dtype": "f32", "dropout": 0.1}
DEFAULTS = {
    "mlp": dict(COMMON, batch=16, hidden=64, ffn=256, layers=2, classes=10, gelu="erf"),
    "bert_layer": dict(COMMON, batch=2, seq=16, hidden=64, heads=4, ffn=256, vocab=128, mlm_prob=0.15,
                       eps=1e-12, init_std=0.0, layers=1),
    "bert_layer_sdpa": dict(COMMON, batch=2, seq=16, hidden=64, heads=4, ffn=256, vocab=128, mlm_prob=0.15,
                            eps=1e-12, init_std=0.0, layers=1),
    "vit": dict(COMMON, batch=2, image=16, patch=4, channels=3, hidden=32, heads=4, ffn=64, layers=2, classes=10,
                eps=1e-6, init_std=0.0),
    "xmlcnn": dict(COMMON, batch=4, seq=32, vocab=200, emb=16, filters=8, kernels="2,4,8", pool=4, hidden=32,
                   labels=256, density=0.05, emb_std=0.5),
    "gcn": dict(COMMON, nodes=64, features=32, hidden=16, classes=8, degree=4),
    "resnet_block": dict(COMMON, batch=4, channels=8, image=8, classes=10, layers=1),
}
# The paper's configurations (notes/paper.md, evaluation table), one layer/block where the paper stacks
# many: `gen.py MODEL --paper [more knobs]`. Where the paper gives no number the value is ours: the XML-CNN
# vocabulary and pooling chunks, and the GCN degree (ogbn-mag: 5.4M citation edges over 736k papers).
PAPER = {
    "bert_layer": "--batch 32 --seq 512 --hidden 1024 --heads 16 --ffn 4096 --vocab 30522 --init-std 0.02",
    "bert_layer_sdpa": "--batch 32 --seq 512 --hidden 1024 --heads 16 --ffn 4096 --vocab 30522 --init-std 0.02",
    "vit": "--batch 128 --image 224 --patch 14 --hidden 768 --heads 12 --ffn 3072 --layers 12 --classes 1000",
    "xmlcnn": "--batch 1024 --seq 512 --emb 304 --filters 32 --hidden 512 --labels 670208 --vocab 100000 --pool 8",
    "gcn": "--nodes 736389 --features 128 --hidden 64 --classes 352 --degree 8",
    "resnet_block": "--batch 128 --channels 64 --image 56 --classes 1000",
}
BUILDERS = {
    "mlp": mlp,
    "bert_layer": bert_layer,
    "bert_layer_sdpa": lambda cfg: bert_layer(cfg, sdpa=True),
    "vit": vit,
    "xmlcnn": xmlcnn,
    "gcn": gcn,
    "resnet_block": resnet_block,
}
HELP = {
    "batch": "batch size", "seq": "sequence length (tokens)", "hidden": "hidden / model width",
    "heads": "attention heads", "ffn": "feed-forward inner width", "vocab": "vocabulary size",
    "layers": "number of blocks", "classes": "output classes", "image": "image height = width",
    "patch": "patch size (conv kernel and stride)", "channels": "image / feature-map channels",
    "emb": "word-embedding width", "filters": "filters per kernel size", "kernels": "kernel sizes, comma separated",
    "pool": "dynamic max-pooling chunks", "labels": "number of labels", "density": "fraction of labels on",
    "nodes": "graph nodes", "features": "input features per node", "degree": "nonzeros per adjacency row",
    "dropout": "dropout probability", "dtype": "floating dtype of every tensor (f32, f16, bf16)",
    "mlm_prob": "fraction of tokens in the masked-LM loss", "eps": "layer_norm epsilon",
    "init_std": "std of the linear-layer weights (0: 1/sqrt(fan_in))", "emb_std": "std of the embedding table",
    "gelu": "GELU form: erf (exact) or tanh (approximate=\"tanh\")",
}


def knobs_str(name, cfg):
    changed = [f"--{k.replace('_', '-')} {v}" for k, v in cfg.items() if DEFAULTS[name].get(k) != v]
    return f"{name} {' '.join(changed)}".strip()


def config(name, argv=()):
    """Default knobs of `name` updated from command-line style arguments (['--batch', '8', ...])."""
    ap = argparse.ArgumentParser(prog=f"gen.py {name}", description=f"write the {name} example as .evt text")
    for k, v in DEFAULTS[name].items():
        ap.add_argument(f"--{k.replace('_', '-')}", type=type(v), default=v, help=f"{HELP.get(k, k)} (default {v})")
    ap.add_argument("-o", "--output", help="write to this file instead of stdout")
    if name in PAPER:
        ap.add_argument("--paper", action="store_true", help=f"start from the paper's sizes: {PAPER[name]}")
    argv = list(argv)
    if "--paper" in argv:
        if name not in PAPER:
            ap.error(f"no paper configuration for {name}")
        argv = PAPER[name].split() + argv  # later knobs override the preset
    args = vars(ap.parse_args(argv))
    args.pop("paper", None)
    out = args.pop("output")
    if args["dtype"] not in ("f32", "f16", "bf16"):
        ap.error("--dtype must be f32, f16 or bf16")
    if not 0.0 <= args["dropout"] < 1.0:
        ap.error("--dropout must be in [0, 1)")
    return args, out


def build(name, cfg=None):
    """The .evt text of example `name` with knobs cfg (defaults if None)."""
    return BUILDERS[name](dict(DEFAULTS[name]) if cfg is None else cfg)


def main(argv):
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        print("\nmodels: " + " ".join(BUILDERS) + ", or all")
        return 0 if argv else 1
    name, rest = argv[0], argv[1:]
    if name == "all":
        ap = argparse.ArgumentParser(prog="gen.py all")
        ap.add_argument("--outdir", default=os.path.dirname(os.path.abspath(__file__)))
        outdir = ap.parse_args(rest).outdir
        for n in BUILDERS:
            path = os.path.join(outdir, n + ".evt")
            with open(path, "w") as f:
                f.write(build(n))
            print("wrote", path)
        return 0
    if name not in BUILDERS:
        print(f"gen.py: unknown model '{name}' (models: {' '.join(BUILDERS)}, all)", file=sys.stderr)
        return 1
    cfg, out = config(name, rest)
    try:
        text = BUILDERS[name](cfg)
    except AssertionError as e:
        print(f"gen.py {name}: inconsistent sizes: {e}", file=sys.stderr)
        return 1
    if out:
        with open(out, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
