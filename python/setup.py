"""Builds libevt (the C library, with setuptools' own compiler) into the evt package, and beside it, where nvcc
is installed, the CUDA kernel library and the kernels/ headers the JIT-compiled kernels include, so that an
installed `evt` needs no checkout and no environment variables. Needs CBC's and OpenBLAS's headers (Debian
coinor-libcbc-dev, libopenblas-dev; pkg-config) at build time; the metadata is in pyproject.toml.

The wheel runs on any Python 3 (tag py3-none-linux_x86_64): libevt is a plain shared library loaded with ctypes,
so it is evt/_libevt.so (no CPython ABI suffix), and the shared libraries it needs beyond glibc and the GCC
runtime (CBC, OpenBLAS, gfortran, ...) are copied into evt/libs/, where libevt's rpath finds them."""
import glob
import os
import shutil
import subprocess

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

try:  # setuptools >= 70.1 (pyproject.toml's build requirement); older ones: the wheel package's
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:
    try:
        from wheel.bdist_wheel import bdist_wheel
    except ImportError:
        bdist_wheel = None

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


# What libevt may take from the system: glibc's libraries and the GCC C/C++ runtime, as auditwheel's manylinux
# policy (every glibc Linux has them; a second libstdc++ beside PyTorch's would clash). Anything else ldd
# resolves is copied into evt/libs/.
SYSTEM_LIBS = {"linux-vdso.so.1", "ld-linux-x86-64.so.2", "libc.so.6", "libm.so.6", "libmvec.so.1", "libpthread.so.0",
               "libdl.so.2", "librt.so.1", "libutil.so.1", "libresolv.so.2", "libnsl.so.1", "libstdc++.so.6",
               "libgcc_s.so.1"}
LIBS = "libs"


def ldd(path):
    """[(soname, resolved path or None)] of every library the loader maps for `path` (its whole closure)."""
    out = subprocess.check_output(["ldd", path], text=True)
    deps = []
    for line in out.splitlines():
        if "=>" not in line:
            continue
        name, where = (part.strip() for part in line.split("=>", 1))
        path = where.split(" (")[0].strip()
        deps.append((name, None if path == "not found" else path))
    return deps


class BuildEvt(build_ext):
    """libevt as the extension (evt/_libevt.so), its non-system libraries into evt/libs/, then the kernel headers
    and (with nvcc) libevt_fallback.so beside it."""

    def get_ext_filename(self, fullname):
        """evt/_libevt.so, with no CPython ABI suffix: libevt is not an extension module (asked for as "evt._libevt"
        and, by get_ext_fullpath, as "_libevt")."""
        *package, name = fullname.split(".")
        if name == "_libevt":
            return os.path.join(*package, "_libevt.so")
        return super().get_ext_filename(fullname)

    def run(self):
        pkg = os.path.join(self.build_lib if not self.inplace else HERE, "evt")
        for d in {os.path.join(self.build_lib, "evt"), pkg}:  # an earlier build's libraries, if any
            for old in glob.glob(os.path.join(d, "_libevt*.so")):  # with the ABI suffix of older builds too
                os.remove(old)
            shutil.rmtree(os.path.join(d, LIBS), ignore_errors=True)  # ldd must see the system's, not old copies
        super().run()
        self.bundle_libraries(self.get_ext_fullpath("evt._libevt"), os.path.join(pkg, LIBS))
        kdir = os.path.join(pkg, "kernels")
        shutil.rmtree(kdir, ignore_errors=True)
        shutil.copytree(os.path.join(REPO, "kernels"), kdir, ignore=shutil.ignore_patterns("fallback"))
        self.build_kernel_library(pkg)

    def build_extensions(self):
        # the build Python's own rpath (pyenv's LDSHARED has one) means nothing where the wheel is installed
        self.compiler.linker_so = [a for a in self.compiler.linker_so if not a.startswith(("-Wl,-rpath", "-Wl,-R"))]
        super().build_extensions()

    def bundle_libraries(self, libevt, dest):
        os.makedirs(dest, exist_ok=True)
        for name, path in ldd(libevt):
            if name in SYSTEM_LIBS:
                continue
            if path is None:
                raise SystemExit(f"evt: {libevt} needs {name}, which ldd does not find")
            shutil.copyfile(os.path.realpath(path), os.path.join(dest, name))  # under the name the loader asks for
            print(f"evt: bundled {name} ({path})")

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
    # DT_RPATH, not RUNPATH: it also serves the bundled libraries' own dependencies, and comes before the system's
    extra_link_args=flags("--libs") + ["-lm", "-lpthread", "-ldl", "-Wl,-rpath,$ORIGIN/" + LIBS,
                                       "-Wl,--disable-new-dtags"],
)

cmdclass = {"build_ext": BuildEvt}
if bdist_wheel is not None:
    class BdistWheelPy3(bdist_wheel):
        """py3-none-<platform>: nothing in the wheel depends on the Python version or ABI."""

        def get_tag(self):
            return "py3", "none", super().get_tag()[2]

    cmdclass["bdist_wheel"] = BdistWheelPy3

setup(ext_modules=[ext], cmdclass=cmdclass)
