#include "model/dsv4/mtp.h"

#include <vector>

#include "kernels/cpu/gemm_t.h"
#include "model/dsv4/embedding.h"
#include "model/dsv4/norm.h"

namespace trex::dsv4 {

template <class T>
MtpInputActs<T> mtp_input_acts_bind(int64_t n, int64_t n_hc, int64_t d, T* buf) {
  MtpInputActs<T> a;
  a.emb = buf, buf += n * d;
  a.e_rstd = buf, buf += n;
  a.e_norm = buf, buf += n * d;
  a.h_rstd = buf, buf += n * n_hc;
  a.h_norm = buf;
  return a;
}

template <class T>
void mtp_input_fwd(int64_t n, int64_t n_hc, int64_t d, double eps, const int32_t* next_ids, const T* embed,
                   int64_t vocab, const T* XL, const MtpInputParams<T>& p, MtpInputActs<T>& a, T* Xmtp) {
  embed_rows_fwd(next_ids, n, embed, vocab, d, a.emb);
  norm_fwd(a.emb, p.enorm, n, d, eps, a.e_norm, a.e_rstd);
  std::vector<T> e(size_t(n * d));
  cpu::linear_fwd_t(e.data(), a.e_norm, p.e_proj, n, d, d);
  norm_fwd(XL, p.hnorm, n * n_hc, d, eps, a.h_norm, a.h_rstd);
  cpu::linear_fwd_t(Xmtp, a.h_norm, p.h_proj, n * n_hc, d, d);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t j = 0; j < n_hc; ++j)
      for (int64_t k = 0; k < d; ++k) Xmtp[(t * n_hc + j) * d + k] += e[size_t(t * d + k)];
}

template <class T>
void mtp_input_bwd(int64_t n, int64_t n_hc, int64_t d, const int32_t* next_ids, const T* XL,
                   const MtpInputParams<T>& p, const MtpInputActs<T>& a, const T* dXmtp, T* dXL, T* dembed,
                   MtpInputGrads<T>& g) {
  std::vector<T> de(size_t(n * d), T(0));
  for (int64_t t = 0; t < n; ++t)
    for (int64_t j = 0; j < n_hc; ++j)
      for (int64_t k = 0; k < d; ++k) de[size_t(t * d + k)] += dXmtp[(t * n_hc + j) * d + k];
  std::vector<T> dhn(size_t(n * n_hc * d), T(0));
  cpu::linear_bwd_t(dhn.data(), g.h_proj, dXmtp, a.h_norm, p.h_proj, n * n_hc, d, d);
  norm_bwd(XL, p.hnorm, a.h_rstd, dhn.data(), n * n_hc, d, dXL, g.hnorm);
  std::vector<T> den(size_t(n * d), T(0));
  cpu::linear_bwd_t(den.data(), g.e_proj, de.data(), a.e_norm, p.e_proj, n, d, d);
  std::vector<T> demb(size_t(n * d), T(0));
  norm_bwd(a.emb, p.enorm, a.e_rstd, den.data(), n, d, demb.data(), g.enorm);
  if (dembed) embed_rows_bwd(next_ids, n, d, demb.data(), dembed);
}

template MtpInputActs<float> mtp_input_acts_bind<float>(int64_t, int64_t, int64_t, float*);
template MtpInputActs<double> mtp_input_acts_bind<double>(int64_t, int64_t, int64_t, double*);
template void mtp_input_fwd<float>(int64_t, int64_t, int64_t, double, const int32_t*, const float*, int64_t,
                                   const float*, const MtpInputParams<float>&, MtpInputActs<float>&, float*);
template void mtp_input_fwd<double>(int64_t, int64_t, int64_t, double, const int32_t*, const double*, int64_t,
                                    const double*, const MtpInputParams<double>&, MtpInputActs<double>&, double*);
template void mtp_input_bwd<float>(int64_t, int64_t, int64_t, const int32_t*, const float*,
                                   const MtpInputParams<float>&, const MtpInputActs<float>&, const float*, float*,
                                   float*, MtpInputGrads<float>&);
template void mtp_input_bwd<double>(int64_t, int64_t, int64_t, const int32_t*, const double*,
                                    const MtpInputParams<double>&, const MtpInputActs<double>&, const double*,
                                    double*, double*, MtpInputGrads<double>&);

}  // namespace trex::dsv4
