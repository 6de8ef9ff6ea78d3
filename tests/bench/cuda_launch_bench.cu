// How fast host threads can issue kernels to one GPU: the measurement behind keel's choice of one
// launching thread per CUDA place (docs/gpu.md, "Why one launching thread"). Standalone (CUDA
// runtime and the C++ standard library only); tools/gpu_check.sh compiles it with the GPU machine's
// nvcc and runs it. Prints one JSON line per case: microseconds per op, median of 5 runs.
//
// Each case issues K element-wise ops of n floats (y = a*x + y on buffers rotated so that no op
// reads what the previous one wrote, unless the case is a chain):
//   one_thread_one_stream      the executor today: one thread, the place's stream, program order
//   one_thread_T_streams       one thread, round-robin over T streams (independent ops can overlap
//                              on the GPU without more host threads)
//   T_threads_T_streams_indep  T threads, each its own stream, independent ops (the best case for
//                              a multi-threaded launcher: a wide graph)
//   T_threads_T_streams_chain  T threads, each its own stream, every op depending on the previous
//                              one (a layer chain: forward and backward are mostly this): an
//                              event recorded after each op, waited on by the next op's stream
//   T_threads_one_stream_indep T threads enqueueing onto one shared stream (Paddle's executor on
//                              one GPU): the stream orders the ops, the threads only share the
//                              host work
//   T_threads_one_stream_chain the same, each op handed from thread to thread in order
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#define CK(x)                                                                                 \
  do {                                                                                        \
    cudaError_t e_ = (x);                                                                     \
    if (e_ != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                           \
    }                                                                                         \
  } while (0)

__global__ void Axpy(float* y, const float* x, float a, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    y[i] = a * x[i] + y[i];
}

namespace {

constexpr int kBuffers = 8;

struct Setup {
  int n = 0;
  std::vector<float*> buf;
  void Launch(int op, cudaStream_t s) const {
    int blocks = std::min((n + 255) / 256, 1024);
    Axpy<<<blocks, 256, 0, s>>>(buf[(op + 1) % kBuffers], buf[op % kBuffers], 1e-3f, n);
  }
};

double Seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double OneThread(const Setup& s, const std::vector<cudaStream_t>& streams, int streams_used,
                 int ops) {
  double t = Seconds();
  for (int i = 0; i < ops; ++i) s.Launch(i, streams[i % streams_used]);
  CK(cudaDeviceSynchronize());
  return Seconds() - t;
}

double Threads(const Setup& s, const std::vector<cudaStream_t>& streams, int threads, int ops,
               bool chain, bool one_stream, const std::vector<cudaEvent_t>& events) {
  std::atomic<int> launched{0};  // ops launched so far (chain: in order)
  std::vector<std::thread> pool;
  double t = Seconds();
  for (int th = 0; th < threads; ++th) {
    pool.emplace_back([&, th] {
      for (int i = th; i < ops; i += threads) {
        cudaStream_t st = streams[one_stream ? 0 : th];
        if (chain) {
          while (launched.load(std::memory_order_acquire) != i) {
          }
          if (i > 0 && !one_stream) CK(cudaStreamWaitEvent(st, events[(i - 1) % events.size()], 0));
        }
        s.Launch(i, st);
        if (chain) {
          if (!one_stream) CK(cudaEventRecord(events[i % events.size()], st));
          launched.store(i + 1, std::memory_order_release);
        }
      }
    });
  }
  for (auto& p : pool) p.join();
  CK(cudaDeviceSynchronize());
  return Seconds() - t;
}

}  // namespace

int main(int argc, char** argv) {
  int ops = argc > 1 ? std::atoi(argv[1]) : 20000;
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  for (int n : {1024, 1 << 20}) {
    Setup s;
    s.n = n;
    for (int b = 0; b < kBuffers; ++b) {
      float* p;
      CK(cudaMalloc(&p, sizeof(float) * n));
      CK(cudaMemset(p, 0, sizeof(float) * n));
      s.buf.push_back(p);
    }
    for (int threads : {2, 4}) {
      std::vector<cudaStream_t> streams(threads);
      for (auto& st : streams) CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
      std::vector<cudaEvent_t> events(64);
      for (auto& e : events) CK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
      struct Case {
        const char* name;
        int t;
      };
      for (Case c :
           {Case{"one_thread_one_stream", 1}, Case{"one_thread_T_streams", 1},
            Case{"T_threads_T_streams_indep", threads}, Case{"T_threads_T_streams_chain", threads},
            Case{"T_threads_one_stream_indep", threads},
            Case{"T_threads_one_stream_chain", threads}}) {
        if (threads > 2 && c.name == std::string("one_thread_one_stream")) continue;
        std::vector<double> us;
        for (int rep = 0; rep < 6; ++rep) {
          double sec;
          std::string name = c.name;
          if (name == "one_thread_one_stream")
            sec = OneThread(s, streams, 1, ops);
          else if (name == "one_thread_T_streams")
            sec = OneThread(s, streams, threads, ops);
          else
            sec = Threads(s, streams, threads, ops, name.find("chain") != std::string::npos,
                          name.find("one_stream") != std::string::npos, events);
          if (rep > 0) us.push_back(sec * 1e6 / ops);  // rep 0 warms up
        }
        std::sort(us.begin(), us.end());
        std::printf(
            "{\"gpu\": \"%s\", \"case\": \"%s\", \"T\": %d, \"floats\": %d, \"ops\": %d, "
            "\"us_per_op\": %.3f}\n",
            prop.name, c.name,
            c.t == 1 && std::string(c.name) == "one_thread_one_stream" ? 1 : threads, n, ops,
            us[us.size() / 2]);
        std::fflush(stdout);
      }
      for (auto& e : events) CK(cudaEventDestroy(e));
      for (auto& st : streams) CK(cudaStreamDestroy(st));
    }
    for (float* p : s.buf) CK(cudaFree(p));
  }
  return 0;
}
