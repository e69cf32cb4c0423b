"""The end-to-end benchmark's workloads: PyTorch training steps at the EVT paper's sizes.

Configurations follow the project's anchor baselines (shared bench/torch_baselines.py, documented in
bench/e2e/README.md): post-LN BERT-large with an MLM head, ViT-B with 14x14 patches, XML-CNN with the
paper's label count, ResNet-50 (torchvision, channels-last), a 2-layer GCN on an ogbn-mag sized random
graph (CSR SpMM), and a residual GELU MLP stack.

make(name, device, dropout, scale) -> (model, args, amp): amp says whether the step runs under bf16
autocast (every workload but the GCN, which trains in fp32). dropout=None keeps each model's paper rate;
0.0 removes dropout (the benchmark's default, so that every mode's gradients can be compared with
eager's: PyTorch eager, Inductor and evt draw different random masks). scale < 1 shrinks batch-like
sizes (rows, tokens, nodes) for smoke tests, never the layer shapes.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F


def _drop(x, p):
    return F.dropout(x, p) if p > 0 else x


class EncoderLayer(nn.Module):
    """Post-LN transformer layer: fused QKV projection, SDPA, output projection, GELU FFN."""

    def __init__(self, dim, heads, ffn, p):
        super().__init__()
        self.heads, self.p = heads, p
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.up, self.down = nn.Linear(dim, ffn), nn.Linear(ffn, dim)

    def forward(self, x):
        b, t, d = x.shape
        qkv = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        att = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], dropout_p=self.p)
        att = att.transpose(1, 2).reshape(b, t, d)
        x = self.norm1(x + _drop(self.proj(att), self.p))
        return self.norm2(x + _drop(self.down(F.gelu(self.up(x))), self.p))


class BertMLM(nn.Module):
    """Token + learned position embeddings, LayerNorm, post-LN layers, MLM head (dense, GELU, LayerNorm,
    decoder over the vocabulary) and cross-entropy over every position, in fp32."""

    def __init__(self, layers=24, dim=1024, heads=16, ffn=4096, vocab=30522, max_len=512, p=0.1):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.randn(max_len, dim) * 0.02)
        self.norm = nn.LayerNorm(dim)
        self.layers = nn.ModuleList(EncoderLayer(dim, heads, ffn, p) for _ in range(layers))
        self.dense, self.head_norm = nn.Linear(dim, dim), nn.LayerNorm(dim)
        self.decoder = nn.Linear(dim, vocab)

    def forward(self, ids, labels):
        x = self.norm(self.tok(ids) + self.pos[: ids.shape[1]])
        for layer in self.layers:
            x = layer(x)
        logits = self.decoder(self.head_norm(F.gelu(self.dense(x))))
        return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())


class ViT(nn.Module):
    """Patch embedding (strided conv), class token, learned positions, post-LN layers, head on the class
    token."""

    def __init__(self, patch=16, image=224, layers=12, dim=768, heads=12, ffn=3072, classes=1000, p=0.0):
        super().__init__()
        n = (image // patch) ** 2 + 1
        self.embed = nn.Conv2d(3, dim, patch, patch)
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos = nn.Parameter(torch.randn(1, n, dim) * 0.02)
        self.layers = nn.ModuleList(EncoderLayer(dim, heads, ffn, p) for _ in range(layers))
        self.norm, self.head = nn.LayerNorm(dim), nn.Linear(dim, classes)

    def forward(self, img, labels):
        x = self.embed(img).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        for layer in self.layers:
            x = layer(x)
        return F.cross_entropy(self.head(self.norm(x[:, 0])).float(), labels)


class XMLCNN(nn.Module):
    """Liu et al. (SIGIR'17): embeddings, 1-d convolutions of several widths, dynamic max pooling to a
    fixed length, a bottleneck layer and one logit per label with a binary cross-entropy loss."""

    def __init__(self, vocab=135909, emb=304, widths=(2, 4, 8), channels=32, pool=32, hidden=512,
                 labels=670208, p=0.5):
        super().__init__()
        self.emb, self.pool, self.p = nn.Embedding(vocab, emb), pool, p
        self.convs = nn.ModuleList(nn.Conv1d(emb, channels, w) for w in widths)
        self.bottleneck = nn.Linear(len(widths) * channels * pool, hidden)
        self.out = nn.Linear(hidden, labels)

    def forward(self, ids, target):
        x = self.emb(ids).transpose(1, 2)
        feats = torch.cat([F.adaptive_max_pool1d(F.relu(c(x)), self.pool).flatten(1) for c in self.convs], 1)
        h = _drop(F.relu(self.bottleneck(feats)), self.p)
        return F.binary_cross_entropy_with_logits(self.out(h).float(), target)


class GCN(nn.Module):
    """Two graph convolutions (Kipf & Welling): A (X W1) -> ReLU -> dropout -> A (H W2), cross-entropy."""

    def __init__(self, fin=128, hidden=64, classes=352, p=0.5):
        super().__init__()
        self.l1, self.l2, self.p = nn.Linear(fin, hidden), nn.Linear(hidden, classes), p

    def forward(self, adj, x, y):
        h = _drop(F.relu(torch.sparse.mm(adj, self.l1(x))), self.p)
        return F.cross_entropy(torch.sparse.mm(adj, self.l2(h)).float(), y)


class GCNEdges(GCN):
    """The same GCN as message passing over an edge list, as torch_geometric computes it: gather x[src], scale by
    the edge weight, scatter-add into dst. Dynamo traces this form (it does not trace torch.sparse.mm on CSR)."""

    @staticmethod
    def prop(h, src, dst, w):
        return torch.zeros_like(h).index_add_(0, dst, h[src] * w[:, None])

    def forward(self, src, dst, w, x, y):
        h = _drop(F.relu(self.prop(self.l1(x), src, dst, w)), self.p)
        return F.cross_entropy(self.prop(self.l2(h), src, dst, w).float(), y)


class MLP(nn.Module):
    """A residual stack of [Linear -> GELU -> Linear, dropout, residual add, LayerNorm], then a classifier."""

    def __init__(self, layers=4, dim=4096, ffn=16384, classes=1000, p=0.1):
        super().__init__()
        self.p = p
        self.blocks = nn.ModuleList(
            nn.ModuleDict(dict(up=nn.Linear(dim, ffn), down=nn.Linear(ffn, dim), norm=nn.LayerNorm(dim)))
            for _ in range(layers))
        self.head = nn.Linear(dim, classes)

    def forward(self, x, y):
        for b in self.blocks:
            x = b["norm"](x + _drop(b["down"](F.gelu(b["up"](x))), self.p))
        return F.cross_entropy(self.head(x).float(), y)


class Classify(nn.Module):
    def __init__(self, net):
        super().__init__()
        self.net = net

    def forward(self, img, labels):
        return F.cross_entropy(self.net(img).float(), labels)


def _random_csr(n, deg, device, gen):
    idx = torch.randint(0, n, (2, n * deg), device=device, generator=gen)
    vals = torch.full((n * deg,), 1.0 / deg, device=device)
    return torch.sparse_coo_tensor(idx, vals, (n, n)).coalesce().to_sparse_csr()


def _random_edges(n, deg, device, gen):
    """(src, dst, w) of the same random graph as _random_csr: n * deg edges, weight 1/deg (duplicates kept)."""
    src, dst = torch.randint(0, n, (2, n * deg), device=device, generator=gen)
    return src, dst, torch.full((n * deg,), 1.0 / deg, device=device)


WORKLOADS = ("bert_large", "vit_p14", "xmlcnn_paper", "resnet50", "gcn_mag", "gcn_mag_edges", "mlp")


def make(name, device="cuda", dropout=0.0, scale=1.0):
    """(model on device, args, amp) for a workload; inputs from a fixed generator. The parameters are
    created on the device (their initialization draws from the device's generator: seed it first)."""
    with torch.device(device):
        return _make(name, device, dropout, scale)


def _make(name, device, dropout, scale):
    g = torch.Generator(device=device).manual_seed(0)
    rows = lambda n: max(1, int(n * scale))  # noqa: E731

    def p(default):
        return default if dropout is None else dropout

    def ints(hi, shape):
        return torch.randint(0, hi, shape, device=device, generator=g)

    if name == "bert_large":
        m, b, s = BertMLM(p=p(0.1)), rows(32), 512
        ids = ints(30522, (b, s))
        return m.to(device), (ids, ids.clone()), True
    if name == "vit_p14":
        m, b = ViT(patch=14, p=p(0.0)), rows(128)
        img = torch.randn(b, 3, 224, 224, device=device, generator=g)
        return m.to(device), (img, ints(1000, (b,))), True
    if name == "xmlcnn_paper":
        m, b = XMLCNN(p=p(0.5)), rows(1024)
        target = (torch.rand(b, 670208, device=device, generator=g) < 5e-6).float()
        return m.to(device), (ints(135909, (b, 512)), target), True
    if name == "resnet50":
        import torchvision
        m, b = Classify(torchvision.models.resnet50()), rows(128)
        m = m.to(device).to(memory_format=torch.channels_last)
        img = torch.randn(b, 3, 224, 224, device=device, generator=g).to(memory_format=torch.channels_last)
        return m, (img, ints(1000, (b,))), True
    if name == "gcn_mag":
        n = rows(736389)
        adj = _random_csr(n, 7, device, g)
        x = torch.randn(n, 128, device=device, generator=g)
        return GCN(p=p(0.5)).to(device), (adj, x, ints(349, (n,))), False
    if name == "gcn_mag_edges":
        n = rows(736389)
        src, dst, w = _random_edges(n, 7, device, g)
        x = torch.randn(n, 128, device=device, generator=g)
        return GCNEdges(p=p(0.5)).to(device), (src, dst, w, x, ints(349, (n,))), False
    if name == "mlp":
        m, t = MLP(p=p(0.1)), rows(8192)
        x = torch.randn(t, 4096, device=device, generator=g)
        return m.to(device), (x, ints(1000, (t,))), True
    raise KeyError(name)
