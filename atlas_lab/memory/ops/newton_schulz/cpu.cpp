// Newton–Schulz iterations on many small matrices for the CPU (float32 and float64), with the normalisation and the
// transpose of ``reference.newton_schulz`` inside.
//
// For each G [r, c] of a batch: X_0 = X / d with X = G (Gᵀ when r > c, so that X is [m, n], m ≤ n) and d = ‖G‖_F + eps
// (computed by the caller), then k times:   A = X Xᵀ,  B = b A + c A²,  X ← a X + B X;  the result in G's layout.
// Backward (recomputation): the iterates are recomputed, then for j = k−1 … 0, with G = ∂L/∂X_{j+1}:
//   dB = G X_jᵀ,  E = dB + dBᵀ,  ∂A + ∂Aᵀ = b E + c (E A + A E),  ∂L/∂X_j = a G + B G + (∂A + ∂Aᵀ) X_j
// (A and B are symmetric; A E is (E A)ᵀ, the same sums in the same order, taken once); then through X_0 = X / d the element-wise terms of autograd's division backward,
// ∂L/∂X_0 / d and t = −∂L/∂X_0 · ((X / d) / d) (whose sum over a matrix is ∂L/∂d), and ``finish`` adds the norm's
// term ∂L/∂d · (X / ‖G‖_F), 0 where ‖G‖_F = 0: each element-wise step is the single IEEE operation autograd takes,
// in its order, so values and gradients equal those of the same normalisation written in PyTorch bit for bit.
// The PyTorch version of the iterations is ``_NSIterations`` in reference.py; both are tested against autograd through
// the literal iteration.
//
// Matrices in lanes: a group of W matrices of the batch (W = 8 float32 or 4 float64: one 32-byte vector) is stored
// entry by entry, each entry a vector of the W matrices' values (lane l: matrix l of the group), so every product is
// a product of small matrices whose entries are vectors: no padding, no transposes, register blocks of 4 × 4 entries
// (16 accumulators, 8 loads for 16 fused multiply-adds), and the symmetric products (X Xᵀ, A²) taken on and above
// the diagonal only. Every entry is a sum over p in order, one fused multiply-add a term, as in the row-major kernel
// this replaced, whose values it gives bit for bit but where m ≡ 1 (mod 4): there that kernel's single-row blocks
// rounded the last row of A = X Xᵀ apart from its last column (A not exactly symmetric), a difference of a few units in
// the last place after k steps. 32-byte vectors: a group's iterates stay within the first-level cache (64-byte ones
// doubled the group and ran no faster).
#include <ATen/ATen.h>
#include <torch/python.h>  // pybind11 and its Tensor casters; not torch/extension.h, which takes 1.6x as long to compile
#include <ATen/Parallel.h>

#include <algorithm>
#include <vector>

