// GPU check of generated convolution + epilogue-visitor-tree kernels (src/codegen/lower_conv.c, emit_cutlass_conv.c)
// against the CPU interpreter; run by tests/gpu/run.sh (group `kernels`). Each case is a small NHWC graph: conv2d
// (layout=nhwc, bf16) and its epilogue, partitioned with the lowering's rules and lowered (the conv group must be one
// CONV+EVT kernel, with the case's reductions in it), JIT-compiled, launched twice (the launcher must reset the sums)
// on the interpreter's random inputs with NaN-poisoned outputs; D and every stored tensor are compared with the
// interpreter's values of those nodes (relative Frobenius error <= 1e-2; NaN never passes). Cases: 1x1, 3x3 stride 1
// pad 1, 3x3 stride 2, a 7x7 stride-2 pad-3 stem with C = 16 (C = 8 is refused by the lowering: no K tile of 16
// channels), each with bias + ReLU + an aux store of the pre-activation; one with the batch-norm statistics (Σ y and
// Σ y² over N, P, Q: row sums); one with per-pixel sums and maxima over the channels (column reductions) and a mean
// over N, P, Q; one with a residual aux load; dgrad (conv2d_backward_input, stride 1): a 3x3 one with the previous
// layer's ReLU mask and the batch-norm backward's sums, a plain 1x1 one; wgrad (conv2d_backward_weight: dw stored),
// 3x3 with stride 1 and 2. CHECK_CONV_ONLY=substring keeps the cases whose label has it. Prints "N passed, N failed".
#include "gpu_util.h"

#include "check_report.h"
extern "C" {
#include "codegen/lower.h"
#include "partition/partition.h"
}

struct ConvCase {
  const char *label, *body;
};

#define IN(shape) "bf16" shape " = input(init=uniform, lo=-1, hi=1)\n"
#define PARAM(shape) "bf16" shape " = param(init=uniform, lo=-0.25, hi=0.25)\n"
#define BIAS_RELU_AUX(X, W, O, CONV)                                                                              \
  "  %x: " IN(X) "  %w: " PARAM(W) "  %b: " PARAM("[" O "]") "  %c = conv2d(%x, %w, " CONV ", layout=nhwc)\n" \
  "  %y = add(%c, %b)\n  %r = relu(%y)\n  output %r\n  output %y\n"

