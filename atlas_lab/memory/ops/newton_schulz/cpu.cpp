// Newton–Schulz iterations on many small matrices, fused per matrix, for the CPU (float32 and float64), with the
// normalisation and the transpose of ``reference.newton_schulz`` inside.
//
// For each G [r, c] of a batch: X_0 = X / d with X = G (Gᵀ when r > c, so that X is [m, n], m ≤ n) and d = ‖G‖_F + eps
// (computed by the caller), then k times:   A = X Xᵀ,  B = b A + c A²,  X ← a X + B X;  the result in G's layout.
// Backward (recomputation): the iterates are recomputed per matrix, then for j = k−1 … 0, with G = ∂L/∂X_{j+1}:
//   dB = G X_jᵀ,  E = dB + dBᵀ,  ∂A + ∂Aᵀ = b E + c (E A + A E),  ∂L/∂X_j = a G + B G + (∂A + ∂Aᵀ) X_j
// (A and B are symmetric); then through X_0 = X / d the element-wise terms of autograd's division backward,
// ∂L/∂X_0 / d and t = −∂L/∂X_0 · ((X / d) / d) (whose sum over a matrix is ∂L/∂d), and ``finish`` adds the norm's
// term ∂L/∂d · (X / ‖G‖_F), 0 where ‖G‖_F = 0: each element-wise step is the single IEEE operation autograd takes,
// in its order, so values and gradients equal those of the same normalisation written in PyTorch bit for bit.
// The PyTorch version of the iterations is ``_NSIterations`` in reference.py; both are tested against autograd through
// the literal iteration.
//
// Every matrix lives in a per-thread buffer whose rows are padded with zeros to a multiple of one vector; the
// padding stays zero through every product, and each product C = A B runs blocks of up to 4 rows × 2 vectors of C,
// so every vector of B that is loaded feeds up to 4 fused multiply-adds and 8 of them are in flight.
#include <ATen/ATen.h>
#include <torch/python.h>  // pybind11 and its Tensor casters; not torch/extension.h, which takes 1.6x as long to compile
#include <ATen/Parallel.h>

#include <algorithm>
#include <vector>

