// Lesson 12: what is given to students (the communicators, the weight sources, the shard's shape
// and the engine's runner over the group), compiled with your exercises/ and with the reference.
#include <omp.h>
#include <unistd.h>
#if COURSE_HAVE_MPI
#include <mpi.h>
#endif

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <limits>
#include <exception>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <span>
#include <thread>
#include <utility>
#include <vector>
#include <csignal>
#include <pthread.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>

#include "common/errors.hpp"
#include "common/safetensors.hpp"
#include "common/timer.hpp"
#include "lessons/12_tensor_parallel/tensor_parallel.hpp"

namespace infer {

// ------------------------------------------------------------------ communicators --

void Communicator::all_reduce(float* data, long n) {
  require(n >= 0, "all_reduce: ", n, " floats");
  const Stopwatch timer;
  all_reduce_sum(data, n);
  stats_.seconds += timer.seconds();
  ++stats_.all_reduces;
  stats_.floats_reduced += n;
}

void Communicator::broadcast(std::vector<char>& bytes, int root) {
  require(root >= 0 && root < size(), "broadcast: root ", root, " in a group of ", size());
  const Stopwatch timer;
  broadcast_bytes(bytes, root);
  stats_.seconds += timer.seconds();
  ++stats_.broadcasts;
}

namespace {

/// What the threads of one group share: a barrier, and a place for each rank to show its buffer.
class ThreadGroupState {
 public:
  explicit ThreadGroupState(int size) : size_(size), floats_(size), bytes_(size) {}

  /// Returns once every rank has arrived (or throws once the group is broken).
  void barrier() {
    std::unique_lock lock(mutex_);
    check();
    const long generation = generation_;
    if (++arrived_ == size_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return;
    }
    cv_.wait(lock, [&] { return generation_ != generation || broken_; });
    check();
  }
  /// A rank failed: every rank's next (or current) collective throws.
  void breaks() {
    const std::lock_guard lock(mutex_);
    broken_ = true;
    cv_.notify_all();
  }

  const int size_;
  std::vector<float*> floats_;               // each rank's all_reduce buffer, during one
  std::vector<std::vector<char>*> bytes_;    // each rank's broadcast buffer, during one

 private:
  void check() const {
    if (broken_) throw Error("communicator: another rank of the group failed; this collective cannot complete");
  }
  std::mutex mutex_;
  std::condition_variable cv_;
  int arrived_ = 0;
  long generation_ = 0;
  bool broken_ = false;
};

class ThreadCommunicator final : public Communicator {
 public:
  ThreadCommunicator(std::shared_ptr<ThreadGroupState> group, int rank) : group_(std::move(group)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return group_->size_; }
  ThreadGroupState& group() { return *group_; }

 protected:
  void all_reduce_sum(float* data, long n) override {
    ThreadGroupState& g = *group_;
    g.floats_[rank_] = data;
    g.barrier();  // every buffer shown
    std::vector<float> sum(g.floats_[0], g.floats_[0] + n);
    for (int r = 1; r < g.size_; ++r)  // in rank order on every rank: the same floats everywhere
      for (long i = 0; i < n; ++i) sum[i] += g.floats_[r][i];
    g.barrier();  // every rank has read every buffer
    std::copy(sum.begin(), sum.end(), data);
  }
  void broadcast_bytes(std::vector<char>& bytes, int root) override {
    ThreadGroupState& g = *group_;
    g.bytes_[rank_] = &bytes;
    g.barrier();
    std::vector<char> copy;
    if (rank_ != root) copy = *g.bytes_[root];
    g.barrier();
    if (rank_ != root) bytes = std::move(copy);
  }

 private:
  std::shared_ptr<ThreadGroupState> group_;
  int rank_;
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> thread_group(int size) {
  require(size >= 1, "thread_group: a group of ", size, " ranks");
  auto state = std::make_shared<ThreadGroupState>(size);
  std::vector<std::unique_ptr<Communicator>> out;
  for (int r = 0; r < size; ++r) out.push_back(std::make_unique<ThreadCommunicator>(state, r));
  return out;
}

void run_ranks(int size, const std::function<void(Communicator&)>& work) {
  std::vector<std::unique_ptr<Communicator>> comms = thread_group(size);
  std::mutex mutex;
  std::exception_ptr first;
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r)
    threads.emplace_back([&, r] {
      try {
        omp_set_num_threads(1);  // this rank's OpenMP regions: one thread (the ranks are the parallelism)
        work(*comms[r]);
      } catch (...) {
        {
          const std::lock_guard lock(mutex);
          if (!first) first = std::current_exception();
        }
        static_cast<ThreadCommunicator&>(*comms[r]).group().breaks();
      }
    });
  for (std::thread& t : threads) t.join();
  if (first) std::rethrow_exception(first);
}

// ------------------------------------------------------------------------- MPI --

#if COURSE_HAVE_MPI
namespace {

/// MPI_COMM_WORLD: each rank a process, started by mpirun.
class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator() {
    int ready = 0;
    MPI_Initialized(&ready);
    if (!ready) {
      // One thread of a rank calls MPI at a time, but not always the main thread: a server loads
      // its shard on the main thread and runs its engine on another (SERIALIZED, not FUNNELED).
      int provided = 0;
      MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided);
      if (provided < MPI_THREAD_SERIALIZED)
        throw Error("this MPI library cannot be called from more than one thread of a process "
                    "(MPI_THREAD_SERIALIZED), which the engine's server needs");
      std::atexit([] {
        int done = 0;
        MPI_Finalized(&done);
        if (!done) MPI_Finalize();
      });
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