static const ConvCase kCases[] = {
    {"1x1 bias+relu+aux", BIAS_RELU_AUX("[2,16,16,64]", "[128,1,1,64]", "128", "padding=[0,0]")},
    {"3x3 s1 p1 bias+relu+aux", BIAS_RELU_AUX("[2,14,14,32]", "[64,3,3,32]", "64", "padding=[1,1]")},
    {"3x3 s2 p1 bias+relu+aux", BIAS_RELU_AUX("[2,15,15,32]", "[64,3,3,32]", "64", "stride=[2,2], padding=[1,1]")},
    {"7x7 s2 p3 stem C=16 bias+relu+aux", BIAS_RELU_AUX("[2,32,32,16]", "[64,7,7,16]", "64", "stride=[2,2], padding=[3,3]")},
    {"3x3 s1 p1 bias+relu+bn-stats",
     "  %x: " IN("[2,14,14,32]") "  %w: " PARAM("[64,3,3,32]") "  %b: " PARAM("[64]")
     "  %c = conv2d(%x, %w, padding=[1,1], layout=nhwc)\n  %y = add(%c, %b)\n  %r = relu(%y)\n"
     "  %f = cast(%y, dtype=f32)\n  %s = sum(%f, dims=[0,1,2])\n  %f2 = mul(%f, %f)\n  %q = sum(%f2, dims=[0,1,2])\n"
     "  output %r\n  output %s\n  output %q\n"},
    // per-pixel sum and max over the channels (column reductions, [N*P*Q] vectors) and a mean over N, P, Q
    {"3x3 s1 p1 relu+channel-sum+amax+mean",
     "  %x: " IN("[2,14,14,32]") "  %w: " PARAM("[64,3,3,32]")
     "  %c = conv2d(%x, %w, padding=[1,1], layout=nhwc)\n  %r = relu(%c)\n  %f = cast(%c, dtype=f32)\n"
     "  %s = sum(%f, dims=[3])\n  %m = amax(%f, dims=[3])\n  %u = mean(%f, dims=[0,1,2])\n"
     "  output %r\n  output %s\n  output %m\n  output %u\n"},
    {"3x3 s1 p1 residual+relu",
     "  %x: " IN("[2,14,14,64]") "  %w: " PARAM("[64,3,3,64]") "  %res: " IN("[2,14,14,64]")
     "  %c = conv2d(%x, %w, padding=[1,1], layout=nhwc)\n  %y = add(%c, %res)\n  %r = relu(%y)\n  output %r\n"},
    // dgrad: dx = conv2d_backward_input(dy, w), then the previous layer's ReLU mask (where over its pre-activation h)
    // and the batch-norm backward's sums over N, H, W
    {"dgrad 3x3 s1 p1 relu-mask+bn-sums",
     "  %dy: " IN("[2,14,14,64]") "  %w: " PARAM("[64,3,3,32]") "  %h: " IN("[2,14,14,32]")
     "  %z: bf16[] = scalar(value=0)\n"
     "  %c = conv2d_backward_input(%dy, %w, padding=[1,1], shape=[2,14,14,32], layout=nhwc)\n"
     "  %pos = gt(%h, %z)\n  %g = where(%pos, %c, %z)\n  %f = cast(%g, dtype=f32)\n  %s = sum(%f, dims=[0,1,2])\n"
     "  %hf = cast(%h, dtype=f32)\n  %gh = mul(%f, %hf)\n  %t = sum(%gh, dims=[0,1,2])\n"
     "  output %g\n  output %s\n  output %t\n"},
    {"dgrad 1x1 plain",
     "  %dy: " IN("[2,16,16,128]") "  %w: " PARAM("[128,1,1,64]")
     "  %c = conv2d_backward_input(%dy, %w, padding=[0,0], shape=[2,16,16,64], layout=nhwc)\n  output %c\n"},
    // wgrad: dw = conv2d_backward_weight(x, dy), stored (a D-only epilogue)
    {"wgrad 3x3 s1 p1",
     "  %x: " IN("[2,14,14,32]") "  %dy: " IN("[2,14,14,64]")
     "  %c = conv2d_backward_weight(%x, %dy, padding=[1,1], shape=[64,3,3,32], layout=nhwc)\n  output %c\n"},
    {"wgrad 3x3 s2 p1",
     "  %x: " IN("[2,15,15,32]") "  %dy: " IN("[2,8,8,64]")
     "  %c = conv2d_backward_weight(%x, %dy, stride=[2,2], padding=[1,1], shape=[64,3,3,32], layout=nhwc)\n"
     "  output %c\n"},
};

// One case: its graph, the interpreter's values, the lowered conv group and its launcher.
struct Prepared {
  const ConvCase *c = nullptr;
  evt_graph *g = nullptr;
  evt_tensor *values = nullptr;
  evt_part_plan part{};
  evt_lower_result low{};
  const evt_lowered *L = nullptr;
  evt_launch_fn fn = nullptr;
};

static bool prepare(const ConvCase &c, uint64_t seed, Prepared *p) {
  p->c = &c;
  char text[4096], *err = nullptr;
  snprintf(text, sizeof text, "graph conv {\n%s}\n", c.body);
  p->g = evt_parse(text, c.label, &err);
  if (!p->g) {
    report(false, "%-36s: parse: %s", c.label, err ? err : "?");
    free(err);
    return false;
  }
  p->values = (evt_tensor *)calloc((size_t)p->g->nnodes, sizeof(evt_tensor));
  if (evt_interp_init_inputs(p->g, p->values, seed) != EVT_OK || evt_interp_run(p->g, p->values, 0, 1) != EVT_OK) {
    report(false, "%-36s: interpreter: %s", c.label, evt_graph_error(p->g));
    return false;
  }
  evt_part_options o = evt_part_options_default();
  o.use_cache = 0;
  if (evt_lower_partition(p->g, &o, EVT_PART_LAMBDA_DEFAULT, &p->part) != EVT_OK ||
      evt_lower_plan(p->g, &p->part, &p->low) != EVT_OK) {
    report(false, "%-36s: partition / lowering failed", c.label);
    return false;
  }
  int cv = evt_graph_find(p->g, "c");
  p->L = &p->low.k[p->part.group[cv]];
  if (!p->L->ok || p->L->kind != EVT_LK_CONV_EVT) {
    report(false, "%-36s: not lowered: %s", c.label, p->L->reason);
    return false;
  }
  bool wants = strstr(c.label, "sum") || strstr(c.label, "stats") || strstr(c.label, "mean");
  int sums = 0;  // the reductions fused into the conv group (the cases that have some must keep them in it)
  for (int v = 0; v < p->L->spec.nnodes; v++)
    sums += evt_vop_class(p->L->spec.nodes[v].op) == 'S' && p->L->spec.nodes[v].op != EVT_V_AUX_STORE;
  if (wants) report(sums > 0, "%-36s: %d reductions in the conv group", c.label, sums);
  return true;
}

