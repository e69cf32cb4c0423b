/* Epilogue visitor nodes written by the project (CUTLASS Sm90 visitor protocol, ../shared/notes/cutlass-evt.md),
 * for what CUTLASS's own nodes do slowly. Included by generated GEMM kernels (src/codegen/emit_cutlass.c).
 *
 * RowSum<CtaTile, CheckRows>: Σ over M of its input, per column: an N-vector of f32 added atomically into `ptr`
 * (zeroed by initialize_workspace: Gemm::initialize, or a conv launcher, whose kernel's initialize does not reach it).
 * It replaces Sm90RowReduction with atomics for unbatched kernels because that node, in a ping-pong kernel, keeps its
 * per-thread sums and its tensors in local memory (a stack frame of hundreds of bytes, -Xptxas -v). Here every
 * register index is static:
 *   visit   adds the input to this thread's sum of each of its columns (a register tensor with stride 0 over M,
 *           indexed like the visit fragment); rows past M are skipped only in a tile that has some and only
 *           when CheckRows (the emitter clears it when the input is exactly 0 there: zero_out_of_bounds);
 *   reduce  after the tile's last subtile: a reduce-scatter over the lanes that hold the same columns of a
 *           GMMA accumulator (lane ^ 16, ^ 8, ^ 4: ncols/2 + ncols/4 + ncols/8 shuffles), then each lane adds
 *           its ncols/8 fully reduced columns with red.global.add (two adjacent columns as one .v2 operation
 *           where their address is 8-byte aligned; `ptr` needs only 4-byte alignment), columns past N skipped.
 *           The lane pattern is checked once per tile (a trap, not a wrong sum, if a copy layout breaks it).
 * Sums of different CTAs meet in atomics: the last bits of the result vary between runs (as with
 * Sm90RowReduction's atomic mode; the deterministic workspace mode keeps CUTLASS's node).
 *
 * Philox<Element>: a leaf that draws rand(seed, offset) in the epilogue, what CUTLASS has no node for: element
 * (m, n) of the M x N output gets evt_philox_uniform(seed, offset, step, m·N + n) (kernels/philox.h: the
 * interpreter's numbers bit for bit), rounded to Element (the rand's dtype). `step` points at the run's RNG step
 * in device memory (a GPU program's, advanced after every run; NULL: step 0), read once per tile, after the
 * mainloop. Unbatched kernels only (the lowering keeps rand out of batched ones). No loads, no shared memory: a
 * dropout's mask costs no bytes.
 *
 * FlatM<Node>: an aux load / store or a column reduction of a convolution's epilogue, its host functions over the
 * flattened M (below). */
#pragma once

#include "cutlass/epilogue/fusion/sm90_visitor_tma_warpspecialized.hpp"
#include "philox.h"

namespace evt_nodes {
using namespace cute;
namespace fus = cutlass::epilogue::fusion;

// What both nodes share: no shared memory, no workspace, nothing for the producer warp to load (their work is in
// the consumer's store callbacks).
struct StoreSideNode {
  struct SharedStorage {};
  template <class ProblemShape, class Arguments>
  static size_t get_workspace_size(ProblemShape const &, Arguments const &) {
    return 0;
  }
  CUTLASS_DEVICE bool is_producer_load_needed() const { return false; }
  CUTLASS_DEVICE bool is_C_load_needed() const { return false; }
  template <class... Args>
  CUTLASS_DEVICE auto get_producer_load_callbacks(fus::ProducerLoadArgs<Args...> const &) {
    return fus::EmptyProducerLoadCallbacks{};
  }
};

template <class CtaTileShapeMNK, bool CheckRows>
struct RowSum : StoreSideNode {
  struct Arguments {
    void *ptr = nullptr;  // float[N]
  };
  struct Params {
    float *ptr = nullptr;
  };

