"""The package as a user installs it: `pip install <repo>/python` into a fresh virtual environment builds libevt
into the package, and a training step compiled with backend="evt" then runs evt's segments from a folder outside
the repository with no environment variables. A libevt that cannot be loaded is an error at the first call that
says how to fix it, not a silent run of the whole model in PyTorch."""
import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

STEP = textwrap.dedent("""
    import torch, evt
    from evt import lib as L
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
    step = torch.compile(lambda x, y: torch.nn.functional.cross_entropy(m(x), y), backend="evt")
    loss = step(x, y)
    loss.backward()
    g = [p.grad.clone() for p in m.parameters()]
    m.zero_grad()
    ref = torch.nn.functional.cross_entropy(m(x), y)
    ref.backward()
    assert torch.allclose(loss, ref, rtol=1e-5), (loss, ref)
    assert all(torch.allclose(a, p.grad, rtol=1e-4, atol=1e-6) for a, p in zip(g, m.parameters()))
    print("LIB", L.library_path())
    print("RUNS", evt.STATS["interp_segment_runs"])
""")


def _clean_env():
    return {k: v for k, v in os.environ.items() if not k.startswith("EVT_") and k != "PYTHONPATH"}


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    d = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(d)], check=True)
    pip = subprocess.run([str(d / "bin" / "pip"), "install", "-q", os.path.join(ROOT, "python")], env=_clean_env(),
                         capture_output=True, text=True)
    assert pip.returncode == 0, pip.stdout + pip.stderr
    return d


def test_installed_package_trains_with_evt_outside_the_repository(venv, tmp_path):
    r = subprocess.run([str(venv / "bin" / "python"), "-c", STEP], cwd=tmp_path, env=_clean_env(),
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    lib = [line.split(" ", 1)[1] for line in r.stdout.splitlines() if line.startswith("LIB ")][0]
    runs = [int(line.split()[1]) for line in r.stdout.splitlines() if line.startswith("RUNS ")][0]
    assert lib.startswith(str(venv)) and runs >= 2, r.stdout


def test_a_library_that_does_not_load_is_an_error_at_the_first_call(venv, tmp_path):
    env = dict(_clean_env(), EVT_LIB=str(tmp_path / "missing" / "libevt.so"))
    r = subprocess.run([str(venv / "bin" / "python"), "-c", STEP], cwd=tmp_path, env=env, capture_output=True,
                       text=True)
    assert r.returncode != 0 and "LibraryError" in r.stderr and "does not load" in r.stderr, r.stderr[-2000:]
