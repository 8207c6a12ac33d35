// Mamba-1's selective scan on CPU, fused: one pass over the sequence per (batch, channel), with the
// N-wide state kept in cache instead of materialising B x T x D x N tensors as the pure-PyTorch
// scans do. The backward recomputes the states of one (batch, channel) at a time.
//
//   h_t[n] = exp(delta_t * A[n]) * h_{t-1}[n] + delta_t * u_t * B_t[n]
//   y_t    = sum_n C_t[n] * h_t[n]
//
// Shapes (float32, contiguous): u, delta [batch, D, T]; A [D, N]; Bs, Cs [batch, T, N].
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <vector>

namespace {

// States h_t and decays exp(delta_t * A) of one (batch, channel) for every t: [T, N] each.
void scan_channel(const float* u, const float* delta, const float* A, const float* Bs, int64_t T,
                  int64_t N, float* h, float* decay) {
  std::vector<float> state(N, 0.0f);
  for (int64_t t = 0; t < T; ++t) {
    const float dt = delta[t], dtu = delta[t] * u[t];
    const float* b = Bs + t * N;
    float* ht = h + t * N;
    float* at = decay + t * N;
#pragma omp simd
    for (int64_t n = 0; n < N; ++n) {
      at[n] = std::exp(dt * A[n]);
      state[n] = at[n] * state[n] + dtu * b[n];
      ht[n] = state[n];
    }
  }
}

}  // namespace

torch::Tensor selective_scan_forward(torch::Tensor u, torch::Tensor delta, torch::Tensor A,
                                     torch::Tensor Bs, torch::Tensor Cs) {
  const int64_t batch = u.size(0), D = u.size(1), T = u.size(2), N = A.size(1);
  auto y = torch::empty_like(u);
  const float *pu = u.data_ptr<float>(), *pd = delta.data_ptr<float>(), *pA = A.data_ptr<float>();
  const float *pB = Bs.data_ptr<float>(), *pC = Cs.data_ptr<float>();
  float* py = y.data_ptr<float>();
  at::parallel_for(0, batch * D, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> state(N);
    for (int64_t i = begin; i < end; ++i) {
      const int64_t b = i / D, d = i % D;
      const float *ui = pu + i * T, *di = pd + i * T, *Ad = pA + d * N;
      const float *Bb = pB + b * T * N, *Cb = pC + b * T * N;
      std::fill(state.begin(), state.end(), 0.0f);
      for (int64_t t = 0; t < T; ++t) {
        const float dt = di[t], dtu = di[t] * ui[t];
        const float *bt = Bb + t * N, *ct = Cb + t * N;
        float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
        for (int64_t n = 0; n < N; ++n) {
          state[n] = std::exp(dt * Ad[n]) * state[n] + dtu * bt[n];
          acc += state[n] * ct[n];
        }
        py[i * T + t] = acc;
      }
    }
  });
  return y;
}

// Gradients of u, delta, A, Bs, Cs given dL/dy. B and C are shared by all channels, so each thread
// sums its channels' contributions into its own buffer; the caller adds the buffers up.
std::vector<torch::Tensor> selective_scan_backward(torch::Tensor u, torch::Tensor delta, torch::Tensor A,
                                                   torch::Tensor Bs, torch::Tensor Cs, torch::Tensor gy) {
  const int64_t batch = u.size(0), D = u.size(1), T = u.size(2), N = A.size(1);
  const int64_t threads = at::get_num_threads();
  auto gu = torch::empty_like(u), gdelta = torch::empty_like(delta);
  auto gA = torch::zeros({batch, D, N}, u.options());
  auto gB = torch::zeros({threads, batch, T, N}, u.options());
  auto gC = torch::zeros({threads, batch, T, N}, u.options());
  const float *pu = u.data_ptr<float>(), *pd = delta.data_ptr<float>(), *pA = A.data_ptr<float>();
  const float *pB = Bs.data_ptr<float>(), *pC = Cs.data_ptr<float>(), *pgy = gy.data_ptr<float>();
  float *pgu = gu.data_ptr<float>(), *pgd = gdelta.data_ptr<float>(), *pgA = gA.data_ptr<float>();
  float *pgB = gB.data_ptr<float>(), *pgC = gC.data_ptr<float>();
  at::parallel_for(0, batch * D, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> h(T * N), decay(T * N), gh(N);
    const int64_t slot = at::get_thread_num() * batch * T * N;
    for (int64_t i = begin; i < end; ++i) {
      const int64_t b = i / D, d = i % D;
      const float *ui = pu + i * T, *di = pd + i * T, *gyi = pgy + i * T, *Ad = pA + d * N;
      const float *Bb = pB + b * T * N, *Cb = pC + b * T * N;
      float *gBb = pgB + slot + b * T * N, *gCb = pgC + slot + b * T * N, *gAd = pgA + i * N;
      scan_channel(ui, di, Ad, Bb, T, N, h.data(), decay.data());
      std::fill(gh.begin(), gh.end(), 0.0f);
      for (int64_t t = T - 1; t >= 0; --t) {
        const float dt = di[t], dtu = di[t] * ui[t], g = gyi[t];
        const float *bt = Bb + t * N, *ct = Cb + t * N, *ht = h.data() + t * N, *at = decay.data() + t * N;
        const float* hprev = t > 0 ? h.data() + (t - 1) * N : nullptr;
        float *gbt = gBb + t * N, *gct = gCb + t * N;
        float g_dtu = 0.0f, g_dt = 0.0f;
#pragma omp simd reduction(+ : g_dtu, g_dt)
        for (int64_t n = 0; n < N; ++n) {
          gct[n] += g * ht[n];
          gh[n] += g * ct[n];  // gh now holds dL/dh_t
          const float prev = hprev ? hprev[n] : 0.0f;
          const float g_decay = gh[n] * prev * at[n];  // dL/d(delta_t * A[n])
          g_dt += g_decay * Ad[n];
          gAd[n] += g_decay * dt;
          g_dtu += gh[n] * bt[n];
          gbt[n] += gh[n] * dtu;
          gh[n] *= at[n];  // carried to h_{t-1}
        }
        pgu[i * T + t] = g_dtu * dt;
        pgd[i * T + t] = g_dt + g_dtu * ui[t];
      }
    }
  });
  return {gu, gdelta, gA.sum(0), gB.sum(0), gC.sum(0)};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("forward", &selective_scan_forward, "selective scan forward (CPU)");
  m.def("backward", &selective_scan_backward, "selective scan backward (CPU)");
}