 protected:
  void all_reduce_sum(float* data, long n) override {
    require(n <= std::numeric_limits<int>::max(), "all_reduce: ", n, " floats in one call");
    MPI_Allreduce(MPI_IN_PLACE, data, static_cast<int>(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  }
  void broadcast_bytes(std::vector<char>& bytes, int root) override {
    long n = static_cast<long>(bytes.size());
    MPI_Bcast(&n, 1, MPI_LONG, root, MPI_COMM_WORLD);
    bytes.resize(static_cast<size_t>(n));
    if (n > 0) MPI_Bcast(bytes.data(), static_cast<int>(n), MPI_CHAR, root, MPI_COMM_WORLD);
  }

 private:
  int rank_ = 0, size_ = 1;
};

}  // namespace

bool have_mpi() { return true; }

Communicator& mpi_world() {
  static MpiCommunicator world;
  return world;
}
#else
bool have_mpi() { return false; }

Communicator& mpi_world() {
  throw Error("tensor parallelism across processes needs MPI, and this build has none (install openmpi-bin and "
              "libopenmpi-dev: ./course setup)");
}
#endif

namespace {

/// The processes below `root` (its children, theirs, and so on), read from /proc/PID/stat; none
/// where there is no /proc. Never throws: a process gone since the listing, or a listing cut
/// short, leaves it out.
std::vector<pid_t> descendants_of(pid_t root) noexcept {
  std::vector<pid_t> found;
  try {
    std::map<pid_t, pid_t> parent;
    std::error_code ec;
    for (std::filesystem::directory_iterator it("/proc", ec), end; !ec && it != end; it.increment(ec)) {
      const std::string name = it->path().filename().string();
      if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
      std::FILE* f = std::fopen((it->path() / "stat").c_str(), "r");
      if (!f) continue;  // gone since the listing
      char line[512] = {};
      const size_t n = std::fread(line, 1, sizeof line - 1, f);
      std::fclose(f);
      // "pid (comm) state ppid ...": comm may hold spaces and parentheses, so read after the last ')'.
      const char* close = std::strrchr(line, ')');
      char state = 0;
      int ppid = 0;
      if (n > 0 && close && std::sscanf(close + 1, " %c %d", &state, &ppid) == 2)
        parent[static_cast<pid_t>(std::stol(name))] = static_cast<pid_t>(ppid);
    }
    std::set<pid_t> below{root};
    for (bool grew = true; grew;) {
      grew = false;
      for (const auto& [pid, ppid] : parent)
        if (below.count(ppid) && below.insert(pid).second) grew = true, found.push_back(pid);
    }
  } catch (...) {  // (out of memory): the ones found so far
  }
  return found;
}

/// Whether process `pid` runs the executable `exe` and catches or blocks SIGUSR1 (a rank of ours
/// past launch_ranks()'s handler, or a server that sigwait()s): one that a SIGUSR1 stops cleanly.
bool reads_stops(pid_t pid, const std::filesystem::path& exe) noexcept {
  try {
    std::error_code ec;
    if (std::filesystem::read_symlink(cat("/proc/", pid, "/exe"), ec) != exe || ec) return false;
    std::FILE* f = std::fopen(cat("/proc/", pid, "/status").c_str(), "r");
    if (!f) return false;
    unsigned long long caught = 0, blocked = 0;
    char line[256];
    while (std::fgets(line, sizeof line, f)) {
      std::sscanf(line, "SigCgt: %llx", &caught);
      std::sscanf(line, "SigBlk: %llx", &blocked);
    }
    std::fclose(f);
    return ((caught | blocked) >> (SIGUSR1 - 1)) & 1;
  } catch (...) {
    return false;
  }
}

}  // namespace

namespace {
// The launcher's job, for its SIGTSTP handler: what runs below mpirun (each rank in a process group
// of its own, so that the terminal's Ctrl-Z reaches none of them), 0 past the end. Not mpirun: it
// waits on the ranks, and a SIGCONT to it makes it say "Forwarding signal 18".
constexpr int kJobSize = 256;
volatile std::sig_atomic_t job[kJobSize] = {};

/// Ctrl-Z: stops the job, then this process; on SIGCONT (fg, bg), continues the job.
void stop_the_job(int) {
  const int saved = errno;
  for (int i = 0; i < kJobSize && job[i] != 0; ++i) kill(static_cast<pid_t>(job[i]), SIGSTOP);
  struct sigaction plain {}, mine {};
  plain.sa_handler = SIG_DFL;
  sigaction(SIGTSTP, &plain, &mine);
  sigset_t s;
  sigemptyset(&s);
  sigaddset(&s, SIGTSTP);
  pthread_sigmask(SIG_UNBLOCK, &s, nullptr);
  raise(SIGTSTP);  // this process stops here, and goes on when continued
  sigaction(SIGTSTP, &mine, nullptr);
  for (int i = 0; i < kJobSize && job[i] != 0; ++i) kill(static_cast<pid_t>(job[i]), SIGCONT);
  errno = saved;
}

volatile std::sig_atomic_t stop_told = 0;   // a stop arrived: a rank's SIGUSR1, or the launcher's signal
volatile std::sig_atomic_t stop_signal = 0;  // the launcher: the first stop's signal (SIGPIPE: output closed)

// Rank 0, printing to the launcher's own output: a write there after its reader left (`| head`)
// raises SIGPIPE, which stops the run (as the signal ends one process) and leaves "signal 13" in
// the status file, by which the launcher ends by SIGPIPE too. A program that ignores SIGPIPE (the
// server) goes on, as it does in one process.
volatile std::sig_atomic_t output_gone = 0;
char status_file[1024] = {};  // rank 0's status file, for the handler (getenv is not for handlers)

void note_output_gone(int) {
  if (output_gone) return;
  output_gone = 1;
  stop_told = 1;
  const int saved = errno;
  const int fd = status_file[0] ? open(status_file, O_WRONLY | O_TRUNC | O_CLOEXEC) : -1;
  if (fd >= 0) {
    static const char line[] = "signal 13\n";
    [[maybe_unused]] const ssize_t n = write(fd, line, sizeof line - 1);
    close(fd);
  }
  errno = saved;
}
}  // namespace

bool stop_requested() { return stop_told != 0; }

namespace {

/// Where the launcher leaves rank 0's status file, and mpirun its session folder: $TMPDIR where it
/// names a folder by an absolute path that this user may write in, else /tmp (a TMPDIR that one
/// process never uses must not stop mpirun; launch_ranks() also falls back to /tmp where no file
/// can be made in it).
std::filesystem::path status_folder() {
  std::error_code ec;
  const char* env = std::getenv("TMPDIR");
  if (env && env[0] == '/' && std::filesystem::is_directory(env, ec) && access(env, W_OK | X_OK) == 0) return env;
  return "/tmp";
}

/// Removes the status files of launchers that died without removing theirs (SIGKILL): each is
/// named after its launcher's process id.
void forget_stale_statuses(const std::filesystem::path& folder) noexcept {
  try {
    std::error_code ec;
    for (std::filesystem::directory_iterator it(folder, ec), end; !ec && it != end; it.increment(ec)) {
      const std::string name = it->path().filename().string();
      int pid = 0;
      if (std::sscanf(name.c_str(), "course-rank0-%d-", &pid) == 1 && pid > 0 && kill(pid, 0) != 0 && errno == ESRCH)
        std::filesystem::remove(it->path(), ec);
    }
  } catch (...) {  // (out of memory): left for the next launcher
  }
}

/// The address of the socket named `name` in the abstract namespace (no file: nothing to remove,
/// whatever ends the launcher, and no folder's path to fit in an address); its length in `size`.
sockaddr_un abstract_address(const std::string& name, socklen_t& size) noexcept {
  sockaddr_un where{};
  where.sun_family = AF_UNIX;
  const size_t n = std::min(name.size(), sizeof where.sun_path - 1);
  std::memcpy(where.sun_path + 1, name.data(), n);  // (sun_path[0] = 0: abstract)
  size = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + n);
  return where;
}

/// The launcher's side of rank 0's output: a listening socket named `name` (after the status
/// file) that rank 0 connects to, to be handed the launcher's own stdout and stderr. -1 where it
/// cannot be made: rank 0's output then goes through mpirun.
int listen_for_rank0(const std::string& name) noexcept {
  socklen_t size = 0;
  const sockaddr_un where = abstract_address(name, size);
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return -1;
  if (bind(fd, reinterpret_cast<const sockaddr*>(&where), size) != 0 || listen(fd, 4) != 0) return close(fd), -1;
  return fd;
}

/// One byte with room beside it for two descriptors (SCM_RIGHTS): what the launcher sends rank 0.
struct TwoDescriptors {
  char byte = 'o';
  iovec data{&byte, 1};
  alignas(cmsghdr) char control[CMSG_SPACE(2 * sizeof(int))] = {};
  msghdr message{};
  TwoDescriptors() {
    message.msg_iov = &data;
    message.msg_iovlen = 1;
    message.msg_control = control;
    message.msg_controllen = sizeof control;
  }
  TwoDescriptors(const TwoDescriptors&) = delete;  // (it points into itself)
  TwoDescriptors& operator=(const TwoDescriptors&) = delete;
};

/// Accepts a connection on `listener` and, where it comes from rank 0 (`is_rank`: a process of
/// ours below mpirun, of this user), hands it this process's stdout and stderr. Whether it did:
/// another process that connects first is refused, and rank 0 waited for.
bool hand_output_to_rank0(int listener, const std::function<bool(pid_t)>& is_rank) noexcept {
  const int conn = accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
  if (conn < 0) return false;
  ucred peer{};
  socklen_t size = sizeof peer;
  if (getsockopt(conn, SOL_SOCKET, SO_PEERCRED, &peer, &size) != 0 || peer.uid != geteuid() || !is_rank(peer.pid))
    return close(conn), false;
  TwoDescriptors sent_fds;
  msghdr& message = sent_fds.message;
  cmsghdr* c = CMSG_FIRSTHDR(&message);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(2 * sizeof(int));
  const int fds[2] = {STDOUT_FILENO, STDERR_FILENO};
  std::memcpy(CMSG_DATA(c), fds, sizeof fds);
  const bool sent = sendmsg(conn, &message, MSG_NOSIGNAL) == 1;
  close(conn);
  return sent;
}

/// Rank 0's side: takes the launcher's stdout and stderr from the socket named `name` as its own,
/// so that what it prints reaches the user in the order it printed it (through mpirun, stdout and
/// stderr travel apart, and a line of stderr landed inside the text). From then on a write after
/// the output's reader left is a stop (note_output_gone()), and a write to a terminal is not
/// stopped for coming from outside its foreground (`stty tostop`: rank 0 runs in mpirun's process
/// group). Where anything fails, rank 0 keeps the output mpirun gave it.
void take_output_from_launcher(const char* name) noexcept {
  socklen_t address_size = 0;
  const sockaddr_un where = abstract_address(name, address_size);
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return;
  timeval wait{10, 0};  // (the launcher answers within 20 ms; not forever, should it be stopped)
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &wait, sizeof wait);
  TwoDescriptors received;
  msghdr& message = received.message;
  ssize_t got = -1;
  if (connect(fd, reinterpret_cast<const sockaddr*>(&where), address_size) == 0)
    do got = recvmsg(fd, &message, MSG_CMSG_CLOEXEC);
    while (got < 0 && errno == EINTR);
  close(fd);
  const cmsghdr* c = got == 1 ? CMSG_FIRSTHDR(&message) : nullptr;
  if (!c || c->cmsg_type != SCM_RIGHTS || c->cmsg_len != CMSG_LEN(2 * sizeof(int))) return;
  int fds[2];
  std::memcpy(fds, CMSG_DATA(c), sizeof fds);
  if (const char* status = std::getenv("COURSE_RANK0_STATUS"); status && std::strlen(status) < sizeof status_file)
    std::strcpy(status_file, status);
  struct sigaction gone {};
  sigemptyset(&gone.sa_mask);
  gone.sa_flags = SA_RESTART;
  gone.sa_handler = note_output_gone;
  sigaction(SIGPIPE, &gone, nullptr);
  std::signal(SIGTTOU, SIG_IGN);
  std::fflush(nullptr);
  dup2(fds[0], STDOUT_FILENO);
  dup2(fds[1], STDERR_FILENO);
  close(fds[0]), close(fds[1]);
}

}  // namespace

int rank_result(int status) {
  const char* path = std::getenv("COURSE_RANK0_STATUS");
  const char* rank = std::getenv("OMPI_COMM_WORLD_RANK");
  if (!path || !rank || std::string(rank) != "0") return status;
  std::fflush(nullptr);  // (what it printed is out before the launcher may end)
  if (output_gone) return 0;  // (the status file says SIGPIPE: the launcher ends by it, as one process would)
  std::FILE* f = std::fopen(path, "w");
  if (!f) return status;
  std::fprintf(f, "%d\n", status);
  return std::fclose(f) == 0 ? 0 : status;
}

void end_as_stopped() {
  if (stop_signal == 0) return;
  std::fflush(nullptr);
  std::signal(stop_signal, SIG_DFL);
  sigset_t s;
  sigemptyset(&s);
  sigaddset(&s, stop_signal);
  pthread_sigmask(SIG_UNBLOCK, &s, nullptr);
  raise(stop_signal);
}

int launch_ranks(int ranks, int argc, char** argv, const std::string& program) {
  require(ranks >= 1, program, ": --tensor-parallel-size ", ranks, " (at least 1)");
  // Open MPI tells each process it starts its place in the job through the environment.
  const bool under_mpirun = std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMI_SIZE") || std::getenv("PMIX_RANK");
  if (under_mpirun) {
    // (A seam for tests/common/stop_over_ranks_test.py: a rank that takes this long to start, so
    // that a stop told before it can hear one would kill it every time, not in a window of a few
    // milliseconds.)
    if (const char* delay = std::getenv("COURSE_TEST_RANK_START_DELAY_MS"))
      usleep(1000 * std::clamp(std::atoi(delay), 0, 5000));
    // The stop passed on below, as a flag the program reads (SA_RESTART: MPI's own calls carry on).
    // Installed before MPI starts its threads; a thread that blocks SIGUSR1 (the server) never runs it.
    // SIGINT, SIGTERM and SIGHUP are the same stop where they reach a rank itself: a service
    // manager stops every process of the service at once (systemd's default, a batch system's
    // cancel), mpirun among them, which then ends the ranks a second later; meanwhile each finishes
    // its step, and rank 0 says what it did, as one process would. (A signal ignored when the rank
    // began stays ignored.)
    struct sigaction note_stop {}, was {};
    sigemptyset(&note_stop.sa_mask);
    note_stop.sa_flags = SA_RESTART;
    note_stop.sa_handler = [](int) { stop_told = 1; };
    for (int sig : {SIGUSR1, SIGINT, SIGTERM, SIGHUP})
      if (sigaction(sig, nullptr, &was) == 0 && (sig == SIGUSR1 || was.sa_handler != SIG_IGN))
        sigaction(sig, &note_stop, nullptr);
    const char* output = std::getenv("COURSE_RANK0_OUTPUT");
    const char* rank = std::getenv("OMPI_COMM_WORLD_RANK");
    if (output && rank && std::string(rank) == "0") take_output_from_launcher(output);
    Communicator& world = mpi_world();
    require(world.size() == ranks, program, ": --tensor-parallel-size ", ranks, ", but mpirun started ", world.size(),
            " ranks");
    return -1;
  }
  if (!have_mpi()) mpi_world();  // throws, saying what to install
  std::vector<std::string> args{"mpirun", "-n", std::to_string(ranks)};
  if (geteuid() == 0) args.push_back("--allow-run-as-root");  // containers often run as root
  args.push_back("--oversubscribe");  // mpirun counts slots by cores, and the ranks may share them
  args.insert(args.end(), {"--stdin", "none"});
  for (int i = 0; i < argc; ++i) args.emplace_back(argv[i]);
  std::vector<char*> raw;
  for (std::string& a : args) raw.push_back(a.data());
  raw.push_back(nullptr);
  // Ctrl-C, SIGTERM and SIGHUP held back from here until the handlers below are in place (a
  // program that has not blocked them itself, as generate, would otherwise die of one between fork
  // and sigaction, leaving mpirun running in its own process group); the old mask comes back at the end.
  sigset_t stop_signals, old_mask;
  sigemptyset(&stop_signals);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) sigaddset(&stop_signals, sig);
  pthread_sigmask(SIG_BLOCK, &stop_signals, &old_mask);
  // mpirun's stdout comes through this process (below): were it the terminal's or a pipe's own,
  // a reader that closes early (`| head`) would crash mpirun (Open MPI 4.1 aborts on SIGPIPE).
  int out[2] = {-1, -1};
  if (pipe(out) != 0) pthread_sigmask(SIG_SETMASK, &old_mask, nullptr);
  require(out[0] >= 0 && out[1] >= 0, program, ": cannot make a pipe for mpirun's output");
  // Where rank 0 leaves the status of a run that ended normally but failed (rank_result()): a
  // rank's non-zero exit would have mpirun print that it aborted the job.
  // (The first folder where a file can be made: one that only looks writable, as /proc does to
  // root, falls back to /tmp; mpirun is given the same one for its session.)
  std::filesystem::path tmp = status_folder();
  std::string status_template;
  int status_fd = -1;
  for (const std::filesystem::path& folder : {tmp, std::filesystem::path("/tmp")}) {
    forget_stale_statuses(folder);
    status_template = (folder / cat("course-rank0-", getpid(), "-XXXXXX")).string();
    status_fd = mkstemp(status_template.data());
    tmp = folder;
    if (status_fd >= 0) break;
  }
  char* status_path = status_template.data();
  if (status_fd >= 0) close(status_fd), setenv("COURSE_RANK0_STATUS", status_path, 1);
  // Where rank 0 takes this process's stdout and stderr from, to print in order (take_output_from_launcher()).
  const std::string output_name = status_fd >= 0 ? std::filesystem::path(status_path).filename().string() : "";
  int listener = status_fd >= 0 ? listen_for_rank0(output_name) : -1;
  if (listener >= 0) setenv("COURSE_RANK0_OUTPUT", output_name.c_str(), 1);
  const pid_t me = getpid();
  const pid_t child = fork();
  if (child != 0) unsetenv("COURSE_RANK0_STATUS"), unsetenv("COURSE_RANK0_OUTPUT");  // (mpirun's copy keeps them)
  if (child < 0 && status_fd >= 0) std::remove(status_path);
  if (child < 0 && listener >= 0) close(listener);
  if (child < 0) pthread_sigmask(SIG_SETMASK, &old_mask, nullptr), close(out[0]), close(out[1]);
  require(child >= 0, program, ": cannot start mpirun");
  if (child == 0) {
    // mpirun in a process group of its own: Ctrl-C reaches this process alone, which passes it
    // on (below). Were mpirun to take SIGINT itself, it would abort the job: SIGTERM to every
    // rank, SIGKILL a second later, exit status 1, whatever the ranks were doing. It starts with
    // no signal blocked (a server blocks them before it gets here), reads no stdin (a process
    // group in the background that reads the terminal is stopped), and gets SIGTERM (it aborts
    // the job) if this process dies without passing a stop on (SIGKILL, SIGQUIT).
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != me) _exit(1);  // (died already, before the line above)
    dup2(out[1], STDOUT_FILENO);
    close(out[0]), close(out[1]);
    setenv("TMPDIR", tmp.c_str(), 1);  // (where mpirun keeps its session: a folder it can write in)
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    execvp("mpirun", raw.data());
    std::fprintf(stderr, "error: %s: cannot run mpirun (install openmpi-bin: ./course setup)\n", program.c_str());
    _exit(127);
  }
  close(out[1]);
  setpgid(child, child);  // also here, so that it holds before the first signal arrives
  // This process waits for mpirun and copies its stdout. The first SIGINT, SIGTERM or SIGHUP (or
  // its stdout's reader gone) is passed on as SIGUSR1 to each rank below mpirun, as soon as that
  // rank catches it (launch_ranks()'s handler, above) or blocks it (a server's sigwait()): told any
  // earlier, a rank would die of it, and mpirun say so. Ranks that appear after the stop are told
  // as they get there; a rank that hears it twice stops once. mpirun itself is not told: it would
  // forward the signal to ranks not ready for it (by default; not every build does), and print
  // that it did. After a second stop, mpirun gets SIGTERM and aborts the job; a second that comes
  // within 5 ms of the first is the same stop (`timeout` signals the program, then at once its
  // process group). The handler only counts; the loop below does the telling (reading /proc is not
  // for a handler), every 20 ms. A signal this process ignored when it began (nohup, `trap '' INT`)
  // stays ignored, as it would be by one process.
  static volatile sig_atomic_t stops = 0;
  static volatile long long first_stop_ns = 0;
  stops = 0;
  stop_signal = 0;
  struct sigaction count_stop {}, old[3] {}, ignore {}, old_pipe {};
  sigemptyset(&count_stop.sa_mask);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) sigaddset(&count_stop.sa_mask, sig);  // one at a time: two count as two
  count_stop.sa_handler = [](int sig) {
    timespec now{};
    clock_gettime(CLOCK_MONOTONIC, &now);
    const long long ns = now.tv_sec * 1000000000LL + now.tv_nsec;
    if (stops == 0) first_stop_ns = ns;
    else if (ns - first_stop_ns < 5000000LL) return;
    if (stop_signal == 0) stop_signal = sig;
    stops = stops + 1;
  };
  const int caught[3] = {SIGINT, SIGTERM, SIGHUP};
  bool kept_ignored[3] = {};
  for (int i = 0; i < 3; ++i) {
    sigaction(caught[i], nullptr, &old[i]);
    kept_ignored[i] = old[i].sa_handler == SIG_IGN;
    if (!kept_ignored[i]) sigaction(caught[i], &count_stop, nullptr);
  }
  ignore.sa_handler = SIG_IGN;  // a closed reader is seen as EPIPE from write(), not as a signal
  sigaction(SIGPIPE, &ignore, &old_pipe);
  job[0] = 0;
  struct sigaction pass_tstp {}, old_tstp {};
  sigemptyset(&pass_tstp.sa_mask);
  pass_tstp.sa_handler = stop_the_job;
  sigaction(SIGTSTP, nullptr, &old_tstp);
  const bool job_control = old_tstp.sa_handler == SIG_DFL;  // (not where it is ignored: no job control)
  if (job_control) sigaction(SIGTSTP, &pass_tstp, nullptr);
  pthread_sigmask(SIG_UNBLOCK, &stop_signals, nullptr);
  std::error_code ec;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  int status = 0;
  std::set<pid_t> told;  // the ranks told so far
  // A stop reaches a rank as SIGUSR1 carrying its number (1, then 2 for a second stop), which a
  // rank that sigwait()s reads (the server: the first stop drains, a second ends what is left).
  const auto tell = [](pid_t rank, int nth) {
    sigval which{};
    which.sival_int = nth;
    sigqueue(rank, SIGUSR1, which);
  };
  bool aborted = false, output_open = true, stop_seen = false, said_waiting = false, told_mpirun = false;
  Stopwatch since_stop;
  bool handed = false;  // rank 0 prints straight to this process's stdout and stderr
  // Passes on what has arrived: called every 20 ms, and while a write to a slow reader waits.
  Stopwatch since_listed;
  const auto pass_on = [&] {
    // The job as it is now, for a Ctrl-Z (SIGTSTP blocked while it is written): every 20 ms until
    // the ranks are all there, then every second (reading /proc costs a core's time).
    if (job_control && (job[std::min(ranks, kJobSize) - 1] == 0 || since_listed.seconds() > 1)) {
      since_listed.reset();
      sigset_t tstp, before;
      sigemptyset(&tstp);
      sigaddset(&tstp, SIGTSTP);
      pthread_sigmask(SIG_BLOCK, &tstp, &before);
      int n = 0;
      for (const pid_t p : descendants_of(child))
        if (n + 1 < kJobSize) job[n++] = p;
      job[n] = 0;
      pthread_sigmask(SIG_SETMASK, &before, nullptr);
    }
    if (stops > 0) {
      if (!stop_seen) since_stop.reset(), stop_seen = true;
      for (const pid_t rank : descendants_of(child))
        if (!told.count(rank) && reads_stops(rank, exe)) tell(rank, 1), told.insert(rank);
      if (exe.empty() && !told_mpirun) kill(child, SIGUSR1), told_mpirun = true;  // (no /proc: mpirun forwards it)
      // Rank 0 waiting a second on an output whose reader stopped reading would never reach
      // the end of its step: the job ends now, as one process would at the signal.
      pollfd o{STDOUT_FILENO, POLLOUT, 0};
      if (handed && !aborted && since_stop.seconds() > 1 && poll(&o, 1, 0) == 0) {
        pollfd e{STDERR_FILENO, POLLOUT, 0};
        if (poll(&e, 1, 0) == 1)
          std::fprintf(stderr, "\n[%s: the output's reader stopped reading: mpirun ends every rank now]\n",
                       program.c_str());
        kill(child, SIGTERM), aborted = true;
      }
      // (Not where rank 0 has reached its end already: mpirun, stopped too, is ending the job.)
      struct stat left {};
      const bool rank0_done = status_fd >= 0 && stat(status_path, &left) == 0 && left.st_size > 0;
      if (!said_waiting && !aborted && !rank0_done && since_stop.seconds() > 1 && stop_signal != SIGPIPE) {
        std::fprintf(stderr, "\n[%s: stopping: the ranks are ending what they do; a second Ctrl-C ends them at once]\n",
                     program.c_str());
        said_waiting = true;
      }
    }
    if (stops > 1 && !aborted) {
      std::fprintf(stderr, "\n[%s: a second stop: mpirun ends every rank now]\n", program.c_str());
      for (const pid_t rank : told) tell(rank, 2);  // (mpirun's own SIGTERM reaches them a second later)
      kill(child, SIGTERM), aborted = true;
    }
  };
  // Copies n bytes of mpirun's output to this process's; a reader gone is a stop, and from then on
  // the output is read and dropped, so that mpirun never waits on it.
  std::vector<char> buffer(1 << 16);
  const auto copy_out = [&](ssize_t n) {
    for (ssize_t at = 0; output_open && at < n;) {
      const ssize_t w = write(STDOUT_FILENO, buffer.data() + at, static_cast<size_t>(n - at));
      if (w > 0) {
        at += w;
      } else if (errno == EINTR) {  // a signal while the reader is slow: pass it on, and after a stop
        pass_on();                     // drop the rest rather than wait for a reader that may never read
        if (stops > 0) output_open = false;
      } else {
        output_open = false;
        if (stop_signal == 0) stop_signal = SIGPIPE;
        stops = stops + 1;
      }
    }
  };
  const auto is_rank = [&](pid_t pid) {  // (a process of ours below mpirun: no other may take the output)
    const std::vector<pid_t> below = descendants_of(child);
    return std::find(below.begin(), below.end(), pid) != below.end() && reads_stops(pid, exe);
  };
  while (true) {
    const pid_t done = waitpid(child, &status, WNOHANG);
    if (done == child || (done < 0 && errno != EINTR)) break;
    pollfd p[2] = {{out[0], POLLIN, 0}, {listener, POLLIN, 0}};  // (a negative fd is left out)
    if (out[0] < 0 && listener < 0) {
      usleep(20000);
    } else if (poll(p, 2, 20) > 0) {
      if (p[1].revents & POLLIN && hand_output_to_rank0(listener, is_rank)) handed = true, close(listener), listener = -1;
      if (p[0].revents != 0) {
        const ssize_t n = read(out[0], buffer.data(), buffer.size());
        if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN)) close(out[0]), out[0] = -1;  // (mpirun closed it)
        if (n > 0) copy_out(n);
      }
    }
    pass_on();
  }
  if (listener >= 0) close(listener);  // (rank 0 ended before it asked)
  if (out[0] >= 0) {  // what mpirun wrote before it ended (not waiting for any process that kept the pipe)
    fcntl(out[0], F_SETFL, O_NONBLOCK);
    for (ssize_t n; output_open && (n = read(out[0], buffer.data(), buffer.size())) > 0;) copy_out(n);
    close(out[0]);
  }
  for (int i = 0; i < 3; ++i)
    if (!kept_ignored[i]) sigaction(caught[i], &old[i], nullptr);
  sigaction(SIGPIPE, &old_pipe, nullptr);
  if (job_control) sigaction(SIGTSTP, &old_tstp, nullptr);
  job[0] = 0;
  pthread_sigmask(SIG_SETMASK, &old_mask, nullptr);
  int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  bool rank0_ended = false;  // rank 0 reached the end of its run, and left its status (rank_result())
  if (status_fd >= 0) {
    if (std::FILE* f = std::fopen(status_path, "r")) {
      char line[64] = {};
      int left = 0;
      if (std::fgets(line, sizeof line, f)) {
        if (std::sscanf(line, "signal %d", &left) == 1 && left == SIGPIPE) {
          // rank 0 wrote after the output's reader left, and stopped: this process ends by SIGPIPE
          if (code == 0 && stop_signal == 0) stop_signal = SIGPIPE;
          if (code == 0) stops = stops + 1, code = 128 + SIGPIPE;
        } else if (std::sscanf(line, "%d", &left) == 1) {
          // After a stop, rank 0's own ending is the program's: mpirun ends the job failed
          // where the stop reached it too (a service manager signals every process at once) or
          // where a second stop aborted it, rank 0 having ended in time.
          rank0_ended = true;
          if (code == 0 || stops > 0) code = left;
        }
      }
      std::fclose(f);
    }
    std::remove(status_path);
  }
  if (stops > 0) stop_told = 1;  // (stop_requested() here too: the program says how a stop ends)
  // A rank ended by the SIGUSR1 it was told with, or a job that mpirun ended (aborted by a second
  // stop, or one that reached mpirun too) before rank 0 got to its end: a stop asked for, said as
  // the shell says it.
  if (stops > 0 && !rank0_ended && (aborted || code != 0)) code = 128 + stop_signal;
  return code;
}

