// Mamba-1's selective scan on CPU, fused: one pass over the sequence per (batch, channel), with the
// N-wide state kept in cache instead of materialising B x T x D x N tensors as the pure-PyTorch
// scans do. The backward recomputes the states of one (batch, channel) at a time.
//
//   h_t[n] = exp(delta_t * A[n]) * h_{t-1}[n] + delta_t * u_t * B_t[n]
//   y_t    = sum_n C_t[n] * h_t[n]
//
// Shapes (float32, contiguous): u, delta [batch, D, T]; A [D, N]; Bs, Cs [batch, T, N].
//
// Plain C entry points over buffers the caller (mamba_cpu.py) allocates, with no torch or Python headers:
// the build is a compile and a link, about half a second, where a build against torch/extension.h took
// about 40 CPU-seconds and needed Python's headers. The (batch, channel) rows are split into one
// contiguous block per thread, as at::parallel_for splits them. The library needs libgomp.so.1; where
// torch ships its runtime under that name (its CPU wheels here do), the loader reuses torch's, and the
// scan and torch's own ops share one pool of threads.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
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

// y of the rows [begin, end) of batch * D.
void forward_rows(const float* u, const float* delta, const float* A, const float* Bs, const float* Cs,
                  float* y, int64_t D, int64_t T, int64_t N, int64_t begin, int64_t end) {
  std::vector<float> state(N);
  for (int64_t i = begin; i < end; ++i) {
    const int64_t b = i / D, d = i % D;
    const float *ui = u + i * T, *di = delta + i * T, *Ad = A + d * N;
    const float *Bb = Bs + b * T * N, *Cb = Cs + b * T * N;
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
      y[i * T + t] = acc;
    }
  }
}

// Gradients of the rows [begin, end): gu, gdelta and gA at those rows; the rows' contributions to the
// gradients of B and C, which all rows share, added into gB and gC. No buffer overlaps another (the caller
// allocates the gradients): told so, the compiler keeps the backward as fast as the torch extension's was
// (without it, about 10% slower at N = 16 on one thread).
void backward_rows(const float* __restrict__ u, const float* __restrict__ delta, const float* __restrict__ A,
                   const float* __restrict__ Bs, const float* __restrict__ Cs, const float* __restrict__ gy,
                   float* __restrict__ gu, float* __restrict__ gdelta, float* __restrict__ gA,
                   float* __restrict__ gB, float* __restrict__ gC, int64_t D, int64_t T, int64_t N,
                   int64_t begin, int64_t end) {
  std::vector<float> h(T * N), decay(T * N), gh(N);
  for (int64_t i = begin; i < end; ++i) {
    const int64_t b = i / D, d = i % D;
    const float *ui = u + i * T, *di = delta + i * T, *gyi = gy + i * T, *Ad = A + d * N;
    const float *Bb = Bs + b * T * N, *Cb = Cs + b * T * N;
    float *gBb = gB + b * T * N, *gCb = gC + b * T * N, *gAd = gA + i * N;
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
      gu[i * T + t] = g_dtu * dt;
      gdelta[i * T + t] = g_dt + g_dtu * ui[t];
    }
  }
}

// body(begin, end, thread) over `rows` rows on `threads` threads, one contiguous block each.
template <typename Body>
void over_rows(int64_t rows, int threads, const Body& body) {
#pragma omp parallel num_threads(threads)
  {
    const int64_t thread = omp_get_thread_num(), count = omp_get_num_threads();
    const int64_t chunk = (rows + count - 1) / count;
    if (thread * chunk < rows) body(thread * chunk, std::min(rows, (thread + 1) * chunk), thread);
  }
}

}  // namespace

// y [batch, D, T].
extern "C" void rayb_scan_forward(const float* u, const float* delta, const float* A, const float* Bs,
                                  const float* Cs, float* y, int64_t batch, int64_t D, int64_t T, int64_t N,
                                  int threads) {
  over_rows(batch * D, threads, [&](int64_t begin, int64_t end, int64_t) {
    forward_rows(u, delta, A, Bs, Cs, y, D, T, N, begin, end);
  });
}

// Gradients given dL/dy (gy): gu, gdelta [batch, D, T]; gA [batch, D, N], zeroed; gB and gC
// [threads, batch, T, N], zeroed, one slice for each thread's rows, which the caller adds up.
extern "C" void rayb_scan_backward(const float* u, const float* delta, const float* A, const float* Bs,
                                   const float* Cs, const float* gy, float* gu, float* gdelta, float* gA,
                                   float* gB, float* gC, int64_t batch, int64_t D, int64_t T, int64_t N,
                                   int threads) {
  over_rows(batch * D, threads, [&](int64_t begin, int64_t end, int64_t thread) {
    const int64_t slot = thread * batch * T * N;
    backward_rows(u, delta, A, Bs, Cs, gy, gu, gdelta, gA, gB + slot, gC + slot, D, T, N, begin, end);
  });
}