namespace {

constexpr int kLaneBytes = 32;
template <typename T> struct LaneVec { typedef T type __attribute__((vector_size(kLaneBytes))); };
template <typename T> constexpr int kLanes = kLaneBytes / sizeof(T);
template <typename T> using V = typename LaneVec<T>::type;

// C[i][j] for i in [i0, i0 + RB), j in [j0, j0 + CB): Σ_{p<K} L[i·li + p·lp] · R[p·rp + j·rj], then
// C = alpha · acc (ACC false) or C = alpha · acc + C (ACC true); C[i·ci + j].
template <typename T, bool ACC, int RB, int CB>
inline void lane_block(const V<T>* __restrict L, int li, int lp, const V<T>* __restrict R, int rp, int rj,
                       V<T>* __restrict C, int ci, int i0, int j0, int K, T alpha) {
  V<T> acc[RB][CB];
  for (int r = 0; r < RB; ++r)
    for (int c = 0; c < CB; ++c) acc[r][c] = V<T>{};
  for (int p = 0; p < K; ++p) {
    V<T> l[RB], x[CB];
    for (int r = 0; r < RB; ++r) l[r] = L[(i0 + r) * li + p * lp];
    for (int c = 0; c < CB; ++c) x[c] = R[p * rp + (j0 + c) * rj];
    for (int r = 0; r < RB; ++r)
      for (int c = 0; c < CB; ++c) acc[r][c] += l[r] * x[c];
  }
  const bool scale = alpha != T(1);  // 1 · x is x: the multiplication only where it changes a value
  for (int r = 0; r < RB; ++r)
    for (int c = 0; c < CB; ++c) {
      V<T>* out = C + (i0 + r) * ci + j0 + c;
      V<T> o = scale ? alpha * acc[r][c] : acc[r][c];
      if (ACC) o += *out;
      *out = o;
    }
}

template <typename T, bool ACC, int RB>
inline void lane_rows(const V<T>* L, int li, int lp, const V<T>* R, int rp, int rj, V<T>* C, int ci, int i0, int j0,
                      int cols, int K, T alpha) {
  switch (cols) {
    case 4: lane_block<T, ACC, RB, 4>(L, li, lp, R, rp, rj, C, ci, i0, j0, K, alpha); break;
    case 3: lane_block<T, ACC, RB, 3>(L, li, lp, R, rp, rj, C, ci, i0, j0, K, alpha); break;
    case 2: lane_block<T, ACC, RB, 2>(L, li, lp, R, rp, rj, C, ci, i0, j0, K, alpha); break;
    default: lane_block<T, ACC, RB, 1>(L, li, lp, R, rp, rj, C, ci, i0, j0, K, alpha); break;
  }
}

// C [M, N] (row stride ci) = alpha · L R (ACC: + C), L(i, p) = L[i·li + p·lp], R(p, j) = R[p·rp + j·rj]. sym: L R is
// symmetric; only the blocks on and above the diagonal are computed, the others mirrored (the entries (i, j) and
// (j, i) of a product X Xᵀ or A A are the same sums in the same order).
template <typename T, bool ACC>
inline void lane_product(const V<T>* L, int li, int lp, const V<T>* R, int rp, int rj, V<T>* C, int ci, int M, int N,
                         int K, T alpha = T(1), bool sym = false) {
  for (int i0 = 0; i0 < M; i0 += 4) {
    const int rows = std::min(4, M - i0);
    for (int j0 = sym ? i0 : 0; j0 < N; j0 += 4) {
      const int cols = std::min(4, N - j0);
      switch (rows) {
        case 4: lane_rows<T, ACC, 4>(L, li, lp, R, rp, rj, C, ci, i0, j0, cols, K, alpha); break;
        case 3: lane_rows<T, ACC, 3>(L, li, lp, R, rp, rj, C, ci, i0, j0, cols, K, alpha); break;
        case 2: lane_rows<T, ACC, 2>(L, li, lp, R, rp, rj, C, ci, i0, j0, cols, K, alpha); break;
        default: lane_rows<T, ACC, 1>(L, li, lp, R, rp, rj, C, ci, i0, j0, cols, K, alpha); break;
      }
    }
  }
  if (sym)
    for (int i = 0; i < M; ++i)
      for (int j = 0; j < (i / 4) * 4; ++j) C[i * ci + j] = C[j * ci + i];
}

// One iteration on a group: A = X Xᵀ, B = b A + c A² (c ≠ 0) or b A, Xn = a X + B X (next: false leaves Xn out, as the
// backward's recomputation does for X_k, which it never reads). X, Xn [m, n]; A, B [m, m].
template <typename T>
inline void lane_iteration(int m, int n, const V<T>* X, V<T>* A, V<T>* B, V<T>* Xn, T a, T b, T c, bool next = true) {
  lane_product<T, false>(X, n, 1, X, 1, n, A, m, m, m, n, T(1), true);
  if (c != T(0)) {
    lane_product<T, false>(A, m, 1, A, m, 1, B, m, m, m, m, c, true);
    for (int i = 0; i < m * m; ++i) B[i] += b * A[i];
  } else {
    for (int i = 0; i < m * m; ++i) B[i] = b * A[i];
  }
  if (!next) return;
  for (int i = 0; i < m * n; ++i) Xn[i] = a * X[i];
  lane_product<T, true>(B, m, 1, X, n, 1, Xn, n, m, n, m);
}

// The kernel's view of the caller's G [M, r, c]: X [m, n] = G, or Gᵀ when r > c.
struct Shape {
  int m, n;
  bool t;
  explicit Shape(const at::Tensor& G)
      : m(G.size(1) > G.size(2) ? G.size(2) : G.size(1)), n(G.size(1) > G.size(2) ? G.size(1) : G.size(2)),
        t(G.size(1) > G.size(2)) {}
  int at(int i, int j) const { return t ? j * m + i : i * n + j; }  // X[i, j] in a caller's matrix
  int size() const { return m * n; }
};

// Lane l of X [m, n] (a group's buffer) from matrix src (the caller's layout); the zero matrix for a lane past the
// batch's end.
template <typename T>
inline void lane_load(const Shape& S, V<T>* X, int l, const T* src) {
  T* x = reinterpret_cast<T*>(X);
  constexpr int W = kLanes<T>;
  for (int i = 0; i < S.m; ++i)
    for (int j = 0; j < S.n; ++j) x[(i * S.n + j) * W + l] = src == nullptr ? T(0) : src[S.at(i, j)];
}

// The W × W block r[l][q] -> r[q][l] of W vectors (each its own inverse).
template <typename T>
inline void transpose_block(V<T>* r) {
  if constexpr (kLanes<T> == 8) {
    V<T> a[8], b[8];
    for (int k = 0; k < 4; ++k) {
      a[2 * k] = __builtin_shufflevector(r[2 * k], r[2 * k + 1], 0, 8, 1, 9, 2, 10, 3, 11);
      a[2 * k + 1] = __builtin_shufflevector(r[2 * k], r[2 * k + 1], 4, 12, 5, 13, 6, 14, 7, 15);
    }
    for (int h = 0; h < 2; ++h)
      for (int k = 0; k < 2; ++k) {  // rows 4h..4h+3, entries 4k..4k+3
        b[4 * h + 2 * k] = __builtin_shufflevector(a[4 * h + k], a[4 * h + 2 + k], 0, 1, 8, 9, 2, 3, 10, 11);
        b[4 * h + 2 * k + 1] = __builtin_shufflevector(a[4 * h + k], a[4 * h + 2 + k], 4, 5, 12, 13, 6, 7, 14, 15);
      }
    for (int q = 0; q < 4; ++q) {
      r[2 * q] = __builtin_shufflevector(b[q], b[4 + q], 0, 1, 2, 3, 8, 9, 10, 11);
      r[2 * q + 1] = __builtin_shufflevector(b[q], b[4 + q], 4, 5, 6, 7, 12, 13, 14, 15);
    }
  } else {
    static_assert(kLanes<T> == 4, "lanes: 8 float32 or 4 float64");
    const V<T> a0 = __builtin_shufflevector(r[0], r[1], 0, 4, 1, 5), a1 = __builtin_shufflevector(r[0], r[1], 2, 6, 3, 7);
    const V<T> a2 = __builtin_shufflevector(r[2], r[3], 0, 4, 1, 5), a3 = __builtin_shufflevector(r[2], r[3], 2, 6, 3, 7);
    r[0] = __builtin_shufflevector(a0, a2, 0, 1, 4, 5);
    r[1] = __builtin_shufflevector(a0, a2, 2, 3, 6, 7);
    r[2] = __builtin_shufflevector(a1, a3, 0, 1, 4, 5);
    r[3] = __builtin_shufflevector(a1, a3, 2, 3, 6, 7);
  }
}

// The kernel's entry of the caller's entry e: X[i, j] is at j·m + i in a transposed caller's matrix, else at i·n + j.
inline int kernel_entry(const Shape& S, int e) { return S.t ? (e % S.m) * S.n + e / S.m : e; }

// X (the group's buffer) from a whole group of W matrices at src (m·n entries each, the caller's layout): W entries
// of the W matrices at a time, loaded as rows and transposed into lanes (the rest entry by entry).
template <typename T>
inline void lane_gather(const Shape& S, V<T>* X, const T* src) {
  constexpr int W = kLanes<T>;
  const int mn = S.size();
  int e = 0;
  for (; e + W <= mn; e += W) {
    V<T> r[W];
    for (int l = 0; l < W; ++l) __builtin_memcpy(&r[l], src + l * mn + e, sizeof(V<T>));
    transpose_block<T>(r);
    for (int q = 0; q < W; ++q) X[kernel_entry(S, e + q)] = r[q];
  }
  for (; e < mn; ++e)
    for (int l = 0; l < W; ++l) X[kernel_entry(S, e)][l] = src[l * mn + e];
}

// The inverse of lane_gather: a whole group's W matrices from X to dst (caller's layout; kernel_order: the kernel's).
template <typename T>
inline void lane_scatter(const Shape& S, const V<T>* X, T* dst, bool kernel_order) {
  constexpr int W = kLanes<T>;
  const int mn = S.size();
  int e = 0;
  for (; e + W <= mn; e += W) {
    V<T> r[W];
    for (int q = 0; q < W; ++q) r[q] = X[kernel_order ? e + q : kernel_entry(S, e + q)];
    transpose_block<T>(r);
    for (int l = 0; l < W; ++l) __builtin_memcpy(dst + l * mn + e, &r[l], sizeof(V<T>));
  }
  for (; e < mn; ++e)
    for (int l = 0; l < W; ++l) dst[l * mn + e] = X[kernel_order ? e : kernel_entry(S, e)][l];
}

// A group of count ≤ W matrices from src into X (a lane past the batch's end: the zero matrix).
template <typename T>
inline void lane_read(const Shape& S, V<T>* X, const T* src, int64_t count) {
  constexpr int W = kLanes<T>;
  if (count == W) return lane_gather<T>(S, X, src);
  for (int l = 0; l < W; ++l) lane_load<T>(S, X, l, l < count ? src + l * S.size() : nullptr);
}

// A group of count ≤ W matrices from X to dst (caller's layout; kernel_order: the kernel's).
template <typename T>
inline void lane_write(const Shape& S, const V<T>* X, T* dst, int64_t count, bool kernel_order) {
  constexpr int W = kLanes<T>;
  if (count == W) return lane_scatter<T>(S, X, dst, kernel_order);
  const T* x = reinterpret_cast<const T*>(X);
  for (int l = 0; l < count; ++l)
    for (int e = 0; e < S.size(); ++e) dst[l * S.size() + e] = x[(kernel_order ? e : kernel_entry(S, e)) * W + l];
}

// The group's W matrices from the batch (from first, count of them) into X, each divided by its d (one vector division
// an entry; a lane past the batch's end: 0 / 1).
template <typename T>
inline void lane_load_scaled(const Shape& S, V<T>* X, const T* src, const T* d, int64_t first, int64_t count,
                             V<T>& dv) {
  constexpr int W = kLanes<T>;
  T* dl = reinterpret_cast<T*>(&dv);
  for (int l = 0; l < W; ++l) dl[l] = l < count ? d[first + l] : T(1);
  lane_read<T>(S, X, src + first * S.size(), count);
  for (int e = 0; e < S.size(); ++e) X[e] = X[e] / dv;
}

// Groups per parallel task: about 4K elements a task.
inline int64_t lane_grain(const Shape& S, int W) { return std::max<int64_t>(1, 4096 / (S.size() * W)); }

void check(const at::Tensor& G, const at::Tensor& d) {
  TORCH_CHECK(G.device().is_cpu() && G.dim() == 3 && G.is_contiguous(), "G must be a contiguous [M, r, c] CPU tensor");
  TORCH_CHECK(d.dim() == 1 && d.size(0) == G.size(0) && d.scalar_type() == G.scalar_type() && d.is_contiguous(),
              "the scales must be a contiguous [M] tensor of G's dtype");
}

}  // namespace