namespace {

// One vector is the machine's widest register: 64 bytes with AVX-512, else 32 (AVX2). A 64-byte vector type on an
// AVX2 machine is split by the compiler through the stack, which made the kernel 2x slower than batched matmuls.
#if defined(__AVX512F__)
constexpr int kBytes = 64;
#else
constexpr int kBytes = 32;
#endif
template <typename T> struct Vec { typedef T type __attribute__((vector_size(kBytes))); };
template <typename T> constexpr int kWidth = kBytes / sizeof(T);

template <typename T> inline typename Vec<T>::type vload(const T* p) {
  typename Vec<T>::type v;
  __builtin_memcpy(&v, p, kBytes);
  return v;
}
template <typename T> inline void vstore(T* p, typename Vec<T>::type v) { __builtin_memcpy(p, &v, kBytes); }

inline int padded(int x, int w) { return (x + w - 1) / w * w; }

// C[R, j0 : j0 + NV·w] (= or +=) alpha · A[R, K] @ B[K, j0 : j0 + NV·w], row strides lda and ld: R·NV independent
// accumulators, so that consecutive fused multiply-adds do not wait on each other.
template <typename T, bool ACC, int R, int NV>
inline void product_block(const T* __restrict A, int lda, const T* __restrict B, T* __restrict C, int ld, int K,
                          T alpha, int j0) {
  using V = typename Vec<T>::type;
  V acc[R][NV];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) acc[r][v] = V{};
  for (int p = 0; p < K; ++p) {
    V b[NV];
    for (int v = 0; v < NV; ++v) b[v] = vload(B + p * ld + j0 + v * kWidth<T>);
    for (int r = 0; r < R; ++r) {
      const T s = A[r * lda + p];
      for (int v = 0; v < NV; ++v) acc[r][v] += s * b[v];
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) {
      T* c = C + r * ld + j0 + v * kWidth<T>;
      V out = alpha * acc[r][v];
      if (ACC) out += vload(c);
      vstore(c, out);
    }
}

// C[R, ld] (= or +=) alpha · A[R, K] @ B[K, ld]; ld is a multiple of the vector width.
template <typename T, bool ACC, int R>
inline void product_rows(const T* A, int lda, const T* B, T* C, int ld, int K, T alpha) {
  int j0 = 0;
  for (; j0 + 2 * kWidth<T> <= ld; j0 += 2 * kWidth<T>) product_block<T, ACC, R, 2>(A, lda, B, C, ld, K, alpha, j0);
  if (j0 < ld) product_block<T, ACC, R, 1>(A, lda, B, C, ld, K, alpha, j0);
}

// C[M, ld] (= or +=) alpha · A[M, K] @ B[K, ld]
template <typename T, bool ACC>
inline void product(const T* A, int lda, const T* B, T* C, int ld, int M, int K, T alpha = T(1)) {
  int i = 0;
  for (; i + 4 <= M; i += 4) product_rows<T, ACC, 4>(A + i * lda, lda, B, C + i * ld, ld, K, alpha);
  if (i + 2 <= M) { product_rows<T, ACC, 2>(A + i * lda, lda, B, C + i * ld, ld, K, alpha); i += 2; }
  if (i < M) product_rows<T, ACC, 1>(A + i * lda, lda, B, C + i * ld, ld, K, alpha);
}

template <typename T>
inline void transpose(const T* __restrict X, int ldx, T* __restrict XT, int ldt, int rows, int cols) {
  for (int i = 0; i < rows; ++i)
    for (int j = 0; j < cols; ++j) XT[j * ldt + i] = X[i * ldx + j];
}

// The padded layout of one matrix: X [m, np], Xᵀ [n, mp], A and B [m, mp]; t: the caller's matrix is Xᵀ [n, m].
template <typename T> struct Layout {
  int m, n, np, mp;
  bool t;
  Layout(int m_, int n_, bool t_ = false)
      : m(m_), n(n_), np(padded(n_, kWidth<T>)), mp(padded(m_, kWidth<T>)), t(t_) {}
  int x() const { return m * np; }
  int xt() const { return n * mp; }
  int a() const { return m * mp; }
  // element (i, j) of X in a caller's matrix of m·n elements
  int at(int i, int j) const { return t ? j * m + i : i * n + j; }
  void load(const T* src, T* dst) const {
    for (int i = 0; i < m; ++i)
      for (int j = 0; j < n; ++j) dst[i * np + j] = src[at(i, j)];
  }
  void load_scaled(const T* src, T* dst, T d) const {  // X / d, the division autograd's forward takes
    for (int i = 0; i < m; ++i)
      for (int j = 0; j < n; ++j) dst[i * np + j] = src[at(i, j)] / d;
  }
  void store(const T* src, T* dst) const {
    for (int i = 0; i < m; ++i)
      for (int j = 0; j < n; ++j) dst[at(i, j)] = src[i * np + j];
  }
};

// One iteration: from X (and its transpose, written to XT) to A, B and Xn = a X + B X.
template <typename T>
inline void iteration(const Layout<T>& L, const T* X, T* XT, T* A, T* B, T* Xn, T a, T b, T c) {
  transpose(X, L.np, XT, L.mp, L.m, L.n);
  product<T, false>(X, L.np, XT, A, L.mp, L.m, L.n);
  if (c != T(0)) {
    product<T, false>(A, L.mp, A, B, L.mp, L.m, L.m, c);
    for (int i = 0; i < L.a(); ++i) B[i] += b * A[i];
  } else {
    for (int i = 0; i < L.a(); ++i) B[i] = b * A[i];
  }
  for (int i = 0; i < L.x(); ++i) Xn[i] = a * X[i];
  product<T, true>(B, L.mp, X, Xn, L.np, L.m, L.m);
}

// Matrices per parallel task: about 4K elements, so that small batches of large matrices still use every thread.
inline int64_t grain(const at::Tensor& X) { return std::max<int64_t>(1, 4096 / (X.size(1) * X.size(2))); }

// The kernel's layout of the caller's G [M, r, c]: X = G, or Gᵀ when r > c.
template <typename T> Layout<T> layout(const at::Tensor& G) {
  const bool t = G.size(1) > G.size(2);
  return Layout<T>(t ? G.size(2) : G.size(1), t ? G.size(1) : G.size(2), t);
}

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
  AT_DISPATCH_FLOATING_TYPES(G.scalar_type(), "ns_forward", [&] {
    using T = scalar_t;
    const Layout<T> L = layout<T>(G);
    const T* x = G.data_ptr<T>();
    const T* dd = d.data_ptr<T>();
    T* o = out.data_ptr<T>();
    at::parallel_for(0, M, grain(G), [&](int64_t begin, int64_t end) {
      std::vector<T> buffer(2 * L.x() + L.xt() + 2 * L.a(), T(0));
      T* X1 = buffer.data();
      T* X2 = X1 + L.x();
      T* XT = X2 + L.x();
      T* A = XT + L.xt();
      T* B = A + L.a();
      for (int64_t i = begin; i < end; ++i) {
        T* cur = X1;
        T* next = X2;
        L.load_scaled(x + i * L.m * L.n, cur, dd[i]);
        for (int j = 0; j < k; ++j) {
          iteration<T>(L, cur, XT, A, B, next, a, b, c);
          std::swap(cur, next);
        }
        L.store(cur, o + i * L.m * L.n);
      }
    });
  });
  return out;
}

