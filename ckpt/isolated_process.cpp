#include "ckpt/isolated_process.hpp"

#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <new>

extern char** environ;

namespace shardkit::ckpt::isolated {
namespace {

constexpr char kChildFlag[] = "--shardkit-isolated-child";
constexpr int kChildFileFd = 3;
constexpr int kChildSocketFd = 4;
constexpr uint8_t kOk = 0;
constexpr uint8_t kFailed = 1;
// The largest request a child accepts (they are a few kilobytes: expectations, names).
constexpr uint64_t kMaxRequestBytes = uint64_t{64} << 20;

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kUnderAddressSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kUnderAddressSanitizer = true;
#else
constexpr bool kUnderAddressSanitizer = false;
#endif
#else
constexpr bool kUnderAddressSanitizer = false;
#endif
// The child's address space: the executable and its libraries take a few hundred megabytes; what a
// parser allocates beyond this for one file's metadata is an attack, not a shard.
constexpr rlim_t kChildAddressSpace = rlim_t{8} << 30;

std::atomic<double> time_scale{1.0};

// Variables that change what the child loads or starts: plugin search paths are dropped and dynamic
// loading switched off (a checkpoint must never make shardkit run code from the environment's
// folders), and the BLAS library linked into the executable starts no thread pool.
bool dropped_variable(std::string_view entry) {
  for (std::string_view name :
       {"HDF5_PLUGIN_PATH=", "HDF5_PLUGIN_PRELOAD=", "OPENBLAS_NUM_THREADS=", "OMP_NUM_THREADS="}) {
    if (entry.starts_with(name)) return true;
  }
  return false;
}

std::vector<std::string> child_environment() {
  std::vector<std::string> env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    if (!dropped_variable(*e)) env.emplace_back(*e);
  }
  env.emplace_back("HDF5_PLUGIN_PRELOAD=::");
  env.emplace_back("OPENBLAS_NUM_THREADS=1");
  env.emplace_back("OMP_NUM_THREADS=1");
  return env;
}

// A descriptor closed on scope exit.
class OwnedFd {
 public:
  explicit OwnedFd(int fd = -1) noexcept : fd_(fd) {}
  ~OwnedFd() {
    if (fd_ >= 0) ::close(fd_);
  }
  OwnedFd(const OwnedFd&) = delete;
  OwnedFd& operator=(const OwnedFd&) = delete;
  int get() const noexcept { return fd_; }
  void reset() noexcept {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_;
};

// The child, ended and reaped on scope exit unless waited for.
class Child {
 public:
  explicit Child(pid_t pid) noexcept : pid_(pid) {}
  ~Child() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      wait();
    }
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;
  // The wait status, or -1 when someone else reaped the child (an MPI library's SIGCHLD handler).
  int wait() noexcept {
    int status = 0;
    pid_t r;
    do {
      r = ::waitpid(pid_, &status, 0);
    } while (r < 0 && errno == EINTR);
    pid_ = -1;
    return r < 0 ? -1 : status;
  }
  void kill() noexcept {
    if (pid_ > 0) ::kill(pid_, SIGKILL);
  }

