// Work spread over every core the process may use, for the CPU kernels' large calls (a prompt's products, a busy
// decode step's products and attention), by helper threads that sleep between calls. torch's own threads are
// left at one by default, since OpenMP's spinning threads fought the HTTP front end for the second core (the
// demo model decoded 1.3-1.5x slower with two: benchmarks/RESULTS.md, 2026-11-23); these wake only for work that
// takes long enough to pay for waking them.

#include <ATen/Parallel.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "cpu_kernels.h"

namespace {

int64_t usable_cores() {
  cpu_set_t set;
  return sched_getaffinity(0, sizeof set, &set) == 0 ? std::max(1, CPU_COUNT(&set)) : 1;
}

// One helper thread per usable core but the caller's, started on first use and kept (never joined: the process's
// exit ends them). Work is handed out in chunks from a shared counter, not in fixed parts: a helper whose core is
// busy elsewhere (the HTTP front end streaming tokens) takes fewer chunks, and one that wakes after the work is
// gone takes none, so the caller never waits for a core it cannot get (with fixed halves it waited a third of a
// busy decode step: py-spy, 16 streams, 2026-11-28).
class Helpers {
 public:
  explicit Helpers(int64_t count) {
    for (int64_t i = 0; i < count; ++i) std::thread([this] { serve(); }).detach();
    size_ = count;
  }

  void run(int64_t tasks, const std::function<void(int64_t, int64_t)>& fn) {
    std::lock_guard<std::mutex> one_at_a_time(run_mutex_);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      job_ = &fn, tasks_ = tasks, chunk_ = std::max<int64_t>(1, tasks / ((size_ + 1) * kChunksPerCore));
      next_.store(0), open_ = true, ++generation_;
    }
    wake_.notify_all();
    work();
    std::unique_lock<std::mutex> lock(mutex_);
    open_ = false;  // helpers waking from now on skip this job; those in it finish their chunks
    done_.wait(lock, [this] { return active_ == 0; });
  }

 private:
  static constexpr int64_t kChunksPerCore = 4;

  void work() {
    for (int64_t begin; (begin = next_.fetch_add(chunk_)) < tasks_;) (*job_)(begin, std::min(begin + chunk_, tasks_));
  }

  void serve() {
    uint64_t seen = 0;
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      wake_.wait(lock, [&] { return generation_ != seen; });
      seen = generation_;
      if (!open_) continue;
      ++active_;
      lock.unlock();
      work();
      lock.lock();
      if (--active_ == 0) done_.notify_one();
    }
  }

  int64_t size_ = 0;
  std::mutex run_mutex_, mutex_;
  std::condition_variable wake_, done_;
  const std::function<void(int64_t, int64_t)>* job_ = nullptr;
  int64_t tasks_ = 0, chunk_ = 1, active_ = 0;
  std::atomic<int64_t> next_{0};
  bool open_ = false;
  uint64_t generation_ = 0;
};

}  // namespace

namespace trtllm_gateway_cpu {

void spread(int64_t tasks, int64_t work, const std::function<void(int64_t, int64_t)>& fn) {
  if (at::get_num_threads() > 1) return at::parallel_for(0, tasks, 1, fn);  // the user asked for torch's threads
  static const int64_t cores = usable_cores();
  if (work < kSpreadWork || cores < 2 || tasks < 2) return fn(0, tasks);
  static Helpers* helpers = new Helpers(cores - 1);  // leaked on purpose: see the class
  helpers->run(tasks, fn);
}

}  // namespace trtllm_gateway_cpu
