#!/usr/bin/env bash
# GPU window script: what the GELU math costs in a GEMM epilogue, by variants of kernels/evt_math.h (session 32).
#   EPIVAR="base nomufu erftanh tanhf taylor" bash tests/gpu/w/epivar.sh LOGFILE SECONDS
# Each variant is a copy of kernels/ with evt_math.h edited, passed to bench_tune as EVT_KERNELS_DIR (the JIT cache
# key holds the include path, so the variants' kernels do not collide):
#   base     kernels/ as committed
#   nomufu   rcp.approx / ex2.approx replaced by an FMA each (wrong values: timing only, "NOT MATCHED" expected)
#   erftanh  the erf GELU and its derivative computed by the tanh.approx formula (wrong by ~1e-3: timing only)
#   tanhf    the tanh GELU on tanhf (0.5·x·(1 + tanhf(y)); the form before session 32)
#   taylor   the tanh GELU on tanh.approx.f32 (what CUTLASS's GELU_taylor / dGELU compute)
#   relufwd  timing only (gelu(+inf) becomes NaN): the erf GELU as relu(x) - |x·t·P(t)|·e (one instruction fewer)
#   prevbwd  evt_gelu_erf_grad as before session 37 (Φ from evt_normal_cdf, then fmaf(x·φ0, e, Φ): one multiply more)
#   noinl4, noinl8   evt_ops::GeluErf / GeluErfGrad (evt_visitor_ops.h) call a __noinline__ function per 4 / 8
#            elements: the fully unrolled epilogue's code shrinks ~2x (3520 -> ~1850 SASS instructions), a test of
#            whether instruction fetch is what the GELU epilogue waits for
# EPIVAR_PHASE=compile | run | all (default): compile only (e.g. beside another job's compile), time only, or both.
# Cases: EPIVAR_ONLY (bench_tune's BENCH_TUNE_CASES=epi names) at 16384x4096xK for K in EPIVAR_KS, config EPIVAR_CFG.
set -u
LOG=${1:?LOGFILE}
SECS=${2:-300}
exec >>"$LOG" 2>&1
T0=$(date +%s)
left() { echo $(( SECS - ($(date +%s) - T0) )); }
echo "=== epivar.sh: $(date -u) budget ${SECS}s"
B=${EVT_HOSTBIN:?window_prep.sh builds hostbin}/bench_tune
VARIANTS=${EPIVAR:-"base tanhf taylor"}
ONLY=${EPIVAR_ONLY:-"fc1 fwd:bias_aux,fc1 fwd:bias_gelu_aux,fc1 fwd:bias_gelut_aux,fc2 bwd dX:mulx_dbias,fc2 bwd dX:gelut_bwd_dbias"}
CF=${EPIVAR_CFG:-"128x128x64 c1x1 pingpong e64"}
mk() {
  local d=/tmp/evt-epivar/k_$1
  rm -rf "$d"; mkdir -p /tmp/evt-epivar; cp -r kernels "$d"
  python3 - "$d/evt_math.h" "$1" <<'PY'
import sys
p, v = sys.argv[1], sys.argv[2]
s = open(p).read()
TANH_FAST = '''EVT_MATH_HD float evt_tanh_fast(float u) {
#ifdef __CUDA_ARCH__
  float t; asm("tanh.approx.f32 %0, %1;" : "=f"(t) : "f"(u)); return t;
#else
  return tanhf(u);
#endif
}
'''
FAST = '''  float t = evt_tanh_fast(x * fmaf(x * x, 0.0356774f, 0.797885f)), h = 0.5f * x;
  return fmaf(h, t, h);
'''
FAST_GRAD = '''  float t = evt_tanh_fast(x * fmaf(x * x, 0.0356774f, 0.797885f)), h = 0.5f * x;
  float d = fmaf(-t, t, 1.0f) * fmaf(x * x, 0.107032f, 0.797885f);
  return dy * (fmaf(0.5f, t, 0.5f) + h * d);
'''
def put(name, text):  # replaces the body of "EVT_MATH_HD float NAME(...) { ... }" (braces matched)
    global s
    a = s.index('{', s.index('EVT_MATH_HD float %s(' % name))
    depth, b = 0, a
    while True:
        depth += {'{': 1, '}': -1}.get(s[b], 0)
        if depth == 0: break
        b += 1
    s = s[:a] + '{\n' + text + s[b:]
if v == 'nomufu':
    s = s.replace('asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));', 'r = fmaf(x, -0.25f, 1.5f);')
    s = s.replace('asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));', 'r = fmaf(x, 0.125f, 1.0f);')
elif v == 'erftanh':
    put('evt_gelu_erf', FAST); put('evt_gelu_erf_grad', FAST_GRAD)
elif v == 'tanhf':
    put('evt_gelu_tanh', '  return 0.5f * x * (1.f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));\n')
    put('evt_gelu_tanh_grad', '''  const float th = tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x));
  return dy * (0.5f * (1.f + th) + 0.5f * x * (1.f - th * th) * 0.7978845608028654f * (1.f + 3.f * 0.044715f * x * x));
''')
elif v == 'taylor':
    put('evt_gelu_tanh', FAST); put('evt_gelu_tanh_grad', FAST_GRAD)
elif v == 'relufwd':
    put('evt_gelu_erf', '''  float e;
  const float tp = evt_normal_tail_tp(x, &e);
  return fmaf(-fabsf(x * tp), e, fmaxf(x, 0.f));
''')
elif v == 'prevbwd':
    put('evt_gelu_erf_grad', '''  float e;
  const float cdf = evt_normal_cdf(x, &e);
  return dy * fmaf(x * 0.39894228040143268f, e, cdf);
''')
elif v not in ('base', 'noinl4', 'noinl8'):
    sys.exit('unknown variant ' + v)
if 'evt_tanh_fast(' in s:
    a = s.index('EVT_MATH_HD float evt_gelu_erf(')
    s = s[:a] + TANH_FAST + s[a:]
open(p, 'w').write(s)
PY
  case $1 in noinl*) python3 - "$d/evt_visitor_ops.h" "${1#noinl}" <<'PY'