 private:
  pid_t pid_;
};

using Clock = std::chrono::steady_clock;

int remaining_ms(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left <= 0 ? 0 : static_cast<int>(std::min<int64_t>(left, 60'000));
}

// Sends all of `data`; false when the child is gone or the deadline passed.
bool send_all(int fd, std::string_view data, Clock::time_point deadline) {
  while (!data.empty()) {
    pollfd p{fd, POLLOUT, 0};
    const int ready = ::poll(&p, 1, remaining_ms(deadline));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) return false;
    const ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

enum class Received { kComplete, kClosed, kTimedOut, kTooLarge };

// Reads until the child closes its end; stops at the deadline or past `max_bytes`.
Received receive_all(int fd, std::string& out, Clock::time_point deadline, int64_t max_bytes) {
  char buffer[64 * 1024];
  while (true) {
    pollfd p{fd, POLLIN, 0};
    const int ready = ::poll(&p, 1, remaining_ms(deadline));
    if (ready < 0 && errno == EINTR) continue;
    if (ready == 0) {
      if (Clock::now() >= deadline) return Received::kTimedOut;
      continue;
    }
    if (ready < 0) return Received::kClosed;
    const ssize_t n = ::recv(fd, buffer, sizeof(buffer), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return n == 0 ? Received::kComplete : Received::kClosed;
    if (static_cast<int64_t>(out.size()) + n > max_bytes) return Received::kTooLarge;
    out.append(buffer, static_cast<size_t>(n));
  }
}

std::string describe_signal(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return "signal " + std::to_string(sig) + (abbrev ? std::string(", SIG") + abbrev : std::string());
}

void write_all_or_exit(int fd, std::string_view data) {
  while (!data.empty()) {
    const ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) ::_exit(3);
    data.remove_prefix(static_cast<size_t>(n));
  }
}

std::string read_request_or_exit(int fd) {
  auto read_exact = [fd](char* out, size_t size) {
    while (size > 0) {
      const ssize_t n = ::read(fd, out, size);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) ::_exit(3);
      out += n;
      size -= static_cast<size_t>(n);
    }
  };
  uint64_t length = 0;
  read_exact(reinterpret_cast<char*>(&length), sizeof(length));
  if (length > kMaxRequestBytes) ::_exit(3);
  std::string request(length, '\0');
  read_exact(request.data(), request.size());
  return request;
}

void set_limit(int resource, rlim_t soft, rlim_t hard) {
  const rlimit limit{soft, hard};
  ::setrlimit(resource, &limit);
}

std::string framed(uint8_t status, std::string_view body) {
  Wire w;
  w.put_i64(static_cast<int64_t>(body.size() + 1));
  std::string out = w.take();
  out.push_back(static_cast<char>(status));
  out.append(body);
  return out;
}

}  // namespace

void set_time_scale_for_testing(double scale) {
  time_scale.store(scale);
}

std::string run(std::string_view entry, std::string_view request, int file_fd, const std::string& where,
                std::string_view what, const Limits& limits) {
  const double seconds = std::max(0.1, limits.seconds * time_scale.load());
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) fail_errno(where + ": socketpair", errno);
  OwnedFd parent_end(sv[0]);
  OwnedFd child_end(sv[1]);
  // Above the child's target numbers, so that one dup2 cannot overwrite the source of the other.
  OwnedFd file_copy(::fcntl(file_fd, F_DUPFD_CLOEXEC, 10));
  OwnedFd socket_copy(::fcntl(child_end.get(), F_DUPFD_CLOEXEC, 10));
  if (file_copy.get() < 0 || socket_copy.get() < 0) fail_errno(where + ": fcntl(F_DUPFD_CLOEXEC)", errno);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, file_copy.get(), kChildFileFd);
  posix_spawn_file_actions_adddup2(&actions, socket_copy.get(), kChildSocketFd);
  posix_spawnattr_t attributes;
  posix_spawnattr_init(&attributes);
  sigset_t none;
  sigset_t all;
  sigemptyset(&none);
  sigfillset(&all);
  posix_spawnattr_setsigmask(&attributes, &none);
  posix_spawnattr_setsigdefault(&attributes, &all);
  posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);

  const std::string entry_text(entry);
  const std::string seconds_text = std::to_string(seconds);
  char exe[] = "/proc/self/exe";
  char flag[sizeof(kChildFlag)];
  std::memcpy(flag, kChildFlag, sizeof(kChildFlag));
  std::vector<char*> argv = {exe, flag, const_cast<char*>(entry_text.c_str()), const_cast<char*>(seconds_text.c_str()),
                             nullptr};
  std::vector<std::string> env_strings = child_environment();
  std::vector<char*> envp;
  for (std::string& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);

  pid_t pid = -1;
  const int spawned = ::posix_spawn(&pid, exe, &actions, &attributes, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attributes);
  if (spawned != 0) fail_errno(where + ": cannot start a process to check the file (/proc/self/exe)", spawned);
  Child child(pid);
  child_end.reset();
  file_copy.reset();
  socket_copy.reset();

  const auto deadline = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(seconds * 4000));
  Wire header;
  header.put_i64(static_cast<int64_t>(request.size()));
  std::string response;
  Received received = Received::kClosed;
  if (send_all(parent_end.get(), header.take(), deadline) && send_all(parent_end.get(), request, deadline)) {
    received = receive_all(parent_end.get(), response, deadline, limits.max_response_bytes + 16);
  }
  if (received == Received::kTimedOut) {
    child.kill();
    child.wait();
    fail(ErrorKind::kCorrupt, where + ": " + std::string(what) + " did not finish within " +
                                  std::to_string(static_cast<int>(std::ceil(seconds * 4))) +
                                  " s and was stopped (endless loop on damaged or crafted data?)");
  }
  if (received == Received::kTooLarge) {
    fail(ErrorKind::kCorrupt, where + ": " + std::string(what) + " produced more than " +
                                  std::to_string(limits.max_response_bytes) + " bytes of results");
  }
  const int status = child.wait();
  if (status != -1 && WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    const std::string why = sig == SIGXCPU || sig == SIGKILL
                                ? " used more than its " + std::to_string(static_cast<int>(std::ceil(seconds))) +
                                      " s of CPU time and was stopped (endless loop on damaged or crafted data?)"
                                : " crashed (" + describe_signal(sig) + "): the file is damaged or crafted";
    fail(ErrorKind::kCorrupt, where + ": " + std::string(what) + why);
  }
  // A whole answer is [length][status][body]; anything else is a child that ended early.
  Wire in(response);
  if (response.size() < 9) {
    fail(ErrorKind::kCorrupt, where + ": " + std::string(what) + " ended without an answer (exit status " +
                                  std::to_string(status != -1 && WIFEXITED(status) ? WEXITSTATUS(status) : -1) + ")");
  }
  const int64_t length = in.get_i64();
  if (length != static_cast<int64_t>(response.size() - 8)) {
    fail(ErrorKind::kCorrupt, where + ": " + std::string(what) + " ended in the middle of its answer");
  }
  const auto code = static_cast<uint8_t>(response[8]);
  std::string body = response.substr(9);
  if (code == kOk) return body;
  Wire error(body);
  const int64_t kind = error.get_i64();
  if (kind < static_cast<int64_t>(ErrorKind::kInvalidInput) || kind > static_cast<int64_t>(ErrorKind::kInternal)) {
    fail(ErrorKind::kInternal, where + ": " + std::string(what) + " answered an unknown error kind");
  }
  fail(static_cast<ErrorKind>(kind), error.get_string());
}