// ------------------------------------------------------------------ weight sources --

namespace {

/// Every tensor name a model of shape `c` has, with its shape (rows, cols; cols 0 for a vector).
std::map<std::string, std::pair<long, long>> expected_tensors(const ModelConfig& c) {
  const long d = c.hidden_size, q = long(c.num_attention_heads) * c.head_dim,
             kv = long(c.num_key_value_heads) * c.head_dim, h = c.intermediate_size;
  std::map<std::string, std::pair<long, long>> t{{"model.embed_tokens.weight", {c.vocab_size, d}},
                                                 {"model.norm.weight", {d, 0}},
                                                 {"lm_head.weight", {c.vocab_size, d}}};
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = cat("model.layers.", i, ".");
    t[p + "input_layernorm.weight"] = {d, 0};
    t[p + "post_attention_layernorm.weight"] = {d, 0};
    t[p + "self_attn.q_proj.weight"] = {q, d};
    t[p + "self_attn.k_proj.weight"] = {kv, d};
    t[p + "self_attn.v_proj.weight"] = {kv, d};
    t[p + "self_attn.o_proj.weight"] = {d, q};
    t[p + "mlp.gate_proj.weight"] = {h, d};
    t[p + "mlp.up_proj.weight"] = {h, d};
    t[p + "mlp.down_proj.weight"] = {d, h};
  }
  return t;
}