// From G, d and ∂L/∂NS_k (G's layout): (∂L/∂X_0 / d, −∂L/∂X_0 · ((X / d) / d)), both [M, m, n] in the kernel's layout.
std::vector<at::Tensor> ns_backward(at::Tensor G, at::Tensor d, at::Tensor grad, int64_t k, double a, double b,
                                    double c) {
  check(G, d);
  TORCH_CHECK(grad.sizes() == G.sizes() && grad.scalar_type() == G.scalar_type() && grad.is_contiguous(),
              "grad must match G");
  const bool t = G.size(1) > G.size(2);
  const int64_t M = G.size(0), m = t ? G.size(2) : G.size(1), n = t ? G.size(1) : G.size(2);
  auto g1 = at::empty({M, m, n}, G.options());
  auto td = at::empty({M, m, n}, G.options());
  AT_DISPATCH_FLOATING_TYPES(G.scalar_type(), "ns_backward", [&] {
    using T = scalar_t;
    const Layout<T> L = layout<T>(G);
    const T* x = G.data_ptr<T>();
    const T* dd = d.data_ptr<T>();
    const T* gr = grad.data_ptr<T>();
    T* o1 = g1.data_ptr<T>();
    T* o2 = td.data_ptr<T>();
    const T ta = a, tb = b, tc = c;
    at::parallel_for(0, M, grain(G), [&](int64_t begin, int64_t end) {
      // X_0..X_k, X_0ᵀ..X_{k-1}ᵀ, A_j, B_j, then dB, E, S and two gradients
      std::vector<T> buffer((k + 1) * L.x() + k * (L.xt() + 2 * L.a()) + 3 * L.a() + 2 * L.x(), T(0));
      T* Xs = buffer.data();
      T* XTs = Xs + (k + 1) * L.x();
      T* As = XTs + k * L.xt();
      T* Bs = As + k * L.a();
      T* dB = Bs + k * L.a();
      T* E = dB + L.a();
      T* S = E + L.a();
      T* g = S + L.a();
      T* g_next = g + L.x();
      for (int64_t i = begin; i < end; ++i) {
        const T di = dd[i];
        L.load_scaled(x + i * L.m * L.n, Xs, di);
        for (int j = 0; j < k; ++j)
          iteration<T>(L, Xs + j * L.x(), XTs + j * L.xt(), As + j * L.a(), Bs + j * L.a(), Xs + (j + 1) * L.x(),
                       ta, tb, tc);
        L.load(gr + i * L.m * L.n, g);
        for (int j = k - 1; j >= 0; --j) {
          const T* Xj = Xs + j * L.x();
          const T* A = As + j * L.a();
          const T* B = Bs + j * L.a();
          product<T, false>(g, L.np, XTs + j * L.xt(), dB, L.mp, L.m, L.n);
          for (int r = 0; r < L.m; ++r)
            for (int s = 0; s < L.m; ++s) E[r * L.mp + s] = dB[r * L.mp + s] + dB[s * L.mp + r];
          for (int t = 0; t < L.a(); ++t) S[t] = tb * E[t];
          if (tc != T(0)) {
            product<T, true>(E, L.mp, A, S, L.mp, L.m, L.m, tc);
            product<T, true>(A, L.mp, E, S, L.mp, L.m, L.m, tc);
          }
          for (int t = 0; t < L.x(); ++t) g_next[t] = ta * g[t];
          product<T, true>(B, L.mp, g, g_next, L.np, L.m, L.m);
          product<T, true>(S, L.mp, Xj, g_next, L.np, L.m, L.m);
          std::swap(g, g_next);
        }
        // autograd's division backward: grad / d and −grad · ((X / d) / d), X / d being X_0
        T* p1 = o1 + i * L.m * L.n;
        T* p2 = o2 + i * L.m * L.n;
        for (int r = 0; r < L.m; ++r)
          for (int s = 0; s < L.n; ++s) {
            const T gs = g[r * L.np + s];
            p1[r * L.n + s] = gs / di;
            p2[r * L.n + s] = -gs * (Xs[r * L.np + s] / di);
          }
      }
    });
  });
  return {g1, td};
}

