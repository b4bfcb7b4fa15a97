// Work spread over every core the process may use, for the CPU kernels' large calls (a prompt's products, a busy
// decode step's products and attention), by helper threads that sleep between calls. torch's own threads are
// left at one by default, since OpenMP's spinning threads fought the HTTP front end for the second core (the
// demo model decoded 1.3-1.5x slower with two: benchmarks/RESULTS.md, 2026-11-23); these wake only for work that
// takes long enough to pay for waking them.

#include <ATen/Parallel.h>
#include <sched.h>

#include <algorithm>
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
// exit ends them).
class Helpers {
 public:
  explicit Helpers(int64_t count) {
    for (int64_t i = 0; i < count; ++i) std::thread([this, i] { serve(i + 1); }).detach();
    size_ = count;
  }

  // fn over [0, tasks) in size_ + 1 even parts, the first on the calling thread
  void run(int64_t tasks, const std::function<void(int64_t, int64_t)>& fn) {
    std::lock_guard<std::mutex> one_at_a_time(run_mutex_);
    const int64_t parts = size_ + 1;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      job_ = &fn, tasks_ = tasks, parts_ = parts, pending_ = size_, ++generation_;
    }
    wake_.notify_all();
    fn(0, tasks / parts);
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [this] { return pending_ == 0; });
  }

 private:
  void serve(int64_t part) {
    uint64_t seen = 0;
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      wake_.wait(lock, [&] { return generation_ != seen; });
      seen = generation_;
      const auto* job = job_;
      const int64_t tasks = tasks_, parts = parts_;
      lock.unlock();
      const int64_t begin = tasks * part / parts, end = tasks * (part + 1) / parts;
      if (begin < end) (*job)(begin, end);
      lock.lock();
      if (--pending_ == 0) done_.notify_one();
    }
  }

  int64_t size_ = 0;
  std::mutex run_mutex_, mutex_;
  std::condition_variable wake_, done_;
  const std::function<void(int64_t, int64_t)>* job_ = nullptr;
  int64_t tasks_ = 0, parts_ = 1, pending_ = 0;
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