/// The common checks: a known matrix, a range inside it.
std::pair<long, long> matrix_shape(const std::map<std::string, std::pair<long, long>>& shapes, const std::string& name,
                                   const char* who) {
  const auto it = shapes.find(name);
  require(it != shapes.end() && it->second.second > 0, who, ": '", name, "' is not a matrix of the model");
  return it->second;
}

void check_range(long first, long count, long n, const std::string& name, const char* what) {
  require(first >= 0 && count >= 0 && first + count <= n, "weights: ", what, " [", first, ", ", first + count,
          ") of '", name, "', which has ", n);
}

class MemoryWeights final : public WeightSource {
 public:
  explicit MemoryWeights(const ModelWeights& model) : model_(model), shapes_(expected_tensors(model.config)) {
    matrices_["model.embed_tokens.weight"] = &model.embed_tokens;
    matrices_["lm_head.weight"] = &model.lm_head;
    vectors_["model.norm.weight"] = &model.norm;
    for (int i = 0; i < model.config.num_hidden_layers; ++i) {
      const std::string p = cat("model.layers.", i, ".");
      const LayerWeights& l = model.layers[static_cast<size_t>(i)];
      vectors_[p + "input_layernorm.weight"] = &l.input_layernorm;
      vectors_[p + "post_attention_layernorm.weight"] = &l.post_attention_layernorm;
      matrices_[p + "self_attn.q_proj.weight"] = &l.q_proj;
      matrices_[p + "self_attn.k_proj.weight"] = &l.k_proj;
      matrices_[p + "self_attn.v_proj.weight"] = &l.v_proj;
      matrices_[p + "self_attn.o_proj.weight"] = &l.o_proj;
      matrices_[p + "mlp.gate_proj.weight"] = &l.gate_proj;
      matrices_[p + "mlp.up_proj.weight"] = &l.up_proj;
      matrices_[p + "mlp.down_proj.weight"] = &l.down_proj;
    }
  }
  const ModelConfig& config() const override { return model_.config; }
  Matrix rows(const std::string& name, long first, long count) override {
    const Matrix& m = find(name);
    check_range(first, count, m.rows(), name, "rows");
    bytes_read_ += count * m.cols() * static_cast<long>(sizeof(float));
    return m.middleRows(first, count);
  }
  Matrix cols(const std::string& name, long first, long count) override {
    const Matrix& m = find(name);
    check_range(first, count, m.cols(), name, "columns");
    bytes_read_ += count * m.rows() * static_cast<long>(sizeof(float));
    return m.middleCols(first, count);
  }
  Matrix matrix(const std::string& name) override { return rows(name, 0, find(name).rows()); }
  Vector vector(const std::string& name) override {
    const auto it = vectors_.find(name);
    require(it != vectors_.end(), "memory_weights: '", name, "' is not a vector of the model");
    bytes_read_ += it->second->size() * static_cast<long>(sizeof(float));
    return *it->second;
  }

