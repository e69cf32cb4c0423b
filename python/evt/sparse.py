"""Sparse-dense products that reach evt's `spmm` from a compiled model.

Dynamo does not trace a sparse CSR tensor (torch 2.11: "Attempted to wrap sparse Tensor"); without fullgraph=True
it runs the whole frame eagerly, so a `torch.sparse.mm(adj, x)` inside a compiled model never reaches any backend.
The CSR matrix enters instead as its three dense tensors (crow, col, values: csr_parts), which dynamo traces, and
sparse_mm multiplies through the custom op evt::spmm_csr, which aten.py translates to evt's `spmm` and whose
backward is evt::spmm_csr_t (A^T dy, evt's `spmm_t`) and, where the values need a gradient,
evt::spmm_csr_values_grad (run in PyTorch: evt's spmm has no gradient for its values).

    adj = evt.csr_parts(adj_csr)          # outside the compiled model (a tuple of dense tensors)
    out = evt.sparse_mm(adj, x)           # inside it: adj @ x, as torch.sparse.mm(adj_csr, x)
"""
import torch


def csr_parts(adj):
    """(crow_indices, col_indices, values) of a 2-d sparse CSR tensor: dense tensors dynamo can trace. They are
    copies: the accessors return views whose base is the sparse tensor, which dynamo would wrap (and refuse)."""
    if adj.layout != torch.sparse_csr or adj.dim() != 2:
        raise ValueError(f"csr_parts takes a 2-d sparse CSR tensor, not {adj.layout} of {adj.dim()} dims")
    return adj.crow_indices().clone(), adj.col_indices().clone(), adj.values().clone()


def sparse_mm(adj, x):
    """adj @ x for adj a sparse CSR matrix given as csr_parts(adj) (or as the CSR tensor itself, outside a
    compiled region only); differentiable with respect to x and the values."""
    crow, col, values = csr_parts(adj) if isinstance(adj, torch.Tensor) else adj
    return torch.ops.evt.spmm_csr(crow, col, values, x)


def _rows(crow, nnz):
    """The row of each stored element of a CSR matrix."""
    return torch.repeat_interleave(torch.arange(crow.numel() - 1, device=crow.device), crow.diff(),
                                   output_size=nnz)


@torch.library.custom_op("evt::spmm_csr", mutates_args=())
def spmm_csr(crow: torch.Tensor, col: torch.Tensor, values: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    adj = torch.sparse_csr_tensor(crow, col, values, (crow.numel() - 1, x.shape[0]))
    return torch.sparse.mm(adj, x)


@spmm_csr.register_fake
def _(crow, col, values, x):
    return x.new_empty((crow.shape[0] - 1, x.shape[1]))


@torch.library.custom_op("evt::spmm_csr_t", mutates_args=())
def spmm_csr_t(crow: torch.Tensor, col: torch.Tensor, values: torch.Tensor, dy: torch.Tensor,
               k: int) -> torch.Tensor:
    """A^T dy: the gradient of spmm_csr with respect to x (x has k rows)."""
    msg = values.unsqueeze(1) * dy.index_select(0, _rows(crow, col.numel()))
    return dy.new_zeros((k, dy.shape[1])).index_add_(0, col, msg)


@spmm_csr_t.register_fake
def _(crow, col, values, dy, k):
    return dy.new_empty((k, dy.shape[1]))


@torch.library.custom_op("evt::spmm_csr_values_grad", mutates_args=())
def spmm_csr_values_grad(crow: torch.Tensor, col: torch.Tensor, x: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    """The gradient of spmm_csr with respect to the values: element (i, j) gets dy[i] . x[j]."""
    return (dy.index_select(0, _rows(crow, col.numel())) * x.index_select(0, col)).sum(1)


@spmm_csr_values_grad.register_fake
def _(crow, col, x, dy):
    return x.new_empty(col.shape)


def _setup_context(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _backward(ctx, dy):
    crow, col, values, x = ctx.saved_tensors
    dvalues = spmm_csr_values_grad(crow, col, x, dy) if ctx.needs_input_grad[2] else None
    dx = spmm_csr_t(crow, col, values, dy, x.shape[0]) if ctx.needs_input_grad[3] else None
    return None, None, dvalues, dx


spmm_csr.register_autograd(_backward, setup_context=_setup_context)
