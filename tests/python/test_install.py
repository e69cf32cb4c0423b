"""The package as a user installs it: `pip wheel <repo>/python` builds libevt into the package, and the wheel,
installed into a fresh virtual environment, runs a training step compiled with backend="evt" from a folder outside
the repository with no environment variables. A libevt that cannot be loaded is an error at the first call that
says how to fix it, not a silent run of the whole model in PyTorch. The wheel is for any Python 3 (py3-none) and
carries every library libevt needs beyond glibc and the GCC runtime (evt/libs/), so it loads on machines without
CBC or OpenBLAS and under other Python versions (checked with pyenv's, where there are)."""
import glob
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


# What libevt may take from the system (setup.py's SYSTEM_LIBS): glibc's libraries and the GCC runtime
SYSTEM = {"linux-vdso.so.1", "ld-linux-x86-64.so.2", "libc.so.6", "libm.so.6", "libmvec.so.1", "libpthread.so.0",
          "libdl.so.2", "librt.so.1", "libutil.so.1", "libresolv.so.2", "libnsl.so.1", "libstdc++.so.6",
          "libgcc_s.so.1"}

# Loads an installed package's libevt with ctypes (no torch: other Pythons here have none), parses a graph, and
# prints every mapped library that the package also bundles, with its path.
LOAD = textwrap.dedent("""
    import ctypes, importlib.util, os, sys
    pkg = importlib.util.find_spec("evt").submodule_search_locations[0]
    L = ctypes.CDLL(os.path.join(pkg, "_libevt.so"))
    L.evt_parse.restype = ctypes.c_void_p
    L.evt_parse.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_char_p)]
    L.evt_graph_node_count.argtypes = [ctypes.c_void_p]
    g = L.evt_parse(sys.argv[1].encode(), b"g.evt", None)
    print("NODES", L.evt_graph_node_count(g))
    bundled = set(os.listdir(os.path.join(pkg, "libs")))
    for path in sorted({l.split()[-1] for l in open("/proc/self/maps") if l.split()[-1].startswith("/")}):
        if os.path.basename(path) in bundled:
            print("MAPPED", path)
""")
GRAPH = ("graph g {\n  %w: f32[4] = param(init=ones)\n  %t: f32[4] = input(init=zeros)\n"
         "  %loss: f32[] = mse_loss(%w, %t)\n  loss %loss\n}\n")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    d = tmp_path_factory.mktemp("wheel")
    pip = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(d),
                          os.path.join(ROOT, "python")], env=_clean_env(), capture_output=True, text=True)
    assert pip.returncode == 0, pip.stdout + pip.stderr
    [whl] = glob.glob(str(d / "*.whl"))
    return whl


@pytest.fixture(scope="module")
def venv(tmp_path_factory, wheel):
    d = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(d)], check=True)
    pip = subprocess.run([str(d / "bin" / "pip"), "install", "-q", wheel], env=_clean_env(), capture_output=True,
                         text=True)
    assert pip.returncode == 0, pip.stdout + pip.stderr
    return d


def _package(venv):
    [pkg] = glob.glob(str(venv / "lib" / "python*" / "site-packages" / "evt"))
    return pkg


def _ldd(path):
    """{soname: resolved path or "not found"} with no LD_LIBRARY_PATH or other settings of ours."""
    out = subprocess.run(["ldd", path], env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True, check=True)
    deps = {}
    for line in out.stdout.splitlines():
        if "=>" in line:
            name, where = (part.strip() for part in line.split("=>", 1))
            deps[name] = where.split(" (")[0].strip()
    return deps


def test_the_wheel_is_for_any_python_3(wheel):
    name, version, python, abi, platform = os.path.basename(wheel)[:-len(".whl")].split("-")
    assert (name, python, abi) == ("evt", "py3", "none") and platform.startswith("linux_"), wheel


def test_the_installed_libraries_need_nothing_outside_the_package_but_the_system(venv):
    pkg = _package(venv)
    libs = sorted(glob.glob(os.path.join(pkg, "*.so")))
    assert [os.path.basename(p) for p in libs if "libevt" in p][0] == "_libevt.so", libs
    for lib in libs:  # libevt_fallback.so too, where built: its CUDA libraries come from the toolkit's lib64
        deps = _ldd(lib)
        assert "not found" not in deps.values(), (lib, deps)
    outside = {name: where for name, where in _ldd(os.path.join(pkg, "_libevt.so")).items()
               if name not in SYSTEM and not os.path.realpath(where).startswith(os.path.join(pkg, "libs") + os.sep)}
    assert not outside, outside


def _other_pythons():
    """The oldest and newest of pyenv's Pythons >= 3.9 (requires-python) other than this one's version (none where
    pyenv is not installed)."""
    root = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    found = {}
    for exe in glob.glob(os.path.join(root, "versions", "3.*", "bin", "python3")):
        minor = int(os.path.basename(os.path.dirname(os.path.dirname(exe))).split(".")[1])
        if minor >= 9 and minor != sys.version_info.minor:
            found[minor] = exe
    return sorted({found[min(found)], found[max(found)]}) if found else []


@pytest.mark.parametrize("python", _other_pythons() or [None])
def test_the_wheel_installs_and_loads_under_another_python(wheel, python, tmp_path):
    if python is None:
        pytest.skip("no other Python 3 here (pyenv)")
    target = tmp_path / "site"
    pip = subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(target),
                          wheel], env=_clean_env(), capture_output=True, text=True)
    assert pip.returncode == 0, pip.stdout + pip.stderr
    r = subprocess.run([python, "-c", LOAD, GRAPH], cwd=tmp_path, env={"PATH": "/usr/bin:/bin",
                       "PYTHONPATH": str(target)}, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "NODES 3" in r.stdout, r.stdout
    mapped = [line.split(" ", 1)[1] for line in r.stdout.splitlines() if line.startswith("MAPPED ")]
    assert mapped and all(p.startswith(str(target)) for p in mapped), r.stdout  # the bundled copies, not the system's


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
