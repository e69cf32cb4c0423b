#!/usr/bin/env bash
# For a GPU machine without CBC's headers (such as the project's lent H200s): builds libevt and evtc here and packs
# them with their CBC / LAPACK shared libraries into .gpuwork/hostbin.tgz, and the CUTLASS headers into
# .gpuwork/cutlass.tgz (git-ignored; carry .gpuwork). tests/gpu/run.sh unpacks them and then builds only the CUDA
# parts there. Usage: bash tests/gpu/prep.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
make -j2 >/dev/null
w=.gpuwork
rm -rf $w/hostbin && mkdir -p $w/hostbin/lib
cp build/evtc build/libevt.so build/libevt.a $w/hostbin/
ldd build/evtc | awk '/=> \//{print $3}' | grep -E 'Cbc|Cgl|Osi|Clp|CoinUtils|lapack|blas|gfortran|quadmath|bz2|libz' |
  while read -r l; do cp -L "$l" $w/hostbin/lib/; done
( cd $w/hostbin/lib && for f in *.so.*; do ln -sf "$f" "${f%%.so.*}.so"; done ) # names for -l
tar czf $w/hostbin.tgz -C $w hostbin && rm -rf $w/hostbin
[ -f $w/cutlass.tgz ] || tar czf $w/cutlass.tgz .cutlass/cutlass_library/source/include .cutlass/cutlass_library/source/tools/util/include
du -sh $w/*.tgz