// NS_k(G / d) for G [M, r, c] (on Gᵀ where r > c), in G's layout.
at::Tensor ns_forward(at::Tensor G, at::Tensor d, int64_t k, double a, double b, double c) {
  check(G, d);
  auto out = at::empty_like(G);
  const int64_t M = G.size(0);
  const Shape S(G);
  AT_DISPATCH_FLOATING_TYPES(G.scalar_type(), "ns_forward", [&] {
    using T = scalar_t;
    constexpr int W = kLanes<T>;
    const T* x = G.data_ptr<T>();
    const T* dd = d.data_ptr<T>();
    T* o = out.data_ptr<T>();
    const int64_t groups = (M + W - 1) / W;
    at::parallel_for(0, groups, lane_grain(S, W), [&](int64_t begin, int64_t end) {
      std::vector<V<T>> buffer(2 * S.size() + 2 * S.m * S.m);
      V<T>* X1 = buffer.data();
      V<T>* X2 = X1 + S.size();
      V<T>* A = X2 + S.size();
      V<T>* B = A + S.m * S.m;
      for (int64_t gi = begin; gi < end; ++gi) {
        const int64_t first = gi * W, count = std::min<int64_t>(W, M - first);
        V<T> dv;
        lane_load_scaled<T>(S, X1, x, dd, first, count, dv);
        V<T>* cur = X1;
        V<T>* next = X2;
        for (int j = 0; j < k; ++j) {
          lane_iteration<T>(S.m, S.n, cur, A, B, next, a, b, c);
          std::swap(cur, next);
        }
        lane_write<T>(S, cur, o + first * S.size(), count, false);
      }
    });
  });
  return out;
}

