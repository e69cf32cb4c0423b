"""The models people train, built from configs with random weights (nothing is downloaded): Hugging Face
transformers (BERT masked LM, GPT-2, LLaMA with and without grouped-query attention, ViT), timm (a ViT and a
ResNet), torchvision's ResNet-50 and a torch_geometric GCN.

make(name, size) -> Workload: `model` is an nn.Module whose forward(*inputs) returns the training loss (the
loss inside the compiled region, as evt needs it), `inputs(device)` makes one batch (a fresh random batch each
call, from the global generator). size "ci" is the CPU test size (2 layers, hidden 32, sequence 8, batch 2:
tests/python/test_model_zoo.py), "bench" a realistic training size for one H200 (bench/e2e/zoo_bench.py).
The libraries are imported when a model of theirs is made; they are pinned in requirements-models.txt.
"""
import dataclasses

import torch
import torch.nn as nn
import torch.nn.functional as F

NAMES = ["hf_bert", "hf_gpt2", "hf_llama", "hf_llama_gqa", "hf_vit", "timm_vit", "timm_resnet",
         "tv_resnet50", "pyg_gcn"]


@dataclasses.dataclass
class Workload:
    model: nn.Module
    inputs: object          # inputs(device) -> tuple of tensors
    amp: bool = True        # the GPU benchmark runs it under bf16 autocast (the GCN trains in fp32)


# ---- sizes ----------------------------------------------------------------------------------------------

# Transformer sizes: "ci" is tiny; "bench" is each family's usual base size.
_TEXT = {
    "ci": dict(layers=2, hidden=32, heads=4, kv_heads=2, ffn=64, vocab=64, seq=8, batch=2),
    "bench_bert": dict(layers=12, hidden=768, heads=12, ffn=3072, vocab=30522, seq=512, batch=32),
    "bench_gpt2": dict(layers=12, hidden=768, heads=12, ffn=3072, vocab=50257, seq=1024, batch=16),
    "bench_llama": dict(layers=16, hidden=2048, heads=32, kv_heads=8, ffn=5632, vocab=32000, seq=1024, batch=8),
}
_IMAGE = {
    "ci": dict(image=16, patch=4, layers=2, hidden=32, heads=2, ffn=64, classes=5, batch=2),
    "bench": dict(image=224, patch=16, layers=12, hidden=768, heads=12, ffn=3072, classes=1000, batch=128),
}


def _text(size, family):
    return _TEXT["ci"] if size == "ci" else _TEXT[f"bench_{family}"]


class LossOf(nn.Module):
    """A Hugging Face model whose forward(input, labels) returns the model's own loss (input passed as `key`)."""

    def __init__(self, model, key):
        super().__init__()
        self.model, self.key = model, key

    def forward(self, x, labels):
        return self.model(**{self.key: x, "labels": labels}).loss


