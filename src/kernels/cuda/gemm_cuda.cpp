#include "kernels/cuda/gemm.h"

#include <memory>

namespace trex::cuda {

// A cached cuBLASLt description of one shape class: the operation, the three layouts (set to the extents of the
// call being run) and the algorithm the heuristic chose for the class's representative extents.
struct Gemm::Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  int64_t m = 0, k = 0;  // extents the layouts currently describe
  ~Plan() {
    if (op) cublasLtMatmulDescDestroy(op);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (c) cublasLtMatrixLayoutDestroy(c);
  }
};

Gemm::Gemm(size_t workspace_bytes) : workspace_(workspace_bytes) { TREX_CUBLAS(cublasLtCreate(&handle_)); }

Gemm::~Gemm() {
  for (auto& [key, plan] : plans_) delete plan;
  for (auto& [key, plan] : exact_plans_) delete plan;
  if (handle_) cublasLtDestroy(handle_);
}

namespace {
cudaDataType_t dt(GemmType t) { return t == GemmType::BF16 ? CUDA_R_16BF : CUDA_R_32F; }

cublasLtMatrixLayout_t layout(GemmType t, int64_t rows, int64_t cols, int64_t ld, int64_t batch, int64_t stride) {
  cublasLtMatrixLayout_t l;
  TREX_CUBLAS(cublasLtMatrixLayoutCreate(&l, dt(t), uint64_t(rows), uint64_t(cols), ld));
  if (batch > 1) {
    int32_t b = int32_t(batch);
    TREX_CUBLAS(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &b, sizeof(b)));
    TREX_CUBLAS(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                                 sizeof(stride)));
  }
  return l;
}
}  // namespace

int64_t Gemm::extent_class(int64_t x) {
  if (x <= 16) return x;
  int64_t p = 16;
  while (2 * p < x) p *= 2;  // p < x <= 2p
  const int64_t step = p / 4;
  return p + (x - p + step - 1) / step * step;
}

namespace {

// Column-major views of the row-major product (cuBLASLt's "A" is our B):
//   a = our B: rows (trans_b ? k : n), cols (trans_b ? n : k), ld = rows
//   b = our A: rows (trans_a ? m : k), cols (trans_a ? k : m), ld = rows
//   c:         rows n, cols m, ld = n
struct Views {
  uint64_t a_rows, a_cols, b_rows, b_cols;
  int64_t a_stride, b_stride, c_stride;
};
Views views(const GemmShape& s, int64_t m, int64_t k) {
  Views v;
  v.a_rows = uint64_t(s.trans_b ? k : s.n), v.a_cols = uint64_t(s.trans_b ? s.n : k);
  v.b_rows = uint64_t(s.trans_a ? m : k), v.b_cols = uint64_t(s.trans_a ? k : m);
  v.a_stride = k * s.n, v.b_stride = m * k, v.c_stride = m * s.n;
  return v;
}

void set_u64(cublasLtMatrixLayout_t l, cublasLtMatrixLayoutAttribute_t at, uint64_t v) {
  TREX_CUBLAS(cublasLtMatrixLayoutSetAttribute(l, at, &v, sizeof(v)));
}
void set_i64(cublasLtMatrixLayout_t l, cublasLtMatrixLayoutAttribute_t at, int64_t v) {
  TREX_CUBLAS(cublasLtMatrixLayoutSetAttribute(l, at, &v, sizeof(v)));
}

}  // namespace

