"""A GCN as users write it in PyTorch reaches evt's sparse aggregation (docs/pytorch.md "Sparse products"):
message passing over an edge list (gather by the source, scatter-add into the destination: index_add_,
scatter_add_ with the index expanded over the features, gather, as torch_geometric emits), and a CSR adjacency
through evt.sparse_mm (evt::spmm_csr -> evt's spmm, its backward spmm_t).

Each test trains SGD steps with backend="evt" next to eager PyTorch from the same weights: the loss and every
gradient at fp32 rel 1e-5 (NaN never passes), and checks that the aggregation ran in evt: the interpreter's
segments hold the evt op, they ran (evt.STATS), and no op was left to PyTorch except the ones named.
"""
import copy
import os
import sys

import pytest

torch = pytest.importorskip("torch")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "python"))
import evt  # noqa: E402
from evt import backend as evt_backend  # noqa: E402
from evt import lib as evt_lib  # noqa: E402

pytestmark = pytest.mark.skipif(not evt_lib.has_interpreter(), reason="libevt has no CPU interpreter yet")

torch.set_num_threads(1)
os.environ.setdefault("EVT_CACHE", "0")

TOL = 1e-5
NODES, EDGES, FEATURES, HIDDEN, CLASSES = 12, 40, 8, 16, 4


def _rel(a, b):
    assert bool(torch.isfinite(a).all()) and bool(torch.isfinite(b).all()), "not finite"
    return ((a.double() - b.double()).abs().max() / max(b.abs().max().item(), 1e-12)).item()


def _graph():
    g = torch.Generator().manual_seed(1)
    edge_index = torch.randint(0, NODES, (2, EDGES), generator=g)
    weight = torch.rand(EDGES, generator=g) + 0.1
    return edge_index, weight


class EdgeListGCN(torch.nn.Module):
    """Two graph convolutions over an edge list: h[src] * w, summed into dst by `aggregate` (one of AGGREGATES)."""

    def __init__(self, aggregate):
        super().__init__()
        self.l1, self.l2 = torch.nn.Linear(FEATURES, HIDDEN), torch.nn.Linear(HIDDEN, CLASSES)
        self.aggregate = aggregate

    def conv(self, lin, x, edge_index, weight):
        h = lin(x)
        msg = h[edge_index[0]] * weight.unsqueeze(1)
        return AGGREGATES[self.aggregate](h, msg, edge_index[1])

    def forward(self, x, edge_index, weight, y):
        h = torch.relu(self.conv(self.l1, x, edge_index, weight))
        return torch.nn.functional.cross_entropy(self.conv(self.l2, h, edge_index, weight), y)


def _index_add(h, msg, dst):
    return torch.zeros_like(h).index_add_(0, dst, msg)


def _scatter_add(h, msg, dst):  # torch_geometric's form: the index broadcast over the features
    return torch.zeros_like(h).scatter_add_(0, dst.view(-1, 1).expand_as(msg), msg)


def _gather_scatter(h, msg, dst):  # a gather by the destination too (messages that read the target node)
    idx = dst.view(-1, 1).expand_as(msg)
    return torch.zeros_like(h).scatter_add_(0, idx, msg * torch.sigmoid(h.gather(0, idx)))


AGGREGATES = {"index_add": _index_add, "scatter_add": _scatter_add, "gather_scatter": _gather_scatter}


class CsrGCN(torch.nn.Module):
    """Two graph convolutions over a CSR adjacency; sparse_mm(adj, h) is evt.sparse_mm or torch.sparse.mm."""

    def __init__(self, sparse_mm):
        super().__init__()
        self.l1, self.l2 = torch.nn.Linear(FEATURES, HIDDEN), torch.nn.Linear(HIDDEN, CLASSES)
        self.sparse_mm = sparse_mm

    def forward(self, x, adj, y):
        h = torch.relu(self.sparse_mm(adj, self.l1(x)))
        return torch.nn.functional.cross_entropy(self.sparse_mm(adj, self.l2(h)), y)


def _csr_adjacency():
    edge_index, weight = _graph()
    return torch.sparse_coo_tensor(edge_index.flip(0), weight, (NODES, NODES)).coalesce().to_sparse_csr()


def _compile_collecting(model):
    """model compiled with evt's backend, and the list its modules' plans are appended to."""
    plans = []
    torch._dynamo.reset()
    backend = evt_backend.make_backend(on_compiled=lambda kind, run: plans.append(getattr(run, "plan", None)))
    return torch.compile(model, backend=backend), plans