  template <class ProblemShape>
  static constexpr Params to_underlying_arguments(ProblemShape const &, Arguments const &a, void *) {
    return {static_cast<float *>(a.ptr)};
  }
  template <class ProblemShape>
  static bool can_implement(ProblemShape const &, Arguments const &a) {
    return (reinterpret_cast<uintptr_t>(a.ptr) & 3) == 0;  // f32 elements (pairs at 8-byte addresses: .v2)
  }
  template <class ProblemShape>
  static cutlass::Status initialize_workspace(ProblemShape const &problem, Arguments const &a, void *, cudaStream_t stream,
                                              cutlass::CudaHostAdapter * = nullptr) {
    if (!a.ptr) return cutlass::Status::kSuccess;
    auto mnkl = append<4>(problem, 1);
    size_t n = size_t(get<1>(mnkl)) * size_t(get<3>(mnkl));
    return cudaMemsetAsync(a.ptr, 0, n * sizeof(float), stream) == cudaSuccess ? cutlass::Status::kSuccess
                                                                                 : cutlass::Status::kErrorInternal;
  }

  CUTLASS_HOST_DEVICE RowSum() {}
  CUTLASS_HOST_DEVICE RowSum(Params const &p, SharedStorage const &) : params(p) {}
  Params params;


  // One reduce-scatter step over lanes lane ^ O: the lane with bit O set keeps the upper half of v[0, 2 Half)
  // (summed with its partner's), the other the lower half, both into v[0, Half). Returns the kept half's offset.
  template <int Half, int O, int NC>
  CUTLASS_DEVICE static int scatter_step(float (&v)[NC], int lane) {
    const bool up = (lane & O) != 0;
    CUTLASS_PRAGMA_UNROLL
    for (int j = 0; j < Half; ++j) {
      const float send = up ? v[j] : v[j + Half];
      const float keep = up ? v[j + Half] : v[j];
      v[j] = keep + __shfl_xor_sync(0xffffffffu, send, O);
    }
    return up ? Half : 0;
  }

  template <class RegSums, class Coords, class Residue>
  struct ConsumerStoreCallbacks : fus::EmptyConsumerStoreCallbacks {
    RegSums sums;     // (CPY,CPY_M,CPY_N,EPI_M,EPI_N) f32 registers, stride 0 over M: one per column of the thread
    Coords coords;    // same shape: (m, n) of each element, relative to the thread's first element
    Residue residue;  // (M, N) minus the thread's first element
    float *ptr;
    int n_total;      // N
    bool rows_in;     // every row of this tile is < M

    CUTLASS_DEVICE ConsumerStoreCallbacks(RegSums s, Coords c, Residue r, float *p, int n, bool in)
        : sums(s), coords(c), residue(r), ptr(p), n_total(n), rows_in(in) {}

    template <class ElementAccumulator, class ElementInput, int FragmentSize>
    CUTLASS_DEVICE auto visit(cutlass::Array<ElementAccumulator, FragmentSize> const &, int epi_v, int epi_m, int epi_n,
                              cutlass::Array<ElementInput, FragmentSize> const &in) {
      Tensor s = sums(_, _, _, epi_m, epi_n);
      if (CheckRows && !rows_in) {
        Tensor c = coords(_, _, _, epi_m, epi_n);
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < FragmentSize; ++i)
          if (get<0>(c(epi_v * FragmentSize + i)) < get<0>(residue)) s(epi_v * FragmentSize + i) += float(in[i]);
      } else {
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < FragmentSize; ++i) s(epi_v * FragmentSize + i) += float(in[i]);
      }
      return in;
    }

