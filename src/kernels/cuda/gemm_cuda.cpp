#include "kernels/cuda/gemm.h"

namespace trex::cuda {

// A cached cuBLASLt description of one shape: the operation, the three layouts and the chosen algorithm.
struct Gemm::Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
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

void Gemm::run(const GemmShape& s, const void* a, const void* b, void* c, float alpha, float beta,
               cudaStream_t stream) {
  if (s.m == 0 || s.n == 0) return;
  auto key = std::make_tuple(s.m, s.n, s.k, int(s.trans_a), int(s.trans_b), int(s.ab), int(s.c), s.batch,
                             beta != 0.0f);
  Plan*& plan = plans_[key];
  if (!plan) {
    // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: cuBLASLt's "A" is our B.
    plan = new Plan();
    cublasComputeType_t compute = s.ab == GemmType::F32 ? CUBLAS_COMPUTE_32F : CUBLAS_COMPUTE_32F;
    TREX_CUBLAS(cublasLtMatmulDescCreate(&plan->op, compute, CUDA_R_32F));
    cublasOperation_t ta = s.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t tb = s.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    TREX_CUBLAS(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    TREX_CUBLAS(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
    // Column-major views: our B ([K,N] row-major = [N,K] col-major) and our A.
    int64_t b_rows = s.trans_b ? s.k : s.n, b_cols = s.trans_b ? s.n : s.k;
    int64_t a_rows = s.trans_a ? s.m : s.k, a_cols = s.trans_a ? s.k : s.m;
    plan->a = layout(s.ab, b_rows, b_cols, b_rows, s.batch, s.k * s.n);
    plan->b = layout(s.ab, a_rows, a_cols, a_rows, s.batch, s.m * s.k);
    plan->c = layout(s.c, s.n, s.m, s.n, s.batch, s.m * s.n);
    cublasLtMatmulPreference_t pref;
    TREX_CUBLAS(cublasLtMatmulPreferenceCreate(&pref));
    size_t ws = workspace_.bytes();
    TREX_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    TREX_CUBLAS(cublasLtMatmulAlgoGetHeuristic(handle_, plan->op, plan->a, plan->b, plan->c, plan->c, pref, 1,
                                               &result, &found));
    cublasLtMatmulPreferenceDestroy(pref);
    TREX_CHECK(found > 0, "cuBLASLt found no algorithm for GEMM m={} n={} k={}", s.m, s.n, s.k);
    plan->algo = result.algo;
  }
  TREX_CUBLAS(cublasLtMatmul(handle_, plan->op, &alpha, b, plan->a, a, plan->b, &beta, c, plan->c, c, plan->c,
                             &plan->algo, workspace_.as(), workspace_.bytes(), stream));
}

}  // namespace trex::cuda
