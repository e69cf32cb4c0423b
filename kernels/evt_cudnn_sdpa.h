/* Scaled-dot-product attention, forward and backward, through cuDNN's fused flash-attention engines,
 * driven by the cuDNN v9 backend (graph) C API (cudnnBackendCreateDescriptor / SetAttribute / Finalize /
 * Execute). Part of build/libevt_fallback.so (kernels/fallback/cudnn_sdpa.cu); plain C, no CUDA header needed.
 *
 * Semantics (those of the CPU interpreter, src/runtime/interp/gemm.c `sdpa`)
 *   q [B,H,Sq,D], k [B,H,Skv,D], v [B,H,Skv,Dv] -> out [B,H,Sq,Dv]
 *   out = softmax(q k^T * scale + mask) v; causal: key j > query i is masked (top-left aligned, also when
 *   Sq != Skv). stats [B,H,Sq,1] f32, packed = the row's log-sum-exp (natural log) of the scaled, masked
 *   scores: the forward writes it, the backward reads it.
 *   Backward: given dout [B,H,Sq,Dv] (and q, k, v, out, stats of the forward), writes dq, dk, dv: the exact
 *   gradients (flash-attention recomputation; dS = P * (dP - rowsum(dout * out)) * scale).
 *   Element type of q, k, v, out, dout, dq, dk, dv: bf16 or f16 (one for all); f32 accumulation inside.
 *
 * Layout: every tensor is 4 dims + 4 element strides. dout has out's strides, dq q's, dk k's, dv v's.
 *   The last stride must be 1, the others multiples of 8 elements (16 bytes), and every pointer 16-byte
 *   aligned. [B,S,H,D]-interleaved views are fine: q_stride = {S*H*D, D, H*D, 1}.
 *
 * Library: cuDNN is loaded at the first call with dlopen by soname, "libcudnn.so.9" then "libcudnn.so", from the
 *   loader's search path (in a PyTorch process the library is already loaded, so the soname resolves).
 *   libevt_fallback.so has no link-time dependency on cuDNN. Built without the cuDNN headers
 *   (EVT_HAVE_CUDNN undefined), every entry fails with "built without cuDNN headers".
 *
 * Plans: per distinct descriptor (all fields except scale) and device, one forward graph (with the stats
 *   output) and one backward graph, each with its engine's execution plan and its own device workspace,
 *   allocated once and kept until evt_cudnn_sdpa_release(). evt_cudnn_sdpa_supported() builds both and
 *   allocates, so call it before a CUDA-graph capture: inside a capture, a call whose plans are not built
 *   fails ("not prepared") instead of allocating. After that, fwd / bwd enqueue on the given stream and
 *   allocate nothing, synchronize nothing, copy nothing to the host: graph-capturable.
 *   Thread-safe (one mutex). Calls with the same descriptor share one workspace: the caller orders them
 *   (one stream, or events) when they run on different streams.
 *
 * Errors: every entry returns 0 on success (supported(): 1), else writes a message into err / why: the
 *   step that failed (which descriptor, which attribute), cudnnGetErrorString and cudnnGetLastErrorString,
 *   or the reason the shape is not supported (no library, cuDNN < 9, D or Dv not a multiple of 8 or > 256
 *   (> 128 before Hopper), strides, no engine for the graph, ...). */
#ifndef EVT_CUDNN_SDPA_H
#define EVT_CUDNN_SDPA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum { EVT_CUDNN_SDPA_BF16 = 0, EVT_CUDNN_SDPA_F16 = 1 };

typedef struct evt_cudnn_sdpa_desc {
  int64_t b, h, sq, skv, d, dv;
  int dtype;  /* EVT_CUDNN_SDPA_BF16 or EVT_CUDNN_SDPA_F16 */
  int causal; /* != 0: key j > query i masked */
  float scale; /* softmax scale; 0 means 1/sqrt(d) */
  /* element strides of q [b,h,sq,d], k [b,h,skv,d], v [b,h,skv,dv], out [b,h,sq,dv] (dq/dk/dv/dout alike) */
  int64_t q_stride[4], k_stride[4], v_stride[4], o_stride[4];
} evt_cudnn_sdpa_desc;

/* Fills the four stride arrays for packed [B,H,S,D] tensors (bshd == 0) or [B,S,H,D] ones (bshd != 0). */
void evt_cudnn_sdpa_set_strides(evt_cudnn_sdpa_desc *d, int bshd);

/* Loads cuDNN (once) and says which: writes "cuDNN 9.x.y (path)" or the reason it failed; returns the
 * cudnnGetVersion() number (e.g. 91900) or 0. Needs no GPU. */
long evt_cudnn_sdpa_library(char *info, size_t n);

/* 1: the forward and the backward of d run on the current device (both plans are built and their
 * workspaces allocated now); 0 and the reason in why. Results are cached, failures too. */
int evt_cudnn_sdpa_supported(const evt_cudnn_sdpa_desc *d, char *why, size_t n);

/* Forward (training): out and stats from q, k, v. stream: a cudaStream_t (NULL: legacy default stream). */
int evt_cudnn_sdpa_fwd(void *stream, const evt_cudnn_sdpa_desc *d, const void *q, const void *k, const void *v,
                       void *out, float *stats, char *err, size_t n);

/* Backward: dq, dk, dv from q, k, v, out, stats (of the forward) and dout. dq/dk/dv are overwritten. */
int evt_cudnn_sdpa_bwd(void *stream, const evt_cudnn_sdpa_desc *d, const void *q, const void *k, const void *v,
                       const void *out, const float *stats, const void *dout, void *dq, void *dk, void *dv,
                       char *err, size_t n);

/* One line on d's plans: graph variant, engine index and workspace bytes of forward and backward (after a
 * successful supported()); 0, or -1 if there are none. */
int evt_cudnn_sdpa_plan_info(const evt_cudnn_sdpa_desc *d, char *info, size_t n);

/* Frees every plan, workspace and cuDNN handle (the library stays loaded). Not while a call runs. */
void evt_cudnn_sdpa_release(void);

#ifdef __cplusplus
}
#endif

#endif