// ∂L/∂G in G's layout: g1 + ∂L/∂‖G‖ · (X / ‖G‖), the second term 0 where ‖G‖ = 0 (autograd's norm backward, then its
// sum of the two paths: a product, then an addition, never fused into one).
at::Tensor ns_finish(at::Tensor G, at::Tensor norm, at::Tensor g1, at::Tensor grad_norm) {
  check(G, norm);
  auto out = at::empty_like(G);
  const int64_t M = G.size(0);
  AT_DISPATCH_FLOATING_TYPES(G.scalar_type(), "ns_finish", [&] {
    using T = scalar_t;
    const Layout<T> L = layout<T>(G);
    const T* x = G.data_ptr<T>();
    const T* nn = norm.data_ptr<T>();
    const T* gn = grad_norm.data_ptr<T>();
    const T* h = g1.data_ptr<T>();
    T* o = out.data_ptr<T>();
    at::parallel_for(0, M, grain(G), [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const int64_t base = i * L.m * L.n;
        const T ni = nn[i], gi = gn[i];
        for (int64_t e = 0; e < L.m * L.n; ++e) o[base + e] = gi * (ni == T(0) ? T(0) : x[base + e] / ni);
        for (int r = 0; r < L.m; ++r)
          for (int s = 0; s < L.n; ++s) {
            T* oe = o + base + L.at(r, s);
            *oe = h[base + r * L.n + s] + *oe;
          }
      }
    });
  });
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) {
  module.def("forward", &ns_forward, "NS_k(G / d) for G [M, r, c], d [M]");
  module.def("backward", &ns_backward, "(dL/dX_0 / d, -dL/dX_0 (X_0 / d)) in the kernel's layout");
  module.def("finish", &ns_finish, "dL/dG from g1 and dL/d|G|");
}
