#!/usr/bin/env bash
# Dev-machine side of tests/gpu/window.sh: builds evtc here (the device image has no CBC headers) and
# copies it with its non-system shared libraries into the git-ignored .gpuwork/w/hostbin (carried).
# Optional: JIT=folder holding the jit.txz.* parts of the last window: they become .gpuwork/w/jit.txz.
# Everything travels compressed (the carried tree is limited to 64 MiB): hostbin.tgz, cutlass.tgz.
set -e
make -j2 >/dev/null
w=.gpuwork/w
mkdir -p $w/hostbin/lib
cp build/evtc build/libevt.so build/libevt.a $w/hostbin/
ldd build/evtc | awk '/=> \//{print $3}' | grep -E 'Cbc|Cgl|Osi|Clp|CoinUtils|lapack|blas|gfortran|quadmath|bz2|libz' | while read -r l; do cp -L "$l" $w/hostbin/lib/; done
# bench/kernels/bench_tune.cu needs the whole library (the lowering pulls in the partitioner, hence CBC): linked here
nvcc -std=c++17 -O2 -diag-suppress 550 -gencode=arch=compute_90a,code=sm_90a -Isrc -Iinclude -Ikernels \
  bench/kernels/bench_tune.cu build/libevt.a -lcublasLt $(pkg-config --libs cbc) -lm -lpthread -ldl -o $w/hostbin/bench_tune
du -sh $w
# unversioned names for -l linking (relative links, they travel as links)
( cd $w/hostbin/lib && for f in *.so.*; do ln -sf "$f" "${f%%.so.*}.so"; done )
tar czf $w/hostbin.tgz -C $w hostbin
[ -f $w/cutlass.tgz ] || tar czf $w/cutlass.tgz .cutlass/cutlass_library/source/include .cutlass/cutlass_library/source/tools/util/include
# the last window's cache (xz parts, or gzip parts of older windows) as one .gpuwork/w/jit.txz
if [ -n "${JIT:-}" ]; then
  if ls "$JIT"/jit.txz.* >/dev/null 2>&1; then cat "$JIT"/jit.txz.* > $w/jit.txz
  elif ls "$JIT"/jit.tgz.* >/dev/null 2>&1; then cat "$JIT"/jit.tgz.* | gunzip | xz -6 -T2 > $w/jit.txz; fi
fi
rm -rf $w/hostbin
du -sh $w
