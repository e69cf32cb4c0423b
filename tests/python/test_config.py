"""The environment variables evt reads are exactly those docs/config.md lists: in C only src/util/env.c calls
getenv, in Python only python/evt/config.py reads os.environ, and nothing in python/evt writes it."""
import os
import re
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _read(path):
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        return f.read()


def _tracked(*dirs):
    out = subprocess.check_output(["git", "ls-files", *dirs], cwd=ROOT, text=True)
    return [p for p in out.split() if os.path.isfile(os.path.join(ROOT, p))]


def documented():
    """The first column of the table under '## Environment variables' in docs/config.md."""
    text = _read("docs/config.md").split("## Environment variables", 1)[1]
    return set(re.findall(r"^\| `([A-Z_][A-Z0-9_]*)` \|", text, re.M))


def c_names():
    """The names src/util/env.c reads (its table of names)."""
    return set(re.findall(r'\] = "([A-Z_][A-Z0-9_]*)"', _read("src/util/env.c")))


def python_names():
    return set(re.findall(r'(?:environ\.get|environ\[|getenv)\(?\s*"([A-Z_][A-Z0-9_]*)"', _read("python/evt/config.py")))


def test_only_env_c_calls_getenv():
    callers = [p for p in _tracked("src", "kernels") if p.endswith((".c", ".h", ".cu", ".cuh"))
               and re.search(r"\bgetenv\s*\(", _read(p))]
    assert callers == ["src/util/env.c"]


def test_only_config_py_reads_the_environment():
    readers = [p for p in _tracked("python/evt") if p.endswith(".py") and re.search(r"os\.environ|getenv", _read(p))]
    assert readers == ["python/evt/config.py"]


def test_nothing_in_python_writes_the_environment():
    for p in _tracked("python/evt"):
        if p.endswith(".py"):
            text = _read(p)
            assert not re.search(r"os\.environ\s*\[[^\]]+\]\s*=|os\.environ\.(setdefault|update|pop)|putenv", text), p


def test_documented_variables_are_the_ones_read():
    c, py, doc = c_names(), python_names(), documented()
    assert c and py
    assert doc == c | py, f"documented only: {sorted(doc - (c | py))}; read only: {sorted((c | py) - doc)}"
    assert len(doc) <= 15


def test_torch_logs_turns_on_the_evt_logger():
    """TORCH_LOGS="+evt" (PyTorch's switch) gives the `evt` logger PyTorch's handler: a compile logs its plan."""
    code = ("import torch, evt\n"
            "m = torch.compile(torch.nn.Linear(4, 4), backend='evt')\n"
            "m(torch.randn(2, 4)).sum().backward()\n")
    env = dict(os.environ, TORCH_LOGS="+evt", PYTHONPATH=os.path.join(ROOT, "python"), EVT_CACHE="0")
    env.pop("EVT_LOG", None)
    r = subprocess.run(["python3", "-c", code], env=env, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-2000:]
    assert re.search(r"evt/backend\.py:\d+\].*forward: \d+ ops in 1 evt segment", r.stderr), r.stderr[-2000:]