import sys
p, w = sys.argv[1], int(sys.argv[2])
s = open(p).read()
g = w // 4
def f4(name, base):  # "make_float4(name[i + base], ..., name[i + base + 3])"
    return 'make_float4(%s)' % ', '.join('%s[i + %d]' % (name, base + k) for k in range(4))
ret = 'EvtF%d' % w
helpers = 'struct EvtF%d { float4 q[%d]; };\n' % (w, g)
for fn, args in (('gelu_erf', ['x']), ('gelu_erf_grad', ['dy', 'x'])):
    params = ', '.join('float4 %s%d' % (a, j) for a in args for j in range(g))
    comps = []
    for j in range(g):
        comps.append('make_float4(%s)' % ', '.join('evt_%s(%s)' % (fn, ', '.join('%s%d.%s' % (a, j, c) for a in args)) for c in 'xyzw'))
    helpers += 'static __host__ __device__ __noinline__ %s evt_%s_x%d(%s) {\n  return %s{{%s}};\n}\n' % (ret, fn, w, params, ret, ', '.join(comps))
def body(fn, arrs):
    call = 'evt_%s_x%d(%s)' % (fn, w, ', '.join(f4(a, 4 * j) for a in arrs for j in range(g)))
    unpack = ' '.join('y[i + %d] = r.q[%d].%s;' % (4 * j + k, j, c) for j in range(g) for k, c in enumerate('xyzw'))
    return ('    if constexpr (N %% %d == 0 && std::is_same<T, float>::value) {\n'
            '      CUTLASS_PRAGMA_UNROLL\n'
            '      for (int i = 0; i < N; i += %d) {\n'
            '        %s r = %s;\n'
            '        %s\n'
            '      }\n'
            '      return y;\n'
            '    }\n') % (w, w, ret, call, unpack)
old_u = "    cutlass::Array<T, N> y;\n    GeluErf<T> op;"
old_b = "    cutlass::Array<T, N> y;\n    GeluErfGrad<T> op;"
assert old_u in s and old_b in s
s = s.replace(old_u, "    cutlass::Array<T, N> y;\n" + body('gelu_erf', ['v']) + "    GeluErf<T> op;")
s = s.replace(old_b, "    cutlass::Array<T, N> y;\n" + body('gelu_erf_grad', ['dy', 'x']) + "    GeluErfGrad<T> op;")
a = s.index('template <class T>\nstruct GeluErf {')
s = s[:a] + helpers + s[a:]
open(p, 'w').write(s)
PY
  esac
}
export BENCH_TUNE_CASES=epi
mkdir -p /tmp/evt-epivar  # the result tables (mk makes it too, but a base-only run calls no mk)
PHASE=${EPIVAR_PHASE:-all}
echo "-- compile $VARIANTS at +$(( $(date +%s) - T0 ))s (phase $PHASE)"
[ "$PHASE" = run ] || for v in $VARIANTS; do
  kd=$PWD/kernels
  [ "$v" = base ] || { mk "$v" || continue; kd=/tmp/evt-epivar/k_$v; }
  ( EVT_KERNELS_DIR=$kd BENCH_TUNE_ONLY="$ONLY" BENCH_TUNE_CFGS="$CF" EVT_JIT_JOBS=6 timeout $(( $(left) - 60 )) \
      "$B" compile 2 2>&1 | grep -v "^\[evt-jit\] [0-9]*/" | tail -2 | sed "s/^/[$v] /" ) &
done
wait
[ "$PHASE" = compile ] || for k in ${EPIVAR_KS:-1024 64}; do
  for v in $VARIANTS; do
    kd=$PWD/kernels; [ "$v" = base ] || kd=/tmp/evt-epivar/k_$v
    echo "##### variant $v K=$k at +$(( $(date +%s) - T0 ))s"
    EVT_KERNELS_DIR=$kd BENCH_TUNE_MNK=16384x4096x$k BENCH_TUNE_ONLY="$ONLY" BENCH_TUNE_CFGS="$CF" BENCH_TUNE_NSV=1 \
      timeout $(( $(left) - 10 )) "$B" run 2 "/tmp/evt-epivar/${v}_$k.md" 20 2>&1 | grep -v "^\[evt-jit\]"
  done
done
echo "=== epivar.sh done at +$(( $(date +%s) - T0 ))s"