Gemm::Plan* Gemm::make_plan(const GemmShape& s, int64_t m, int64_t k, bool beta_nonzero) {
  (void)beta_nonzero;  // part of the key: cuBLASLt may pick another algorithm when C is read
  auto plan = std::make_unique<Plan>();
  const cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  TREX_CUBLAS(cublasLtMatmulDescCreate(&plan->op, compute, CUDA_R_32F));
  cublasOperation_t ta = s.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasOperation_t tb = s.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  TREX_CUBLAS(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  TREX_CUBLAS(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  const Views v = views(s, m, k);
  plan->a = layout(s.ab, int64_t(v.a_rows), int64_t(v.a_cols), int64_t(v.a_rows), s.batch, v.a_stride);
  plan->b = layout(s.ab, int64_t(v.b_rows), int64_t(v.b_cols), int64_t(v.b_rows), s.batch, v.b_stride);
  plan->c = layout(s.c, s.n, m, s.n, s.batch, v.c_stride);
  plan->m = m, plan->k = k;
  cublasLtMatmulPreference_t pref;
  TREX_CUBLAS(cublasLtMatmulPreferenceCreate(&pref));
  size_t ws = workspace_.bytes();
  TREX_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  ++heuristic_calls_;
  TREX_CUBLAS(cublasLtMatmulAlgoGetHeuristic(handle_, plan->op, plan->a, plan->b, plan->c, plan->c, pref, 1, &result,
                                             &found));
  cublasLtMatmulPreferenceDestroy(pref);
  TREX_CHECK(found > 0, "cuBLASLt found no algorithm for GEMM m={} n={} k={} batch={}", m, s.n, k, s.batch);
  plan->algo = result.algo;
  return plan.release();
}

void Gemm::run(const GemmShape& s, const void* a, const void* b, void* c, float alpha, float beta,
               cudaStream_t stream) {
  if (s.m == 0 || s.n == 0) return;
  // An extent varies freely in the key only where it is not a leading dimension (the alignment an algorithm
  // was chosen for must hold for every member of the class): m leads A only when A is transposed, k leads A when
  // it is not and B when B is transposed.
  const bool m_free = !s.trans_a, k_free = s.trans_a && !s.trans_b;
  const int64_t mc = m_free ? extent_class(s.m) : s.m, kc = k_free ? extent_class(s.k) : s.k;
  const bool beta_nonzero = beta != 0.0f;
  const Key key{mc, s.n, kc, int(s.trans_a), int(s.trans_b), int(s.ab), int(s.c), s.batch, beta_nonzero};
  Plan*& plan = plans_[key];
  if (!plan) plan = make_plan(s, mc, kc, beta_nonzero);
  if (plan->m != s.m || plan->k != s.k) {  // describe this call's extents (leading dimensions are unchanged)
    const Views v = views(s, s.m, s.k);
    set_u64(plan->a, CUBLASLT_MATRIX_LAYOUT_ROWS, v.a_rows), set_u64(plan->a, CUBLASLT_MATRIX_LAYOUT_COLS, v.a_cols);
    set_u64(plan->b, CUBLASLT_MATRIX_LAYOUT_ROWS, v.b_rows), set_u64(plan->b, CUBLASLT_MATRIX_LAYOUT_COLS, v.b_cols);
    set_u64(plan->c, CUBLASLT_MATRIX_LAYOUT_COLS, uint64_t(s.m));
    if (s.batch > 1) {
      set_i64(plan->a, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, v.a_stride);
      set_i64(plan->b, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, v.b_stride);
      set_i64(plan->c, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, v.c_stride);
    }
    plan->m = s.m, plan->k = s.k;
  }
  cublasStatus_t st = cublasLtMatmul(handle_, plan->op, &alpha, b, plan->a, a, plan->b, &beta, c, plan->c, c,
                                     plan->c, &plan->algo, workspace_.as(), workspace_.bytes(), stream);
  if (st == CUBLAS_STATUS_SUCCESS) return;
  TREX_CHECK(st == CUBLAS_STATUS_NOT_SUPPORTED || st == CUBLAS_STATUS_INVALID_VALUE,
             "cuBLAS error {} ({}) in cublasLtMatmul m={} n={} k={} batch={}", int(st), cublasLtGetStatusString(st),
             s.m, s.n, s.k, s.batch);
  // The class's algorithm cannot serve these exact extents: a plan of their own (rare, so this map stays small).
  const Key exact{s.m, s.n, s.k, int(s.trans_a), int(s.trans_b), int(s.ab), int(s.c), s.batch, beta_nonzero};
  Plan*& own = exact_plans_[exact];
  if (!own) own = make_plan(s, s.m, s.k, beta_nonzero);
  TREX_CUBLAS(cublasLtMatmul(handle_, own->op, &alpha, b, own->a, a, own->b, &beta, c, own->c, c, own->c, &own->algo,
                             workspace_.as(), workspace_.bytes(), stream));
}

}  // namespace trex::cuda
