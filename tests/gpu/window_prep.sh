#!/usr/bin/env bash
# Dev-machine side of tests/gpu/window.sh: builds evtc here (the device image has no CBC headers) and
# copies it with its non-system shared libraries into the git-ignored .gpuwork/w/hostbin (carried).
# Optional: JIT=path/to/jit.tar from the last window becomes .gpuwork/w/jit.tar.
set -e
make -j2 >/dev/null
w=.gpuwork/w
mkdir -p $w/hostbin/lib
cp build/evtc build/libevt.so build/libevt.a $w/hostbin/
ldd build/evtc | awk '/=> \//{print $3}' | grep -E 'Cbc|Cgl|Osi|Clp|CoinUtils|lapack|blas|gfortran|quadmath|bz2|libz' | while read -r l; do cp -L "$l" $w/hostbin/lib/; done
if [ -n "${JIT:-}" ] && [ -f "$JIT" ]; then cp "$JIT" $w/jit.tar; fi
du -sh $w
# unversioned names for -l linking (relative links, they travel as links)
( cd $w/hostbin/lib && for f in *.so.*; do ln -sf "$f" "${f%%.so.*}.so"; done )