 private:
  const Matrix& find(const std::string& name) const {
    matrix_shape(shapes_, name, "memory_weights");
    return *matrices_.at(name);
  }
  const ModelWeights& model_;
  std::map<std::string, std::pair<long, long>> shapes_;
  std::map<std::string, const Matrix*> matrices_;
  std::map<std::string, const Vector*> vectors_;
};

class FileWeights final : public WeightSource {
 public:
  explicit FileWeights(const std::string& dir)
      : config_(load_config((std::filesystem::path(dir) / "config.json").string())),
        file_((std::filesystem::path(dir) / "model.safetensors").string()),
        shapes_(expected_tensors(config_)),
        where_("model '" + (std::filesystem::path(dir) / "model.safetensors").string() + "'") {
    tied_ = config_.tie_word_embeddings && !file_.has("lm_head.weight");
    for (const auto& [name, shape] : shapes_) {
      if (name == "lm_head.weight" && tied_) continue;
      const std::vector<long> expected =
          shape.second > 0 ? std::vector<long>{shape.first, shape.second} : std::vector<long>{shape.first};
      require(file_.has(name), where_, ": missing tensor '", name, "' (expected shape ", shape_string(expected), ")");
      require(file_.shape(name) == expected, where_, ": tensor '", name, "' has shape ", shape_string(file_.shape(name)),
              ", expected ", shape_string(expected), " from config.json");
    }
  }
  const ModelConfig& config() const override { return config_; }
  Matrix rows(const std::string& name, long first, long count) override {
    const auto [r, c] = matrix_shape(shapes_, name, "file_weights");
    check_range(first, count, r, name, "rows");
    return take(file_.read(stored(name), first, count, 0, c));
  }
  Matrix cols(const std::string& name, long first, long count) override {
    const auto [r, c] = matrix_shape(shapes_, name, "file_weights");
    check_range(first, count, c, name, "columns");
    return take(file_.read(stored(name), 0, r, first, count));
  }
  Matrix matrix(const std::string& name) override {
    const auto [r, c] = matrix_shape(shapes_, name, "file_weights");
    return rows(name, 0, r);
  }
  Vector vector(const std::string& name) override {
    const auto it = shapes_.find(name);
    require(it != shapes_.end() && it->second.second == 0, "file_weights: '", name, "' is not a vector of the model");
    Tensor t = file_.read(name);
    bytes_read_ += static_cast<long>(t.data.size() * sizeof(float));
    return Eigen::Map<Vector>(t.data.data(), static_cast<long>(t.data.size()));
  }

