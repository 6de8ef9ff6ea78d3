// Single-thread sgemm on the seed MLP's shapes: OpenBLAS (Debian 0.3.21), Eigen 3.4, oneDNN 2.6.3;
// best of 30 each, interleaved. What decided keel's GEMM backend (oneDNN). Needs libopenblas-dev.
//   g++ -O3 -march=native -DEIGEN_DONT_PARALLELIZE -I/usr/include/eigen3 \
//     -I/usr/include/x86_64-linux-gnu/openblas-pthread tests/bench/gemm_libs.cc -o /tmp/gemm_libs \
//     -ldnnl -lgomp -L/usr/lib/x86_64-linux-gnu/openblas-pthread -lopenblas && /tmp/gemm_libs
#include <cblas.h>
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>

#include <Eigen/Core>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>
using Mat = Eigen::Matrix<float, -1, -1, Eigen::RowMajor>;
extern "C" void openblas_set_num_threads(int);
int main() {
  omp_set_num_threads(1);
  openblas_set_num_threads(1);
  struct S {
    bool ta, tb;
    int M, N, K;
    const char* w;
  } sh[] = {
      {0, 0, 128, 1280, 1280, "fwd"}, {0, 1, 128, 1280, 1280, "dX"}, {1, 0, 1280, 1280, 128, "dW"}};
  for (auto s : sh) {
    Mat A = Mat::Random(s.ta ? s.K : s.M, s.ta ? s.M : s.K),
        B = Mat::Random(s.tb ? s.N : s.K, s.tb ? s.K : s.N), C(s.M, s.N);
    double best[3] = {1e9, 1e9, 1e9};
    for (int r = 0; r < 30; ++r)
      for (int lib = 0; lib < 3; ++lib) {
        auto t = std::chrono::steady_clock::now();
        if (lib == 0)
          cblas_sgemm(CblasRowMajor, s.ta ? CblasTrans : CblasNoTrans,
                      s.tb ? CblasTrans : CblasNoTrans, s.M, s.N, s.K, 1, A.data(), A.cols(),
                      B.data(), B.cols(), 0, C.data(), s.N);
        else if (lib == 1) {
          if (!s.ta && !s.tb)
            C.noalias() = A * B;
          else if (s.tb)
            C.noalias() = A * B.transpose();
          else
            C.noalias() = A.transpose() * B;
        } else
          dnnl_sgemm(s.ta ? 'T' : 'N', s.tb ? 'T' : 'N', s.M, s.N, s.K, 1, A.data(), A.cols(),
                     B.data(), B.cols(), 0, C.data(), s.N);
        best[lib] = std::min(
            best[lib], std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count());
      }
    double f = 2.0 * s.M * s.N * s.K / 1e9;
    printf("%-3s %dx%dx%d  openblas %.0f  eigen %.0f  onednn %.0f GFLOP/s\n", s.w, s.M, s.N, s.K,
           f / best[0], f / best[1], f / best[2]);
  }
}
