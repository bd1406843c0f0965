"""Two one-warp CUDA C pop loops (NVRTC, torch.cuda._compile_kernel) against the Triton build (H200, 2026-12-03).

The serial build's loop written straight in CUDA, a 5-step shuffle reduction of (score, key) a pop:
`build_loop`, the frontier in shared memory (slot q in lane q % 32), each lane's best cached in registers and
only the popped slot's lane rescanning its slots; `build_loop_regs`, the frontier in registers (R = NB / 32
slots a lane, unrolled), every lane's best again by a pairwise tree over its registers. It checks their
selections against tree_build.reference.select_prefixes, then times the loops alone (no layout) and the Triton
build (with its layout) in CUDA graphs. Kept as the measurement behind the README's line. Run: python benchmarks/results/build_cuda_one_warp_20261203.py OUTDIR
"""
import json, os, sys
import torch
sys.path.insert(0, "engine_patches/ddtree_engine/src")
from ddtree_engine.kernels.tree_build import kernel as tk, reference as tr
import triton

# Both loops' key layout (INT64_KEYS) and pop order (_before).
PRELUDE = r'''
#define SD 44
#define SR 32
#define SC 12
#define KNONE 0x7fffffffffffffffLL
#define INFINITY __longlong_as_double(0x7ff0000000000000LL)
typedef long long i64;
__device__ __forceinline__ bool before(double s1, i64 k1, double s2, i64 k2) {
  return (s1 > s2) || ((s1 == s2) && (k1 < k2));
}
'''

SRC = PRELUDE + r'''extern "C" __global__ void build_loop(const double* __restrict__ vals_g, int L, int K, int spine, int budget, int NB,
                                      int* ws, double* ws_score, int* n_out) {
  extern __shared__ double smem[];
  double* vals = smem;               // L*K
  double* fs = vals + L * K;         // NB
  double* fp = fs + NB;              // NB
  i64* fk = (i64*)(fp + NB);         // NB
  const int lane = threadIdx.x;
  for (int i = lane; i < L * K; i += 32) vals[i] = vals_g[i];
  for (int i = lane; i < NB; i += 32) { fs[i] = -INFINITY; fp[i] = 0.0; fk[i] = KNONE; }
  __syncwarp();
  if (lane == 0) { fs[0] = vals[0]; fk[0] = 0; }
  __syncwarp();
  double bs = lane == 0 ? vals[0] : -INFINITY;
  i64 bk = lane == 0 ? 0 : KNONE;
  i64 counter = 1;
  int c = 0;
  double spine_score = 0.0;
  for (int it = 0; it < budget; ++it) {
    double s; i64 k; double ps;
    if (it < spine) {
      s = spine_score + vals[it * K]; k = ((i64)it << SD) | it; ps = spine_score; spine_score = s;
    } else {
      s = bs; k = bk;
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) {
        double os = __shfl_xor_sync(0xffffffffu, s, off);
        i64 ok = __shfl_xor_sync(0xffffffffu, k, off);
        if (before(os, ok, s, k)) { s = os; k = ok; }
      }
      if (k == KNONE) break;
      ps = fp[(int)(k & ((1 << SC) - 1))];
    }
    int d = (int)(k >> SD), r = (int)((k >> SR) & ((1 << (SD - SR)) - 1)), q = (int)(k & ((1 << SC) - 1));
    if (lane == 0) { ws[c] = q - 1; ws[NB + c] = d; ws[2 * NB + c] = r; ws_score[c] = s; }
    bool has_sib = r + 1 < K;
    double sib_s = has_sib ? ps + vals[d * K + r + 1] : -INFINITY;
    i64 sib_k = has_sib ? (((i64)d << SD) | ((i64)(r + 1) << SR) | (counter << SC) | q) : KNONE;
    counter += has_sib;
    bool has_child = d + 1 < L;
    double ch_s = has_child ? s + vals[(d + 1) * K] : -INFINITY;
    i64 ch_k = has_child ? (((i64)(d + 1) << SD) | (counter << SC) | (c + 1)) : KNONE;
    counter += has_child;
    int qc = c + 1;
    if (lane == (q & 31)) { fs[q] = sib_s; fk[q] = sib_k; }
    if (has_child && lane == (qc & 31)) { fs[qc] = ch_s; fp[qc] = s; fk[qc] = ch_k; }
    if (lane == (q & 31)) {
      bs = -INFINITY; bk = KNONE;
      for (int i = lane; i < NB; i += 32) { double v = fs[i]; i64 kk = fk[i]; if (before(v, kk, bs, bk)) { bs = v; bk = kk; } }
    } else if (has_child && lane == (qc & 31)) {
      if (before(ch_s, ch_k, bs, bk)) { bs = ch_s; bk = ch_k; }
    }
    __syncwarp();
    ++c;
  }
  if (lane == 0) n_out[0] = c;
}
'''