 private:
  std::string stored(const std::string& name) const {
    return name == "lm_head.weight" && tied_ ? "model.embed_tokens.weight" : name;
  }
  Matrix take(Tensor t) {
    bytes_read_ += static_cast<long>(t.data.size() * sizeof(float));
    return Eigen::Map<Matrix>(t.data.data(), t.shape[0], t.shape[1]);
  }
  ModelConfig config_;
  SafetensorsFile file_;
  std::map<std::string, std::pair<long, long>> shapes_;
  std::string where_;
  bool tied_ = false;
};

}  // namespace

std::unique_ptr<WeightSource> file_weights(const std::string& dir) {
  require(std::filesystem::is_directory(dir), "model: '", dir,
          "' is not a directory (expected config.json and model.safetensors in it)");
  return std::make_unique<FileWeights>(dir);
}

std::unique_ptr<WeightSource> memory_weights(const ModelWeights& model) { return std::make_unique<MemoryWeights>(model); }

ModelWeights load_model_for(const std::string& dir, Communicator* comm) {
  if (!comm) return load_model(dir);
  auto file = file_weights(dir);
  return load_shard(*file, shard_plan(file->config(), comm->rank(), comm->size()));
}

ModelConfig rank_config(const ModelConfig& config, const ShardPlan& plan) {
  ModelConfig c = config;
  c.num_attention_heads = static_cast<int>(plan.heads.size());
  c.num_key_value_heads = static_cast<int>(plan.kv_heads.size());
  c.intermediate_size = static_cast<int>(plan.units.size());
  require(c.num_attention_heads > 0 && c.num_key_value_heads > 0 && c.intermediate_size > 0 &&
              c.num_attention_heads % c.num_key_value_heads == 0,
          "rank_config: a shard of ", c.num_attention_heads, " query heads, ", c.num_key_value_heads, " K/V heads and ",
          c.intermediate_size, " units (each must be positive, the K/V heads dividing the query heads)");
  return c;
}