    template <class STensor, class SyncFn, class VTensor>
    CUTLASS_DEVICE void reduce(STensor &&, SyncFn const &, int, int, bool is_last_iteration, VTensor) {
      if (!is_last_iteration || ptr == nullptr) return;
      Tensor s = filter_zeros(sums);                                         // each column once
      Tensor c = make_tensor(coords.data(), make_layout(s.shape(), coords.stride()));  // its coordinates
      constexpr int NC = decltype(size(s))::value;
      static_assert(NC % 16 == 0, "RowSum: a thread's columns must split 8 ways into pairs");
      float v[NC];
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < NC; ++j) v[j] = s(j);
      const int lane = threadIdx.x & 31;
      // the lanes lane ^ 4, ^ 8, ^ 16 must hold the same columns (GMMA accumulator layout); else stop loudly
      const int col_first = n_total - get<1>(residue);  // global column of the thread's first element
      const int col0 = col_first + get<1>(c(0));
      if (__shfl_xor_sync(0xffffffffu, col0, 4) != col0 || __shfl_xor_sync(0xffffffffu, col0, 8) != col0 ||
          __shfl_xor_sync(0xffffffffu, col0, 16) != col0)
        __trap();
      // reduce-scatter (steps with compile-time extents: a runtime-bounded loop would put v in local memory)
      int base = scatter_step<NC / 2, 16>(v, lane);  // (in this order: one statement each)
      base += scatter_step<NC / 4, 8>(v, lane);
      base += scatter_step<NC / 8, 4>(v, lane);
      // lane holds columns base .. base + NC/8 - 1 (indices into s / c), summed over the warp's rows
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < NC / 8; j += 2) {
        const int c0 = col_first + get<1>(c(base + j)), c1 = col_first + get<1>(c(base + j + 1));
        // a pair as one .v2 reduction where its address is 8-byte aligned (ptr may be only 4-byte aligned: a
        // view into a flat gradient buffer), else two scalar ones
        if (c1 == c0 + 1 && (reinterpret_cast<uintptr_t>(ptr + c0) & 7) == 0 && c1 < n_total) {
          atomicAdd(reinterpret_cast<float2 *>(ptr + c0), make_float2(v[j], v[j + 1]));
        } else {
          if (c0 < n_total) atomicAdd(ptr + c0, v[j]);
          if (c1 < n_total) atomicAdd(ptr + c1, v[j + 1]);
        }
      }
    }
  };

  template <bool ReferenceSrc, class... Args>
  CUTLASS_DEVICE auto get_consumer_store_callbacks(fus::ConsumerStoreArgs<Args...> const &args) {
    auto [M, N, K, L] = args.problem_shape_mnkl;
    auto [m, n, k, l] = args.tile_coord_mnkl;
    // a (CTA_M, CTA_N) tile with stride 0 over M, partitioned like the visit fragments: registers per column
    Tensor g = make_tensor(make_gmem_ptr(static_cast<float *>(nullptr)),
                           make_layout(take<0, 2>(args.tile_shape_mnk), Stride<_0, _1>{}));
    Tensor tCg = fus::sm90_partition_for_epilogue<ReferenceSrc>(g, args.epi_tile, args.tiled_copy, args.thread_idx);
    Tensor sums = make_tensor_like<float>(tCg);
    fill(sums, 0.f);
    const bool rows_in = (int(m) + 1) * int(size<0>(args.tile_shape_mnk)) <= int(M);
    return ConsumerStoreCallbacks<decltype(sums), decltype(args.tCcD), decltype(args.residue_tCcD)>(
        sums, args.tCcD, args.residue_tCcD, params.ptr, int(N), rows_in);
  }
};

template <class Element>
struct Philox : StoreSideNode {
  struct Arguments {
    const unsigned long long *step = nullptr;  // the run's RNG step (device memory); NULL: 0
    unsigned long long seed = 0, offset = 0;
  };
  using Params = Arguments;

  template <class ProblemShape>
  static constexpr Params to_underlying_arguments(ProblemShape const &, Arguments const &a, void *) {
    return a;
  }
  template <class ProblemShape>
  static bool can_implement(ProblemShape const &problem, Arguments const &) {
    return get<3>(append<4>(problem, 1)) == 1;  // (element index m·N + n: one batch)
  }
  template <class ProblemShape>
  static cutlass::Status initialize_workspace(ProblemShape const &, Arguments const &, void *, cudaStream_t,
                                              cutlass::CudaHostAdapter * = nullptr) {
    return cutlass::Status::kSuccess;
  }

  CUTLASS_HOST_DEVICE Philox() {}
  CUTLASS_HOST_DEVICE Philox(Params const &p, SharedStorage const &) : params(p) {}
  Params params;