class CrossEntropyOf(nn.Module):
    """A classifier whose forward(*inputs, labels) returns the cross-entropy of its logits."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, *args):
        *inputs, labels = args
        return F.cross_entropy(self.model(*inputs).float(), labels)


def _tokens(c, device):
    return torch.randint(0, c["vocab"], (c["batch"], c["seq"]), device=device)


# ---- Hugging Face transformers ---------------------------------------------------------------------------

def hf_bert(size):
    import transformers as T
    c = _text(size, "bert")
    cfg = T.BertConfig(vocab_size=c["vocab"], hidden_size=c["hidden"], num_hidden_layers=c["layers"],
                       num_attention_heads=c["heads"], intermediate_size=c["ffn"], max_position_embeddings=c["seq"],
                       hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = LossOf(T.BertForMaskedLM(cfg), "input_ids")

    def inputs(device):
        ids = _tokens(c, device)
        # masked LM: the loss reads about 15% of the positions (the others are ignore_index -100)
        labels = torch.where(torch.rand(ids.shape, device=device) < 0.15, ids, torch.full_like(ids, -100))
        labels[:, 0] = ids[:, 0]  # (at least one position per row: no empty loss)
        return ids, labels
    return Workload(model, inputs)


def hf_gpt2(size):
    import transformers as T
    c = _text(size, "gpt2")
    cfg = T.GPT2Config(vocab_size=c["vocab"], n_embd=c["hidden"], n_layer=c["layers"], n_head=c["heads"],
                       n_inner=c["ffn"], n_positions=c["seq"], resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                       bos_token_id=0, eos_token_id=0)
    lm = T.GPT2LMHeadModel(cfg)
    # GPT2LMHeadModel's name names no loss, so Transformers logs a warning inside forward, where Dynamo breaks the
    # graph (the loss then compiles apart from its head). Naming the loss keeps one graph, for every mode.
    lm.loss_type = "ForCausalLM"
    model = LossOf(lm, "input_ids")
    return Workload(model, lambda device: (lambda ids: (ids, ids))(_tokens(c, device)))


def _llama(size, gqa):
    import transformers as T
    c = _text(size, "llama")
    cfg = T.LlamaConfig(vocab_size=c["vocab"], hidden_size=c["hidden"], intermediate_size=c["ffn"],
                        num_hidden_layers=c["layers"], num_attention_heads=c["heads"],
                        num_key_value_heads=c["kv_heads"] if gqa else c["heads"], max_position_embeddings=c["seq"],
                        bos_token_id=0, eos_token_id=0)
    model = LossOf(T.LlamaForCausalLM(cfg), "input_ids")
    return Workload(model, lambda device: (lambda ids: (ids, ids))(_tokens(c, device)))


def hf_llama(size):
    return _llama(size, gqa=False)


def hf_llama_gqa(size):
    """LLaMA with grouped-query attention: num_key_value_heads < num_attention_heads."""
    return _llama(size, gqa=True)


def hf_vit(size):
    import transformers as T
    c = _IMAGE[size]
    cfg = T.ViTConfig(image_size=c["image"], patch_size=c["patch"], hidden_size=c["hidden"],
                      num_hidden_layers=c["layers"], num_attention_heads=c["heads"], intermediate_size=c["ffn"],
                      num_labels=c["classes"], hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = LossOf(T.ViTForImageClassification(cfg), "pixel_values")
    return Workload(model, lambda device: _images(c, device))


def _images(c, device):
    return (torch.randn(c["batch"], 3, c["image"], c["image"], device=device),
            torch.randint(0, c["classes"], (c["batch"],), device=device))


# ---- timm, torchvision -------------------------------------------------------------------------------------

def timm_vit(size):
    import timm
    c = _IMAGE[size]
    if size == "ci":
        net = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=c["image"], patch_size=c["patch"],
                                embed_dim=c["hidden"], depth=c["layers"], num_heads=c["heads"],
                                num_classes=c["classes"])
    else:
        net = timm.create_model("vit_base_patch16_224", pretrained=False, num_classes=c["classes"])
    return Workload(CrossEntropyOf(net), lambda device: _images(c, device))


def timm_resnet(size):
    """timm's ResNet-18 (BatchNorm in training mode). The CI size's 64 x 64 images leave its last stage 2 x 2,
    so every batch-norm channel averages at least 8 values."""
    import timm
    c = dict(image=64, classes=5, batch=2) if size == "ci" else dict(image=224, classes=1000, batch=128)
    net = timm.create_model("resnet18", pretrained=False, num_classes=c["classes"])
    return Workload(CrossEntropyOf(net), lambda device: _images(c, device))


def tv_resnet50(size):
    import torchvision
    c = dict(image=64, classes=10, batch=2) if size == "ci" else dict(image=224, classes=1000, batch=128)
    net = torchvision.models.resnet50(weights=None, num_classes=c["classes"])
    return Workload(CrossEntropyOf(net), lambda device: _images(c, device))


# ---- torch_geometric ---------------------------------------------------------------------------------------

class GCN(nn.Module):
    """Two GCNConv layers (symmetric normalization with self loops) and ReLU: node classification."""

    def __init__(self, features, hidden, classes):
        super().__init__()
        from torch_geometric.nn import GCNConv
        self.conv1, self.conv2 = GCNConv(features, hidden), GCNConv(hidden, classes)

    def forward(self, x, edge_index):
        return self.conv2(F.relu(self.conv1(x, edge_index)), edge_index)


def pyg_gcn(size):
    c = (dict(nodes=10, edges=30, features=8, hidden=16, classes=5) if size == "ci" else
         dict(nodes=100_000, edges=1_000_000, features=128, hidden=64, classes=16))
    net = GCN(c["features"], c["hidden"], c["classes"])

    def inputs(device):
        return (torch.randn(c["nodes"], c["features"], device=device),
                torch.randint(0, c["nodes"], (2, c["edges"]), device=device),
                torch.randint(0, c["classes"], (c["nodes"],), device=device))
    return Workload(CrossEntropyOf(net), inputs, amp=False)


def make(name, size="ci"):
    """The Workload `name` (one of NAMES) at `size` ("ci" or "bench"), its weights from the global generator."""
    if name not in NAMES:
        raise ValueError(f"unknown model {name!r}; one of {', '.join(NAMES)}")
    return globals()[name](size)