// From G, d and ∂L/∂NS_k (G's layout): ∂L/∂X_0 / d in G's layout and −∂L/∂X_0 · ((X / d) / d) [M, m, n] in the
// kernel's (as autograd laid out the term it summed).
std::vector<at::Tensor> ns_backward(at::Tensor G, at::Tensor d, at::Tensor grad, int64_t k, double a, double b,
                                    double c) {
  check(G, d);
  TORCH_CHECK(grad.sizes() == G.sizes() && grad.scalar_type() == G.scalar_type() && grad.is_contiguous(),
              "grad must match G");
  const Shape S(G);
  const int64_t M = G.size(0);
  auto g1 = at::empty_like(G);
  auto td = at::empty({M, S.m, S.n}, G.options());
  AT_DISPATCH_FLOATING_TYPES(G.scalar_type(), "ns_backward", [&] {
    using T = scalar_t;
    constexpr int W = kLanes<T>;
    const T* x = G.data_ptr<T>();
    const T* dd = d.data_ptr<T>();
    const T* gr = grad.data_ptr<T>();
    T* o1 = g1.data_ptr<T>();
    T* o2 = td.data_ptr<T>();
    const int m = S.m, n = S.n, mm = S.m * S.m, mn = S.size();
    const int64_t groups = (M + W - 1) / W;
    at::parallel_for(0, groups, lane_grain(S, W), [&](int64_t begin, int64_t end) {
      const T ta = a, tb = b, tc = c;  // the lambda's own: kept in registers through the loops
      // X_0..X_k, A_j, B_j, then dB, E, S, two gradients and the division's second term
      std::vector<V<T>> buffer((k + 1) * mn + 2 * k * mm + 3 * mm + 3 * mn);
      V<T>* Xs = buffer.data();
      V<T>* As = Xs + (k + 1) * mn;
      V<T>* Bs = As + k * mm;
      V<T>* dB = Bs + k * mm;
      V<T>* E = dB + mm;
      V<T>* Sm = E + mm;
      V<T>* g = Sm + mm;
      V<T>* g_next = g + mn;
      for (int64_t gi = begin; gi < end; ++gi) {
        const int64_t first = gi * W, count = std::min<int64_t>(W, M - first);
        V<T> dv;
        lane_load_scaled<T>(S, Xs, x, dd, first, count, dv);
        lane_read<T>(S, g, gr + first * mn, count);
        for (int j = 0; j < k; ++j)  // X_0 … X_{k−1}, A_j and B_j (X_k is not read)
          lane_iteration<T>(m, n, Xs + j * mn, As + j * mm, Bs + j * mm, Xs + (j + 1) * mn, ta, tb, tc, j + 1 < k);
        for (int j = k - 1; j >= 0; --j) {
          const V<T>* Xj = Xs + j * mn;
          const V<T>* A = As + j * mm;
          const V<T>* B = Bs + j * mm;
          lane_product<T, false>(g, n, 1, Xj, 1, n, dB, m, m, m, n);
          for (int r = 0; r < m; ++r)
            for (int s = 0; s < m; ++s) {
              const V<T> e = dB[r * m + s] + dB[s * m + r];
              E[r * m + s] = e;
              Sm[r * m + s] = tb * e;
            }
          if (tc != T(0)) {  // E A, then A E = (E A)ᵀ (the same sums in the same order: A, E symmetric)
            lane_product<T, false>(E, m, 1, A, m, 1, dB, m, m, m, m);
            for (int r = 0; r < m; ++r)
              for (int s = 0; s < m; ++s) {  // + c (E A)[r, s], then + c (E A)[s, r]: two roundings, in this order
                V<T> o = tc * dB[r * m + s];
                o += Sm[r * m + s];
                V<T> p = tc * dB[s * m + r];
                p += o;
                Sm[r * m + s] = p;
              }
          }
          for (int t = 0; t < mn; ++t) g_next[t] = ta * g[t];
          lane_product<T, true>(B, m, 1, g, n, 1, g_next, n, m, n, m);
          lane_product<T, true>(Sm, m, 1, Xj, n, 1, g_next, n, m, n, m);
          std::swap(g, g_next);
        }
        // autograd's division backward: grad / d and −grad · ((X / d) / d), X / d being X_0, then each lane to its
        // matrix
        V<T>* q1 = g_next;
        V<T>* q2 = g_next + mn;
        for (int e = 0; e < mn; ++e) {
          q1[e] = g[e] / dv;
          q2[e] = -g[e] * (Xs[e] / dv);
        }
        lane_write<T>(S, q1, o1 + first * mn, count, false);
        lane_write<T>(S, q2, o2 + first * mn, count, true);
      }
    });
  });
  return {g1, td};
}

