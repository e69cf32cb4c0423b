"""evt: a torch.compile backend for training steps (CPU: the evt interpreter; CUDA: evt GPU programs).

    import evt                      # registers the backend name "evt"
    model = torch.compile(model, backend="evt")
    model = torch.compile(model, backend="evt", options={"cudagraphs": True})   # CUDA graph replay
    print(evt.explain(model, x, y))   # what runs in evt, what in PyTorch and why, kernels and bytes per step
    y = evt.sparse_mm(evt.csr_parts(adj_csr), x)   # torch.sparse.mm that reaches evt's spmm (sparse.py)

See docs/pytorch.md for the options (config.py checks them). Logging: EVT_LOG=1 (logger "evt"). Library: the
package's own (pip install <repo>/python), or $EVT_LIB. Disk caches: $EVT_CACHE_DIR (EVT_CACHE=0: off).
"""
from .backend import DECOMPOSITIONS, STATS, compile_module, evt_backend, partition_fn, reset_stats  # noqa: F401
from .explain import Report, explain, report_backend  # noqa: F401
from .lib import EvtError, Graph, LibraryError  # noqa: F401
from .sparse import csr_parts, sparse_mm  # noqa: F401

__all__ = ["evt_backend", "compile_module", "partition_fn", "DECOMPOSITIONS", "Graph", "EvtError", "LibraryError",
           "STATS", "reset_stats", "explain", "report_backend", "Report",
           "sparse_mm", "csr_parts"]


def _register():
    from torch._dynamo import list_backends, register_backend
    try:
        if "evt" not in list_backends(exclude_tags=()):
            register_backend(name="evt")(evt_backend)
    except Exception:  # already registered through the entry point
        pass


_register()