// ------------------------------------------------------------ the engine's runner --

namespace {

/// A step as bytes: what rank 0 broadcasts.
class Writer {
 public:
  void put(int v) { append(&v, sizeof v); }
  void append(const void* p, size_t n) {
    if (n == 0) return;
    const auto* c = static_cast<const char*>(p);
    bytes.insert(bytes.end(), c, c + n);
  }
  std::vector<char> bytes;
};

class Reader {
 public:
  explicit Reader(const std::vector<char>& bytes) : bytes_(bytes) {}
  int get() {
    int v = 0;
    take(&v, sizeof v);
    return v;
  }
  void take(void* p, size_t n) {
    require(at_ + n <= bytes_.size(), "TensorParallelRunner: a step message ends early");
    if (n > 0) std::memcpy(p, bytes_.data() + at_, n);  // an empty vector's data() may be null
    at_ += n;
  }

 private:
  const std::vector<char>& bytes_;
  size_t at_ = 0;
};

/// Runs `work` with this thread's OpenMP regions on one thread, as before afterwards.
template <typename Work>
auto on_one_thread(Work&& work) {
  struct Restore {
    int threads;
    ~Restore() { omp_set_num_threads(threads); }
  } restore{omp_get_max_threads()};
  omp_set_num_threads(1);
  return work();
}

/// Rank 0's paged pool: PagedKVPool's rows, with every copy_block() (copy-on-write, decided by
/// rank 0's memory) remembered until the next step tells the other ranks.
class RecordingPool final : public KVBlockPool {
 public:
  RecordingPool(const ModelConfig& config, int num_blocks, int block_size)
      : KVBlockPool(config, num_blocks, block_size), rows_(config, num_blocks, block_size) {}
  void write(int layer, std::span<const int> slots, ConstMatrixRef k, ConstMatrixRef v) override {
    rows_.write(layer, slots, k, v);
  }
  void read(int layer, std::span<const int> slots, bool keys, Matrix& out) const override {
    rows_.read(layer, slots, keys, out);
  }
  void copy_block(int src, int dst) override {
    rows_.copy_block(src, dst);
    copies_.push_back(src);
    copies_.push_back(dst);
  }
  Matrix attend(int layer, ConstMatrixRef q, std::span<const int> block_table, int length, int num_heads,
                int num_kv_heads, int head_dim) const override {
    return rows_.attend(layer, q, block_table, length, num_heads, num_kv_heads, head_dim);
  }
  /// The copies since the last call, as (src, dst) pairs flattened.
  std::vector<int> take_copies() { return std::exchange(copies_, {}); }

 private:
  PagedKVPool rows_;
  std::vector<int> copies_;
};

/// A follower's view of one sequence in its pool for one step: rank 0's block table and length,
/// over this rank's rows (the blocks rank 0 reserved for the step cover every position it writes).
class MirroredStore final : public KVStore {
 public:
  MirroredStore(KVBlockPool& pool, std::vector<int> table, int length)
      : pool_(pool), table_(std::move(table)), length_(static_cast<size_t>(pool.num_layers()), length) {}
  using KVStore::length;
  int num_layers() const override { return pool_.num_layers(); }
  int length(int layer) const override { return length_.at(static_cast<size_t>(layer)); }
  int max_tokens() const override {
    return std::min(pool_.context(), static_cast<int>(table_.size()) * pool_.block_size());
  }
  void append(int layer, ConstMatrixRef k, ConstMatrixRef v) override {
    const int first = length(layer), n = static_cast<int>(k.rows());
    require(first + n <= max_tokens(), "TensorParallelRunner: rank 0's block table holds ", max_tokens(),
            " positions, and the step appends up to position ", first + n);
    pool_.write(layer, slots(first, n), k, v);
    length_[static_cast<size_t>(layer)] += n;
  }
  ConstMatrixRef keys(int layer) const override { return gather(layer, true, keys_); }
  ConstMatrixRef values(int layer) const override { return gather(layer, false, values_); }
  void reset() override { std::fill(length_.begin(), length_.end(), 0); }
  Matrix attend(int layer, ConstMatrixRef q, int num_heads, int num_kv_heads, int head_dim) const override {
    return pool_.attend(layer, q, table_, length(layer), num_heads, num_kv_heads, head_dim);
  }
  bool attends_over_keys() const override { return false; }  // as rank 0's paged caches: the same sums
  size_t bytes_used() const override {
    return static_cast<size_t>(length()) * pool_.bytes_per_block() / static_cast<size_t>(pool_.block_size());
  }
  size_t bytes_reserved() const override { return table_.size() * pool_.bytes_per_block(); }

 private:
  /// The pool slots of positions [first, first + n): PagedKVCache::slot()'s rule over rank 0's table.
  std::vector<int> slots(int first, int n) const {
    const int b = pool_.block_size();
    std::vector<int> out(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) out[static_cast<size_t>(i)] = table_[static_cast<size_t>((first + i) / b)] * b + (first + i) % b;
    return out;
  }
  ConstMatrixRef gather(int layer, bool keys, Matrix& out) const {
    pool_.read(layer, slots(0, length(layer)), keys, out);
    return out;
  }
  KVBlockPool& pool_;
  std::vector<int> table_;
  std::vector<int> length_;
  mutable Matrix keys_, values_;
};

}  // namespace

TensorParallelRunner::TensorParallelRunner(const ModelWeights& shard, ModelProjections projections, Communicator& comm,
                                           int slots)
    : shard_(shard), projections_(std::move(projections)), comm_(comm) {
  require(slots >= 1, "TensorParallelRunner: ", slots, " slots");
  projections_.check(shard_.config);
  for (int i = 0; i < slots; ++i) {
    own_.push_back(std::make_unique<KVCache>(shard_.config, shard_.config.max_position_embeddings));
    slots_.push_back(own_.back().get());
  }
}

