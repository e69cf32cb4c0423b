"""Builds libevt (the C library, with setuptools' own compiler) into the evt package, and beside it, where nvcc
is installed, the CUDA kernel library and the kernels/ headers the JIT-compiled kernels include, so that an
installed `evt` needs no checkout and no environment variables. Needs CBC's and OpenBLAS's headers (Debian
coinor-libcbc-dev, libopenblas-dev; pkg-config) at build time; the metadata is in pyproject.toml."""
import glob
import os
import shutil
import subprocess

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


def rel(path):
    return os.path.relpath(path, HERE)


def pkg_config(*args, package="cbc", debian="coinor-libcbc-dev"):
    try:
        return subprocess.check_output(["pkg-config", *args, package], text=True).split()
    except (OSError, subprocess.CalledProcessError):
        raise SystemExit(f"evt: {package} not found (pkg-config {package}): install {debian} (bash scripts/setup.sh)")


def flags(kind):
    """CBC's (the partitioner's solver) and OpenBLAS's (the interpreter's matrix products) compile or link flags."""
    return pkg_config(kind) + pkg_config(kind, package="openblas", debian="libopenblas-dev")


def c_sources():
    """libevt's sources: every .c under src/ but the evtc command line."""
    files = glob.glob(os.path.join(REPO, "src", "**", "*.c"), recursive=True)
    return sorted(rel(f) for f in files if os.sep + "cli" + os.sep not in f)


class BuildEvt(build_ext):
    """libevt as the extension, then the kernel headers and (with nvcc) libevt_fallback.so beside it."""

    def run(self):
        super().run()
        pkg = os.path.join(self.build_lib if not self.inplace else HERE, "evt")
        kdir = os.path.join(pkg, "kernels")
        shutil.rmtree(kdir, ignore_errors=True)
        shutil.copytree(os.path.join(REPO, "kernels"), kdir, ignore=shutil.ignore_patterns("fallback"))
        self.build_kernel_library(pkg)

    def build_kernel_library(self, pkg):
        if not shutil.which("nvcc"):
            print("evt: no nvcc: the CUDA kernel library is not built (the CPU interpreter still runs everything)")
            return
        out = os.path.join(pkg, "libevt_fallback.so")
        cmd = ["make", "-C", REPO, "cuda"]
        subprocess.check_call(cmd)
        shutil.copy2(os.path.join(REPO, "build", "libevt_fallback.so"), out)


ext = Extension(
    "evt._libevt",
    sources=c_sources(),
    include_dirs=[rel(os.path.join(REPO, d)) for d in ("include", "src", "kernels")],
    extra_compile_args=["-std=c11", "-O2", "-D_GNU_SOURCE", "-Wno-missing-field-initializers"] + flags("--cflags"),
    extra_link_args=flags("--libs") + ["-lm", "-lpthread", "-ldl"],
)

setup(ext_modules=[ext], cmdclass={"build_ext": BuildEvt})
