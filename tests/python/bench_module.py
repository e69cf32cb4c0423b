"""load(path): a benchmark script of the repository (bench/...) imported as a module by its file path (the bench
folders are no packages, and tests/python has a models.py of its own)."""
import importlib.util
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load(relpath, name=None):
    """The module of ROOT/relpath (e.g. "bench/e2e/budget.py"), executed once per call."""
    name = name or os.path.splitext(os.path.basename(relpath))[0]
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, relpath))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