TensorParallelRunner::TensorParallelRunner(const ModelWeights& shard, ModelProjections projections, Communicator& comm,
                                           int num_blocks, int block_size)
    : shard_(shard), projections_(std::move(projections)), comm_(comm) {
  projections_.check(shard_.config);
  if (comm_.rank() == 0)
    own_pool_ = std::make_unique<RecordingPool>(shard_.config, num_blocks, block_size);
  else
    own_pool_ = std::make_unique<PagedKVPool>(shard_.config, num_blocks, block_size);
  pool_ = own_pool_.get();
}

TensorParallelRunner::~TensorParallelRunner() {
  if (comm_.rank() != 0 || stopped_) return;
  try {
    std::vector<char> stop;  // an empty step: the followers return
    comm_.broadcast(stop, 0);
  } catch (const std::exception&) {  // a broken group: the followers are gone already
  }
}

std::unique_ptr<KVManager> TensorParallelRunner::memory() {
  require(comm_.rank() == 0, "TensorParallelRunner::memory: rank 0's engine holds the memory (this is rank ",
          comm_.rank(), ")");
  require(pool_ == nullptr, "TensorParallelRunner::memory: this runner's memory is paged (pool())");
  require(!own_.empty(), "TensorParallelRunner::memory: already handed out");
  return std::make_unique<SlotKVManager>(std::move(own_));
}

std::unique_ptr<KVBlockPool> TensorParallelRunner::pool() {
  require(comm_.rank() == 0, "TensorParallelRunner::pool: rank 0's engine holds the memory (this is rank ",
          comm_.rank(), ")");
  require(pool_ != nullptr, "TensorParallelRunner::pool: this runner's memory is slots (memory())");
  require(own_pool_ != nullptr, "TensorParallelRunner::pool: already handed out");
  return std::move(own_pool_);
}

Matrix TensorParallelRunner::forward(const StepInput& step) {
  require(comm_.rank() == 0, "TensorParallelRunner::forward: rank 0 runs the engine; rank ", comm_.rank(),
          " follows it (follow())");
  check_step(shard_.config, step, "TensorParallelRunner");
  Writer w;
  if (pool_) {  // the blocks rank 0's memory copied since the last step, in order
    const std::vector<int> copies = static_cast<RecordingPool*>(pool_)->take_copies();
    w.put(static_cast<int>(copies.size()));
    w.append(copies.data(), copies.size() * sizeof(int));
  }
  w.put(static_cast<int>(step.chunks.size()));
  for (const Chunk& c : step.chunks) {
    if (pool_) {  // where its K/V lies: its block table
      const PagedKVCache* paged = c.cache->paged();
      require(paged != nullptr && &paged->pool() == pool_,
              "TensorParallelRunner: a chunk's cache is not a paged cache over pool()");
      const std::vector<int>& table = paged->block_table();
      require(static_cast<long>(table.size()) * pool_->block_size() >= paged->length() + static_cast<long>(c.tokens.size()),
              "TensorParallelRunner: a chunk's cache has not reserved its positions (reserve() them before the step, as "
              "the engine does: the other ranks write into the blocks rank 0 holds when the step starts)");
      w.put(static_cast<int>(table.size()));
      w.append(table.data(), table.size() * sizeof(int));
    } else {  // its slot
      const auto slot = std::find(slots_.begin(), slots_.end(), c.cache);
      require(slot != slots_.end(), "TensorParallelRunner: a chunk's cache is not one of memory()'s slots");
      w.put(static_cast<int>(slot - slots_.begin()));
    }
    w.put(c.cache->length());
    w.put(static_cast<int>(c.tokens.size()));
    w.append(c.tokens.data(), c.tokens.size() * sizeof(int));
    w.put(c.logits);
    w.put(c.id);
    w.put(c.mask ? 1 : 0);
    if (c.mask)
      for (Eigen::Index i = 0; i < c.mask->size(); ++i) w.bytes.push_back((*c.mask)(i) ? 1 : 0);
  }
  comm_.broadcast(w.bytes, 0);
  return run(step);
}

void TensorParallelRunner::follow() {
  require(comm_.rank() != 0, "TensorParallelRunner::follow: rank 0 runs the engine, the others follow it");
  for (;;) {
    std::vector<char> bytes;
    comm_.broadcast(bytes, 0);
    if (bytes.empty()) return;  // rank 0 stopped
    Reader r(bytes);
    if (pool_) {  // rank 0's copy-on-write, on this rank's rows
      std::vector<int> copies(static_cast<size_t>(r.get()));
      r.take(copies.data(), copies.size() * sizeof(int));
      for (size_t i = 0; i + 1 < copies.size(); i += 2) pool_->copy_block(copies[i], copies[i + 1]);
    }
    const int chunks = r.get();
    std::vector<std::vector<int>> tokens(static_cast<size_t>(chunks));
    std::vector<TreeMask> masks(static_cast<size_t>(chunks));
    std::vector<std::unique_ptr<KVStore>> mirrored;
    StepInput step;
    for (int i = 0; i < chunks; ++i) {
      int slot = 0;
      std::vector<int> table;
      if (pool_) {
        table.resize(static_cast<size_t>(r.get()));
        r.take(table.data(), table.size() * sizeof(int));
      } else {
        slot = r.get();
      }
      const int length = r.get(), n = r.get();
      require(slot >= 0 && slot < std::max<int>(1, static_cast<int>(slots_.size())) && n > 0,
              "TensorParallelRunner: a bad step message");
      tokens[i].resize(static_cast<size_t>(n));
      r.take(tokens[i].data(), tokens[i].size() * sizeof(int));
      Chunk c;
      c.tokens = tokens[i];
      c.logits = r.get();
      c.id = r.get();
      if (r.get() != 0) {
        masks[i].resize(n, n);
        for (Eigen::Index j = 0; j < masks[i].size(); ++j) {
          char b = 0;
          r.take(&b, 1);
          masks[i](j) = b != 0;
        }
        c.mask = &masks[i];
      }
      if (pool_) {  // the same blocks of this rank's pool, for this step
        mirrored.push_back(std::make_unique<MirroredStore>(*pool_, std::move(table), length));
        c.cache = mirrored.back().get();
        step.chunks.push_back(c);
        continue;
      }
      // This rank's cache of the slot holds what rank 0's held before it: a new sequence in the
      // slot (length 0) or a speculative round's rollback makes it shorter, never longer.
      KVStore& cache = *slots_[static_cast<size_t>(slot)];
      require(cache.length() >= length, "TensorParallelRunner: rank ", comm_.rank(), "'s slot ", slot, " holds ",
              cache.length(), " positions, rank 0's ", length);
      if (cache.length() > length) cache.truncate(length);
      c.cache = &cache;
      step.chunks.push_back(c);
    }
    run(step);
  }
}

Matrix TensorParallelRunner::run(const StepInput& step) {
  return on_one_thread([&] { return forward_step(shard_, projections_, step); });
}

}  // namespace infer