// ∂L/∂G in G's layout: g1 (G's layout) + ∂L/∂‖G‖ · (X / ‖G‖), the second term 0 where ‖G‖ = 0 (autograd's norm
// backward, then its sum of the two paths: a product, then an addition in a loop of its own, never fused into one).
at::Tensor ns_finish(at::Tensor G, at::Tensor norm, at::Tensor g1, at::Tensor grad_norm) {
  check(G, norm);
  auto out = at::empty_like(G);
  const int64_t M = G.size(0);
  AT_DISPATCH_FLOATING_TYPES(G.scalar_type(), "ns_finish", [&] {
    using T = scalar_t;
    const Shape L(G);
    const T* x = G.data_ptr<T>();
    const T* nn = norm.data_ptr<T>();
    const T* gn = grad_norm.data_ptr<T>();
    const T* h = g1.data_ptr<T>();
    T* o = out.data_ptr<T>();
    at::parallel_for(0, M, std::max<int64_t>(1, 4096 / L.size()), [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const int64_t base = i * L.m * L.n;
        const T ni = nn[i], gi = gn[i];
        for (int64_t e = 0; e < L.m * L.n; ++e) o[base + e] = gi * (ni == T(0) ? T(0) : x[base + e] / ni);
        for (int64_t e = 0; e < L.m * L.n; ++e) o[base + e] = h[base + e] + o[base + e];
      }
    });
  });
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) {
  module.def("forward", &ns_forward, "NS_k(G / d) for G [M, r, c], d [M]");
  module.def("backward", &ns_backward, "(dL/dX_0 / d in G's layout, -dL/dX_0 (X_0 / d) in the kernel's)");
  module.def("finish", &ns_finish, "dL/dG from g1 and dL/d|G|");
}