// bytes of one element in a kernel's memory: bool tiles are u8 0/1
static size_t elem_bytes(evt_dtype dt) { return dt == EVT_BOOL ? 1 : dtype_bytes(dt); }

// host values (doubles) as dtype's bytes on the device (16 spare bytes, as dev_upload)
static void *upload(const evt_tensor &t, evt_dtype dt) {
  std::vector<unsigned char> bytes((size_t)t.numel * elem_bytes(dt));
  for (int64_t i = 0; i < t.numel; i++) {
    float v = (float)t.data[i];
    if (dt == EVT_BOOL) {
      bytes[i] = v != 0;
    } else if (dt == EVT_BF16) {
      __nv_bfloat16 h = __float2bfloat16(v);
      memcpy(&bytes[2 * i], &h, 2);
    } else if (dt == EVT_F16) {
      __half h = __float2half(v);
      memcpy(&bytes[2 * i], &h, 2);
    } else {
      memcpy(&bytes[4 * i], &v, 4);
    }
  }
  return dev_upload(bytes);
}

static std::vector<double> download(const void *dptr, size_t n, evt_dtype dt) {
  std::vector<unsigned char> h(n * elem_bytes(dt));
  CUDA_CHECK(cudaMemcpy(h.data(), dptr, h.size(), cudaMemcpyDeviceToHost));
  std::vector<double> out(n);
  for (size_t i = 0; i < n; i++) {
    if (dt == EVT_BOOL) out[i] = h[i];
    else if (dt == EVT_BF16) out[i] = __bfloat162float(*(const __nv_bfloat16 *)&h[2 * i]);
    else if (dt == EVT_F16) out[i] = __half2float(*(const __half *)&h[2 * i]);
    else out[i] = *(const float *)&h[4 * i];
  }
  return out;
}

// relative Frobenius error of out against ref; NaN / inf anywhere in out -> +inf
static double rel_err(const std::vector<double> &out, const evt_tensor &ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < out.size(); i++) {
    if (!std::isfinite(out[i])) return INFINITY;
    double d = out[i] - ref.data[i];
    num += d * d;
    den += ref.data[i] * ref.data[i];
  }
  return den > 0 ? sqrt(num / den) : sqrt(num);
}

