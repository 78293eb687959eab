// A diagnostic build only (-DFLASHCOS_BWD_TIMELINE=ON, never the default): the Hopper backward's
// plain instance (bwd_hopper_ws.cuh), on the persistent grid (kPersist) or on a grid of a CTA an item,
// stamps each consumer warpgroup's progress through each of its CTA's items with the SM's cycle
// counter, and its launcher writes one launch's stamps to a text file, to see where the time between
// an item's steps goes, and on a grid of a CTA an item the time between one CTA's end and the next
// one's start on the same SM (docs/kernels.md, "Open performance work").
//   FLASHCOS_BWD_TIMELINE_FILE    the file (default bwd_timeline.txt), appended to
//   FLASHCOS_BWD_TIMELINE_LAUNCH  which stamped launch of the process to write (default 10)
// A line per (CTA, item, consumer): cta item consumer w n_steps, then the cycle counts of the marks
// (kMark*), the global timer (ns) at the item's start, the SM's index and the cycle count at the
// CTA's start (the kernel's first instruction; cycle counts compare within one SM only).
// scripts/bwd_timeline.sh summarises such a file (medians per phase and the gaps between CTAs).
#pragma once

// A mark in the kernel (its lambda `mark`), nothing in the default build.
#ifdef FLASHCOS_BWD_TIMELINE
#define FLASHCOS_BWD_MARK(m) mark(m)
#else
#define FLASHCOS_BWD_MARK(m) ((void)0)
#endif

#ifdef FLASHCOS_BWD_TIMELINE
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace flashcos::cuda::hopper {

// The stamps' buffer of the launch in flight, or nullptr (set by the launcher: BwdTimeline).
static __device__ long long* g_bwd_timeline;

// The marks of an item: entered, K / V landed, its first step done, the step loop left, the last
// dQ's MMAs completed, its dQ handed to the reduction (the staging tile free), dK / dV stored.
enum BwdMark { kMarkEnter, kMarkKv, kMarkFirstStep, kMarkLoopEnd, kMarkDqMma, kMarkDqOut, kMarkStored, kMarks };
constexpr int kTimelineItems = 128;  // items per CTA recorded (later ones dropped)
// w, n_steps, the marks' cycle counts, then at kMarkEnter the global timer, the SM and the CTA's start cycle
constexpr int kTimelineFields = 2 + kMarks + 3;
// CTAs recorded: every CTA of b4 h8 n 16384 d 128's grid of a CTA an item (4,124 with its split tail),
// so that the launch's span and its SMs' idle time can be read (a buffer of 142 MB, for one launch).
constexpr int kTimelineCtas = 4608;

// Thread 0 of consumer c: mark m of the CTA's item `item` (cta_start: clock64() at the kernel's start).
__device__ __forceinline__ void bwd_timeline_mark(long long* timeline, int item, int c, int m, int w, int n_steps,
                                                  long long cta_start) {
  if (timeline == nullptr || item >= kTimelineItems || blockIdx.x >= kTimelineCtas) return;
  long long* f = timeline + ((int64_t(blockIdx.x) * kTimelineItems + item) * 2 + c) * kTimelineFields;
  f[2 + m] = clock64();
  if (m == kMarkEnter) {
    unsigned long long ns;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
    f[0] = w;
    f[1] = n_steps;
    unsigned sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    f[2 + kMarks] = static_cast<long long>(ns);
    f[3 + kMarks] = sm;
    f[4 + kMarks] = cta_start;
  }
}

// The launcher's side: the stamps' buffer for the next launch (nullptr but for the chosen one), and
// after that launch, the file.
struct BwdTimeline {
  long long* buffer = nullptr;
  int launches = 0;
  int chosen = 0;
  static BwdTimeline& get() {
    static BwdTimeline t;
    return t;
  }
  long long* next(cudaStream_t stream) {
    if (chosen == 0) {
      const char* e = std::getenv("FLASHCOS_BWD_TIMELINE_LAUNCH");
      chosen = e != nullptr ? std::atoi(e) : 10;
    }
    if (++launches != chosen) return set(nullptr, stream);
    const size_t bytes = size_t(kTimelineCtas) * kTimelineItems * 2 * kTimelineFields * sizeof(long long);
    if ((buffer == nullptr && cudaMalloc(&buffer, bytes) != cudaSuccess) ||
        cudaMemsetAsync(buffer, 0, bytes, stream) != cudaSuccess) {
      std::fprintf(stderr, "bwd_timeline: no stamps buffer: %s\n", cudaGetErrorString(cudaGetLastError()));
      return set(nullptr, stream);
    }
    return set(buffer, stream);
  }
  static long long* set(long long* ptr, cudaStream_t stream) {
    return cudaMemcpyToSymbolAsync(g_bwd_timeline, &ptr, sizeof(ptr), 0, cudaMemcpyHostToDevice, stream) == cudaSuccess
               ? ptr
               : nullptr;
  }
  // blocks: the launch's key blocks x (b, kv head)s (its items but for split pieces).
  void write(cudaStream_t stream, int grid, int64_t blocks, int I, int J, int D, bool causal) const {
    const size_t n = size_t(kTimelineCtas) * kTimelineItems * 2 * kTimelineFields;
    std::vector<long long> h(n);
    const cudaError_t err = cudaStreamSynchronize(stream) != cudaSuccess
                                ? cudaGetLastError()
                                : cudaMemcpy(h.data(), buffer, n * sizeof(long long), cudaMemcpyDeviceToHost);
    if (err != cudaSuccess) {
      std::fprintf(stderr, "bwd_timeline: reading the stamps failed: %s\n", cudaGetErrorString(err));
      return;
    }
    const char* e = std::getenv("FLASHCOS_BWD_TIMELINE_FILE");
    const char* path = e != nullptr ? e : "bwd_timeline.txt";
    FILE* f = std::fopen(path, "a");
    if (f == nullptr) {
      std::fprintf(stderr, "bwd_timeline: cannot open %s for appending\n", path);
      return;
    }
    std::fprintf(f, "# launch %d grid %d blocks %lld I %d J %d D %d causal %d\n", launches, grid, (long long)blocks, I,
                 J, D, int(causal));
    for (int cta = 0; cta < grid && cta < kTimelineCtas; ++cta)
      for (int it = 0; it < kTimelineItems; ++it)
        for (int c = 0; c < 2; ++c) {
          const long long* r = h.data() + ((size_t(cta) * kTimelineItems + it) * 2 + c) * kTimelineFields;
          if (r[2 + kMarkEnter] == 0) continue;
          std::fprintf(f, "%d %d %d %lld %lld", cta, it, c, r[0], r[1]);
          for (int m = 0; m < kMarks; ++m) std::fprintf(f, " %lld", r[2 + m]);
          std::fprintf(f, " %lld %lld %lld\n", r[2 + kMarks], r[3 + kMarks], r[4 + kMarks]);
        }
    std::fclose(f);
  }
};

}  // namespace flashcos::cuda::hopper
#endif  // FLASHCOS_BWD_TIMELINE