def _train_against_eager(ref, run_ref, run_evt, steps=3):
    """SGD steps of ref (eager, run_ref(model)) and a copy compiled with evt (run_evt(compiled)), loss and every
    gradient compared; returns the evt model's plans."""
    mod = copy.deepcopy(ref)
    compiled, plans = _compile_collecting(mod)
    opt_ref, opt = (torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (ref, mod))
    evt.reset_stats()
    for step in range(steps):
        opt_ref.zero_grad()
        opt.zero_grad()
        loss_ref, loss = run_ref(ref), run_evt(compiled)
        loss_ref.backward()
        loss.backward()
        assert _rel(loss.detach(), loss_ref.detach()) <= TOL, step
        for (name, p_ref), p in zip(ref.named_parameters(), mod.parameters()):
            assert _rel(p.grad, p_ref.grad) <= TOL, (step, name, _rel(p.grad, p_ref.grad))
        opt_ref.step()
        opt.step()
    assert evt.STATS["interp_segment_runs"] > 0, "no evt segment ran"
    return [p for p in plans if p is not None]


def _evt_ops(plans):
    """The evt statements of every interpreter segment, as 'op(' strings joined into one text."""
    return "\n".join(s.text for p in plans for s in p.steps if getattr(s, "path", None) == "interp")


def _fallbacks(plans):
    return {evt_backend.P.op_name(n) for p in plans for n, _ in p.fallbacks}


def _inputs():
    g = torch.Generator().manual_seed(2)
    return torch.randn(NODES, FEATURES, generator=g), torch.randint(0, CLASSES, (NODES,), generator=g)


@pytest.mark.parametrize("aggregate", sorted(AGGREGATES))
def test_edge_list_gcn_aggregates_in_evt(aggregate):
    torch.manual_seed(0)
    x, y = _inputs()
    edge_index, weight = _graph()
    args = (x, edge_index, weight, y)
    plans = _train_against_eager(EdgeListGCN(aggregate), lambda m: m(*args), lambda m: m(*args))
    assert not _fallbacks(plans), _fallbacks(plans)
    text = _evt_ops(plans)
    assert "index_select_backward(" in text and "index_select(" in text


def test_csr_sparse_mm_runs_evt_spmm():
    torch.manual_seed(0)
    x, y = _inputs()
    adj = _csr_adjacency()
    parts = evt.csr_parts(adj)
    # torch.sparse.mm on the CSR tensor: dynamo does not trace the frame (it runs eagerly, no module reaches evt)
    with pytest.raises(AssertionError, match="no evt segment ran"):
        _train_against_eager(CsrGCN(torch.sparse.mm), lambda m: m(x, adj, y), lambda m: m(x, adj, y), steps=1)
    plans = _train_against_eager(CsrGCN(evt.sparse_mm), lambda m: m(x, adj, y), lambda m: m(x, parts, y))
    assert not _fallbacks(plans), _fallbacks(plans)
    text = _evt_ops(plans)
    assert " spmm(" in text and " spmm_t(" in text, text


def test_csr_sparse_mm_values_gradient():
    """Values that need a gradient: evt::spmm_csr_values_grad runs in PyTorch (evt's spmm has no gradient for
    them), the products in evt; the values' gradient matches eager torch.sparse.mm on a dense adjacency."""
    x, _ = _inputs()
    crow, col, values = evt.csr_parts(_csr_adjacency())
    dense = _csr_adjacency().to_dense()
    v_ref, v = values.clone().requires_grad_(), values.clone().requires_grad_()
    x_ref, x_evt = x.clone().requires_grad_(), x.clone().requires_grad_()
    nz = dense != 0

    def eager(vals, xx):
        a = torch.zeros(NODES, NODES).masked_scatter(nz, vals)
        return (a @ xx).pow(2).sum()
    compiled, plans = _compile_collecting(lambda vals, xx: evt.sparse_mm((crow, col, vals), xx).pow(2).sum())
    loss_ref, loss = eager(v_ref, x_ref), compiled(v, x_evt)
    loss_ref.backward()
    loss.backward()
    assert _rel(loss.detach(), loss_ref.detach()) <= TOL
    assert _rel(x_evt.grad, x_ref.grad) <= TOL
    assert _rel(v.grad, v_ref.grad) <= TOL
    assert _fallbacks([p for p in plans if p is not None]) == {"spmm_csr_values_grad.default"}