  template <class Coords>
  struct ConsumerStoreCallbacks : fus::EmptyConsumerStoreCallbacks {
    Coords coords;                   // (m, n) of each element relative to the thread's first, as the visit fragments
    unsigned long long first;        // counter of the thread's first element: offset + m0·N + n0
    unsigned long long n_total;      // N
    unsigned long long seed, step;

    CUTLASS_DEVICE ConsumerStoreCallbacks(Coords c, unsigned long long f, unsigned long long n, unsigned long long s,
                                          unsigned long long st)
        : coords(c), first(f), n_total(n), seed(s), step(st) {}

    template <class ElementAccumulator, int FragmentSize>
    CUTLASS_DEVICE auto visit(cutlass::Array<ElementAccumulator, FragmentSize> const &, int epi_v, int epi_m, int epi_n) {
      Tensor c = coords(_, _, _, epi_m, epi_n);
      cutlass::Array<float, FragmentSize> out;
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < FragmentSize; ++i) {
        auto mn = c(epi_v * FragmentSize + i);
        const unsigned long long e = first + (unsigned long long)get<0>(mn) * n_total + (unsigned long long)get<1>(mn);
        // (evt_philox_uniform with offset + i folded into e; rounded to the rand's dtype as the interpreter stores it)
        out[i] = float(Element(evt_philox_uniform(seed, 0, step, e)));
      }
      return out;
    }
  };

  template <bool ReferenceSrc, class... Args>
  CUTLASS_DEVICE auto get_consumer_store_callbacks(fus::ConsumerStoreArgs<Args...> const &args) {
    auto [M, N, K, L] = args.problem_shape_mnkl;
    const unsigned long long m0 = (unsigned long long)(int(M) - int(get<0>(args.residue_tCcD)));
    const unsigned long long n0 = (unsigned long long)(int(N) - int(get<1>(args.residue_tCcD)));
    const unsigned long long step = params.step ? *params.step : 0ull;
    return ConsumerStoreCallbacks<decltype(args.tCcD)>(args.tCcD, params.offset + m0 * (unsigned long long)int(N) + n0,
                                                       (unsigned long long)int(N), params.seed, step);
  }
};

// FlatM<Node>: CUTLASS's Sm90AuxLoad / Sm90AuxStore / Sm90ColReduction in a convolution's epilogue
// (src/codegen/emit_cutlass_conv.c). The conv kernel hands its epilogue nodes' host functions a problem shape whose M
// is the output's modes (Q, P, N) and whose L is static; an aux tile of the NHWC output is the dense row-major
// [N*P*Q, O] matrix and a column sum / max is an [N*P*Q] vector, so the node's host functions see the GEMM's shape (M
// flattened to N*P*Q; every mode a dynamic int, as the TMA type an aux node's Params declares). Its callbacks see the
// flattened M already (the kernel's linearized shape).
template <class Node>
struct FlatM : Node {
  using Node::Node;
  template <class ProblemShape>
  static constexpr auto flat(ProblemShape const &problem) {
    auto mnkl = append<4>(problem, 1);
    return make_shape(int(size(get<0>(mnkl))), int(size(get<1>(mnkl))), int(size(get<2>(mnkl))), int(size(get<3>(mnkl))));
  }
  template <class ProblemShape>
  static constexpr typename Node::Params to_underlying_arguments(ProblemShape const &problem,
                                                                 typename Node::Arguments const &args, void *workspace) {
    return Node::to_underlying_arguments(flat(problem), args, workspace);
  }
  template <class ProblemShape>
  static bool can_implement(ProblemShape const &problem, typename Node::Arguments const &args) {
    return Node::can_implement(flat(problem), args);
  }
  template <class ProblemShape>
  static size_t get_workspace_size(ProblemShape const &problem, typename Node::Arguments const &args) {
    return Node::get_workspace_size(flat(problem), args);
  }
  template <class ProblemShape>
  static cutlass::Status initialize_workspace(ProblemShape const &problem, typename Node::Arguments const &args,
                                              void *workspace, cudaStream_t stream,
                                              cutlass::CudaHostAdapter *adapter = nullptr) {
    return Node::initialize_workspace(flat(problem), args, workspace, stream, adapter);
  }
};

}  // namespace evt_nodes