static void check(Prepared &p) {
  const evt_lowered &L = *p.L;
  const evt_kspec &s = L.spec;
  const char *label = p.c->label;
  evt_launch_args args;
  memset(&args, 0, sizeof args);
  args.m = (int)L.m, args.n = (int)L.n, args.k = (int)L.k;
  args.a = upload(p.values[L.a_node], s.ab_dtype);
  args.b = upload(p.values[L.b_node], s.ab_dtype);
  size_t d_elems = (size_t)(L.m * L.n);
  CUDA_CHECK(cudaMalloc(&args.d, d_elems * dtype_bytes(s.d_dtype)));
  CUDA_CHECK(cudaMemset(args.d, 0xFF, d_elems * dtype_bytes(s.d_dtype)));  // NaN poison
  for (int v = 0; v < s.nnodes; v++) {
    int t = L.vtensor[v];
    if (t < 0 || !evt_vop_has_memory(s.nodes[v].op)) continue;
    if (evt_vop_class(s.nodes[v].op) == 'L') {
      args.ptrs[v] = upload(p.values[t], s.nodes[v].dtype);
    } else {
      size_t bytes = (size_t)p.values[t].numel * elem_bytes(s.nodes[v].dtype);
      CUDA_CHECK(cudaMalloc(&args.ptrs[v], bytes + 16));
      CUDA_CHECK(cudaMemset(args.ptrs[v], 0xFF, bytes));
    }
  }
  int rc = 0;
  for (int rep = 0; rep < 2 && rc == 0; rep++) {
    rc = p.fn(&args);
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaGetLastError());
  }
  if (rc != 0) {
    report(false, "%-36s: launcher returned %d", label, rc);
  } else {
    if (L.d_tensor >= 0) {
      double e = rel_err(download(args.d, d_elems, s.d_dtype), p.values[L.d_tensor]);
      report(e <= 1e-2, "%-36s M=%lld N=%lld K=%lld: D (%%%s) rel err %.3e", label, (long long)L.m, (long long)L.n,
             (long long)L.k, p.g->nodes[L.d_tensor].name, e);
    }
    for (int v = 0; v < s.nnodes; v++) {
      int t = L.vtensor[v];
      if (t < 0 || evt_vop_class(s.nodes[v].op) != 'S') continue;
      double e = rel_err(download(args.ptrs[v], (size_t)p.values[t].numel, s.nodes[v].dtype), p.values[t]);
      report(e <= 1e-2, "%-36s: %s (%s, %%%s) rel err %.3e", label, s.nodes[v].name, evt_vop_name(s.nodes[v].op),
             p.g->nodes[t].name, e);
    }
  }
  cudaFree((void *)args.a);
  cudaFree((void *)args.b);
  cudaFree(args.d);
  for (int v = 0; v < s.nnodes; v++) cudaFree(args.ptrs[v]);
}

// Emits and JIT-compiles every prepared case's kernel in one batch, then loads each launcher.
static void load(std::vector<Prepared *> &ps) {
  std::vector<evt_jit_job> jobs(ps.size());
  std::vector<char *> srcs(ps.size(), nullptr);
  for (size_t i = 0; i < ps.size(); i++) {
    char err[512];
    srcs[i] = evt_emit_cutlass(&ps[i]->L->spec, err, sizeof err);
    memset(&jobs[i], 0, sizeof jobs[i]);
    jobs[i].name = ps[i]->L->kernel;
    jobs[i].source = srcs[i] ? srcs[i] : "";
    if (!srcs[i]) report(false, "%-36s: emit: %s", ps[i]->c->label, err);
  }
  char msg[2048];
  if (evt_jit_compile(jobs.data(), (int)jobs.size(), nullptr, msg, sizeof msg) != EVT_OK) fprintf(stderr, "JIT: %s\n", msg);
  for (size_t i = 0; i < ps.size(); i++) {
    void *h = srcs[i] && jobs[i].ok ? dlopen(jobs[i].so_path, RTLD_NOW | RTLD_LOCAL) : nullptr;
    ps[i]->fn = h ? (evt_launch_fn)dlsym(h, ps[i]->L->kernel) : nullptr;
    if (srcs[i] && !ps[i]->fn)
      report(false, "%-36s: not compiled or loaded (%s)", ps[i]->c->label, jobs[i].ok ? dlerror() : jobs[i].error);
    free(srcs[i]);
  }
}

int main() {
  const char *only = getenv("CHECK_CONV_ONLY");
  std::vector<Prepared> all(sizeof kCases / sizeof kCases[0]);
  std::vector<Prepared *> ready;
  for (size_t i = 0; i < all.size(); i++) {
    if (only && !strstr(kCases[i].label, only)) continue;
    if (prepare(kCases[i], 1 + i, &all[i])) ready.push_back(&all[i]);
  }
  load(ready);
  for (Prepared *p : ready)
    if (p->fn) check(*p);
  for (Prepared &p : all) {
    if (!p.g) continue;
    for (int v = 0; p.values && v < p.g->nnodes; v++) evt_tensor_free(&p.values[v]);
    free(p.values);
    evt_lower_free(&p.low);
    evt_part_plan_free(&p.part);
    evt_graph_free(p.g);
  }
  return report_summary();
}