TUNED = PRELUDE + r"""extern "C" __global__ void build_loop_regs(const double* __restrict__ vals_g, int L, int K, int spine, int budget,
                                           int NB, int* ws, double* ws_score, int* n_out) {
  extern __shared__ double vals[];
  const int lane = threadIdx.x;
  for (int i = lane; i < L * K; i += 32) vals[i] = vals_g[i];
  __syncwarp();
  double fs[R], fp[R]; i64 fk[R];
#pragma unroll
  for (int j = 0; j < R; ++j) { fs[j] = -INFINITY; fp[j] = 0.0; fk[j] = KNONE; }
  if (lane == 0) { fs[0] = vals[0]; fk[0] = 0; }
  double bs = fs[0], bp = fp[0]; i64 bk = fk[0];
  i64 counter = 1;
  int c = 0;
  double spine_score = 0.0;
  for (int it = 0; it < budget; ++it) {
    double s, ps; i64 k;
    if (it < spine) {
      s = spine_score + vals[it * K]; k = ((i64)it << SD) | it; ps = spine_score; spine_score = s;
    } else {
      s = bs; k = bk;
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) {
        double os = __shfl_xor_sync(0xffffffffu, s, off);
        i64 ok = __shfl_xor_sync(0xffffffffu, k, off);
        if (before(os, ok, s, k)) { s = os; k = ok; }
      }
      if (k == KNONE) break;
      ps = __shfl_sync(0xffffffffu, bp, (int)(k & 31));
    }
    int d = (int)(k >> SD), r = (int)((k >> SR) & ((1 << (SD - SR)) - 1)), q = (int)(k & ((1 << SC) - 1));
    if (lane == 0) { ws[c] = q - 1; ws[NB + c] = d; ws[2 * NB + c] = r; ws_score[c] = s; }
    bool has_sib = r + 1 < K;
    double sib_s = has_sib ? ps + vals[d * K + r + 1] : -INFINITY;
    i64 sib_k = has_sib ? (((i64)d << SD) | ((i64)(r + 1) << SR) | (counter << SC) | q) : KNONE;
    counter += has_sib;
    bool has_child = d + 1 < L;
    double ch_s = has_child ? s + vals[(d + 1) * K] : -INFINITY;
    i64 ch_k = has_child ? (((i64)(d + 1) << SD) | (counter << SC) | (c + 1)) : KNONE;
    counter += has_child;
    int qc = c + 1;
    bool mine_q = lane == (q & 31), mine_c = has_child && lane == (qc & 31);
#pragma unroll
    for (int j = 0; j < R; ++j) {
      if (mine_q && j == (q >> 5)) { fs[j] = sib_s; fk[j] = sib_k; }
      if (mine_c && j == (qc >> 5)) { fs[j] = ch_s; fp[j] = s; fk[j] = ch_k; }
    }
    // Each lane's best again, a pairwise tree over its registers (every lane: no divergence).
    double ts[R], tp[R]; i64 tk[R];
#pragma unroll
    for (int j = 0; j < R; ++j) { ts[j] = fs[j]; tp[j] = fp[j]; tk[j] = fk[j]; }
#pragma unroll
    for (int w = 1; w < R; w <<= 1) {
#pragma unroll
      for (int j = 0; j + w < R; j += 2 * w) {
        if (before(ts[j + w], tk[j + w], ts[j], tk[j])) { ts[j] = ts[j + w]; tk[j] = tk[j + w]; tp[j] = tp[j + w]; }
      }
    }
    bs = ts[0]; bk = tk[0]; bp = tp[0];
    ++c;
  }
  if (lane == 0) n_out[0] = c;
}
"""