void serve_if_child(int argc, char** argv, std::string_view entry, EntryPoint function) {
  if (argc != 4 || std::string_view(argv[1]) != kChildFlag || std::string_view(argv[2]) != entry) return;
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  const double seconds = std::strtod(argv[3], nullptr);
  const auto cpu = static_cast<rlim_t>(std::ceil(std::max(1.0, seconds)));
  set_limit(RLIMIT_CPU, cpu, cpu + 1);  // SIGXCPU at the limit, SIGKILL a second later
  set_limit(RLIMIT_CORE, 0, 0);
  set_limit(RLIMIT_FSIZE, 0, 0);  // the child only reads
  if (!kUnderAddressSanitizer) set_limit(RLIMIT_AS, kChildAddressSpace, kChildAddressSpace);

  const std::string request = read_request_or_exit(kChildSocketFd);
  std::string response;
  try {
    response = framed(kOk, function(request, kChildFileFd));
  } catch (const Error& e) {
    Wire w;
    w.put_i64(static_cast<int64_t>(e.kind()));
    w.put_string(e.what());
    response = framed(kFailed, w.take());
  } catch (const std::bad_alloc&) {
    Wire w;
    w.put_i64(static_cast<int64_t>(ErrorKind::kCorrupt));
    w.put_string("parsing it needs more than " + std::to_string(kChildAddressSpace >> 30) +
                 " GiB of memory (damaged or crafted data?)");
    response = framed(kFailed, w.take());
  } catch (const std::exception& e) {
    Wire w;
    w.put_i64(static_cast<int64_t>(ErrorKind::kInternal));
    w.put_string(e.what());
    response = framed(kFailed, w.take());
  }
  write_all_or_exit(kChildSocketFd, response);
  ::_exit(0);
}

void Wire::put_i64(int64_t value) {
  out_.append(reinterpret_cast<const char*>(&value), sizeof(value));
}

void Wire::put_string(std::string_view value) {
  put_i64(static_cast<int64_t>(value.size()));
  out_.append(value);
}

template <typename T>
void Wire::put_array(const std::vector<T>& values) {
  put_i64(static_cast<int64_t>(values.size()));
  out_.append(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(T));
}

std::string_view Wire::next(size_t bytes) {
  if (bytes > in_.size()) fail(ErrorKind::kInternal, "isolated process: truncated message");
  std::string_view out = in_.substr(0, bytes);
  in_.remove_prefix(bytes);
  return out;
}

int64_t Wire::get_i64() {
  int64_t value = 0;
  std::memcpy(&value, next(sizeof(value)).data(), sizeof(value));
  return value;
}

std::string Wire::get_string() {
  const int64_t size = get_i64();
  if (size < 0) fail(ErrorKind::kInternal, "isolated process: negative length");
  return std::string(next(static_cast<size_t>(size)));
}

template <typename T>
std::vector<T> Wire::get_array() {
  const int64_t size = get_i64();
  if (size < 0 || static_cast<uint64_t>(size) > in_.size() / sizeof(T)) {
    fail(ErrorKind::kInternal, "isolated process: bad array length");
  }
  std::vector<T> out(static_cast<size_t>(size));
  const std::string_view bytes = next(out.size() * sizeof(T));
  if (!out.empty()) std::memcpy(out.data(), bytes.data(), bytes.size());
  return out;
}

template void Wire::put_array(const std::vector<int64_t>&);
template void Wire::put_array(const std::vector<uint64_t>&);
template std::vector<int64_t> Wire::get_array();
template std::vector<uint64_t> Wire::get_array();

}  // namespace shardkit::ckpt::isolated