def main(out):
    dev = "cuda"
    kern = torch.cuda._compile_kernel(SRC, "build_loop")
    tuned = {}
    def tuned_kernel(nb):
        if nb not in tuned:
            tuned[nb] = torch.cuda._compile_kernel("#define R %d\n" % (nb // 32) + TUNED, "build_loop_regs")
        return tuned[nb]
    res = {"checks": [], "times": []}
    def run_cuda(vals, budget, spine, bufs=None, regs=False):
        L, K = vals.shape
        NB = triton.next_power_of_2(max(budget + 1, 32))
        if bufs is None:
            bufs = (torch.empty(3 * NB, dtype=torch.int32, device=dev), torch.empty(NB, dtype=torch.float64, device=dev),
                    torch.empty(1, dtype=torch.int32, device=dev))
        ws, wss, n = bufs
        if regs:
            tuned_kernel(NB)(grid=(1, 1, 1), block=(32, 1, 1), args=[vals, L, K, min(spine, L, budget), budget, NB, ws, wss, n],
                             shared_mem=8 * L * K)
            return NB, bufs
        smem = 8 * (L * K + 3 * NB)
        kern(grid=(1, 1, 1), block=(32, 1, 1), args=[vals, L, K, min(spine, L, budget), budget, NB, ws, wss, n], shared_mem=smem)
        return NB, bufs
    gen = torch.Generator().manual_seed(0)
    def make(L, K, kind):
        if kind == "random":
            x = torch.randn(L, 4096, generator=gen, dtype=torch.float64)
        elif kind == "peaked":
            x = torch.randn(L, 4096, generator=gen, dtype=torch.float64); x[:, 0] += 12
        elif kind == "ties":
            x = torch.randint(0, 3, (L, 4096), generator=gen).double()
        else:
            x = torch.randn(L, 4096, generator=gen, dtype=torch.float64) * 0.3
        lp = torch.log_softmax(x, -1)
        v, _ = lp.topk(K, dim=-1)
        return v.contiguous()
    bad = 0
    for kind in ("random", "peaked", "ties", "mild"):
        for (L, K, budget) in [(15, 8, 15), (15, 8, 22), (15, 8, 64), (15, 8, 256), (1, 8, 5), (15, 1, 15), (3, 4, 63), (15, 8, 1), (16, 16, 1000)]:
            for spine in (0, 3):
                vals = make(L, K, kind)
                want = tr.select_prefixes(vals.tolist(), budget, spine)
                for regs in (False, True):
                    NB, (ws, wss, n) = run_cuda(vals.to(dev), budget, spine, regs=regs)
                    torch.cuda.synchronize()
                    nn = int(n.item()); w = ws.cpu(); sc = wss.cpu()
                    got = [(int(w[NB + i]), int(w[2 * NB + i]), int(w[i]), float(sc[i])) for i in range(nn)]
                    ok = got == want
                    bad += not ok
                    if not ok:
                        res["checks"].append(dict(regs=regs, kind=kind, L=L, K=K, budget=budget, spine=spine, n=nn, nwant=len(want),
                                                  first_diff=next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)))
    res["bad"] = bad
    print("mismatches", bad, res["checks"][:5], flush=True)
    from triton.testing import do_bench_cudagraph
    for kind in ("random", "peaked"):
        for budget in (15, 64, 256):
            vals = make(15, 8, kind).to(dev)
            ids = torch.arange(120, device=dev).reshape(15, 8)
            root = torch.zeros(1, dtype=torch.int64, device=dev)
            NB, bufs = run_cuda(vals, budget, 0)
            t_cuda = do_bench_cudagraph(lambda: run_cuda(vals, budget, 0, bufs), rep=200)
            t_regs = do_bench_cudagraph(lambda: run_cuda(vals, budget, 0, bufs, regs=True), rep=200)
            outb = tk.build_tree_arrays(vals, ids, budget, root)
            t_tri = do_bench_cudagraph(lambda: tk.build_tree_arrays(vals, ids, budget, root, out=outb), rep=200)
            row = dict(kind=kind, budget=budget, cuda_loop_us=t_cuda * 1e3, cuda_regs_loop_us=t_regs * 1e3, triton_build_us=t_tri * 1e3)
            res["times"].append(row); print(row, flush=True)
    json.dump(res, open(os.path.join(out, "cuda_build.json"), "w"), indent=1)

if __name__ == "__main__":
    main(sys.argv[1])
