#include "ckpt/isolated_process.hpp"

#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
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
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <thread>
#include <utility>

#include "base/clock.hpp"
#include "base/sanitizers.hpp"

extern char** environ;

namespace shardkit::ckpt::isolated {
namespace {

constexpr char kChildFlag[] = "--shardkit-isolated-child";
constexpr int kChildSocketFd = 3;  // the first after stdin, stdout and stderr: nothing else stays open
constexpr int64_t kOk = 0;
constexpr int64_t kFailed = 1;
// The largest request a child accepts (they are a few kilobytes: expectations, names).
constexpr uint64_t kMaxRequestBytes = uint64_t{64} << 20;

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
  ~OwnedFd() { reset(); }
  OwnedFd(OwnedFd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  OwnedFd& operator=(OwnedFd&& other) noexcept {
    if (this != &other) {
      reset();
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }
  int get() const noexcept { return fd_; }
  void reset() noexcept {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_;
};

int remaining_ms(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left <= 0 ? 0 : static_cast<int>(std::min<int64_t>(left, 60'000));
}

// Waits until `fd` is ready for `events`; false at the deadline.
bool wait_ready(int fd, short events, Clock::time_point deadline) {
  while (true) {
    pollfd p{fd, events, 0};
    const int ready = ::poll(&p, 1, remaining_ms(deadline));
    if (ready > 0) return true;
    if (ready < 0 && errno == EINTR) continue;
    if (ready == 0 && Clock::now() < deadline) continue;
    return false;
  }
}

enum class Transfer { kDone, kClosed, kTimedOut };

// Sends all of `data`, the first byte with `pass_fd` attached (SCM_RIGHTS) when it is >= 0.
Transfer send_all(int socket, std::string_view data, int pass_fd, Clock::time_point deadline) {
  while (!data.empty()) {
    if (!wait_ready(socket, POLLOUT, deadline)) return Transfer::kTimedOut;
    iovec iov{const_cast<char*>(data.data()), data.size()};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
    if (pass_fd >= 0) {
      msg.msg_control = control;
      msg.msg_controllen = sizeof(control);
      cmsghdr* c = CMSG_FIRSTHDR(&msg);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof(int));
      std::memcpy(CMSG_DATA(c), &pass_fd, sizeof(int));
    }
    const ssize_t n = ::sendmsg(socket, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) return Transfer::kClosed;
    pass_fd = -1;
    data.remove_prefix(static_cast<size_t>(n));
  }
  return Transfer::kDone;
}

// Receives exactly `size` bytes.
Transfer receive_exact(int socket, char* out, size_t size, Clock::time_point deadline) {
  while (size > 0) {
    if (!wait_ready(socket, POLLIN, deadline)) return Transfer::kTimedOut;
    const ssize_t n = ::recv(socket, out, size, MSG_DONTWAIT);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) return Transfer::kClosed;
    out += n;
    size -= static_cast<size_t>(n);
  }
  return Transfer::kDone;
}

std::string describe_signal(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return "signal " + std::to_string(sig) + (abbrev ? std::string(", SIG") + abbrev : std::string());
}

std::string frame(int64_t first, std::string_view body) {
  Wire w;
  w.put_i64(first);
  w.put_i64(static_cast<int64_t>(body.size()));
  std::string out = w.take();
  out.append(body);
  return out;
}

// One child serving the requests of one entry point, one at a time. A child that crashed, ran out of
// time or broke the protocol is ended and the next request gets a fresh one. One that refused a file
// stays: whatever a file does to the child's memory, the caller checks every chunk it reads against
// checksums the manifest's digest covers, so a child can fail a later file but never pass bad data.
class Server {
 public:
  explicit Server(std::string entry) : entry_(std::move(entry)) {}
  ~Server() { stop(); }
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  std::mutex& mutex() noexcept { return mutex_; }

  std::string call(std::string_view request, int file_fd, const std::string& where, std::string_view what,
                   const Limits& limits);
  // Ends the child and returns its wait status (-1 when someone else reaped it, or none ran).
  int stop() noexcept;

 private:
  void start(const std::string& where);
  [[noreturn]] void fail_child(const std::string& where, std::string_view what, double seconds, bool timed_out);

  std::string entry_;
  std::mutex mutex_;
  pid_t pid_ = -1;
  OwnedFd socket_;
};

void Server::start(const std::string& where) {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) fail_errno(where + ": socketpair", errno);
  OwnedFd parent_end(sv[0]);
  OwnedFd child_end(sv[1]);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, child_end.get(), kChildSocketFd);
  // Nothing else of the caller's: libhdf5 opens files without O_CLOEXEC, and a child that kept one
  // would hold its flock (a writer reopening the file fails with EAGAIN) and its disk space.
  posix_spawn_file_actions_addclosefrom_np(&actions, kChildSocketFd + 1);
  posix_spawnattr_t attributes;
  posix_spawnattr_init(&attributes);
  sigset_t none;
  sigset_t all;
  sigemptyset(&none);
  sigfillset(&all);
  posix_spawnattr_setsigmask(&attributes, &none);
  posix_spawnattr_setsigdefault(&attributes, &all);
  posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);

  char exe[] = "/proc/self/exe";
  char flag[sizeof(kChildFlag)];
  std::memcpy(flag, kChildFlag, sizeof(kChildFlag));
  std::vector<char*> argv = {exe, flag, entry_.data(), nullptr};
  std::vector<std::string> env_strings = child_environment();
  std::vector<char*> envp;
  for (std::string& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);
  pid_t pid = -1;
  const int spawned = ::posix_spawn(&pid, exe, &actions, &attributes, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attributes);
  if (spawned != 0) fail_errno(where + ": cannot start a process to check the file (/proc/self/exe)", spawned);
  pid_ = pid;
  socket_ = std::move(parent_end);
}

int Server::stop() noexcept {
  socket_.reset();
  if (pid_ <= 0) return -1;
  ::kill(pid_, SIGKILL);
  int status = 0;
  pid_t r;
  do {
    r = ::waitpid(pid_, &status, 0);
  } while (r < 0 && errno == EINTR);
  pid_ = -1;
  return r < 0 ? -1 : status;
}

void Server::fail_child(const std::string& where, std::string_view what, double seconds, bool timed_out) {
  // Let a child that is ending (crashed, past its CPU time) finish, so its wait status tells why.
  if (!timed_out) wait_ready(socket_.get(), POLLIN, Clock::now() + std::chrono::milliseconds(200));
  int status = -1;
  if (!timed_out && pid_ > 0) {
    for (int i = 0; i < 100 && status == -1; ++i) {
      int s = 0;
      const pid_t r = ::waitpid(pid_, &s, WNOHANG);
      if (r == pid_) {
        status = s;
        pid_ = -1;
      } else if (r < 0) {
        break;
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
    }
  }
  stop();
  const std::string head = where + ": " + std::string(what);
  const auto rounded = [](double s) { return std::to_string(static_cast<int>(std::ceil(s))); };
  if (timed_out) {
    fail(ErrorKind::kCorrupt, head + " did not finish within " + rounded(seconds * 4) +
                                  " s and was stopped (endless loop on damaged or crafted data?)");
  }
  if (status != -1 && WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    if (sig == SIGXCPU) {
      fail(ErrorKind::kCorrupt, head + " used more than its " + rounded(seconds) +
                                    " s of CPU time and was stopped (endless loop on damaged or crafted data?)");
    }
    fail(ErrorKind::kCorrupt, head + " crashed (" + describe_signal(sig) + "): the file is damaged or crafted");
  }
  fail(ErrorKind::kCorrupt,
       head + " ended without an answer" +
           (status != -1 && WIFEXITED(status) ? " (exit status " + std::to_string(WEXITSTATUS(status)) + ")"
                                              : std::string()));
}

std::string Server::call(std::string_view request, int file_fd, const std::string& where, std::string_view what,
                         const Limits& limits) {
  const double seconds = std::max(0.1, limits.seconds * time_scale.load());
  const auto millis = static_cast<int64_t>(seconds * 1000);
  // A child kept from an earlier request may have been ended since (by the system, or its parent
  // thread's end): one fresh start is tried before blaming the file.
  for (int attempt = 0;; ++attempt) {
    const bool fresh = pid_ <= 0;
    if (fresh) start(where);
    const auto deadline = Clock::now() + std::chrono::milliseconds(millis * 4);
    const Transfer sent = send_all(socket_.get(), frame(millis, request), file_fd, deadline);
    if (sent == Transfer::kDone) {
      char header[16];
      const Transfer got = receive_exact(socket_.get(), header, sizeof(header), deadline);
      if (got == Transfer::kDone) {
        Wire h(std::string_view(header, sizeof(header)));
        const int64_t status = h.get_i64();
        const int64_t length = h.get_i64();
        if (length < 0 || length > limits.max_response_bytes) {
          stop();
          fail(ErrorKind::kCorrupt, where + ": " + std::string(what) + " answered " + std::to_string(length) +
                                        " bytes, more than the " + std::to_string(limits.max_response_bytes) +
                                        " expected");
        }
        std::string body(static_cast<size_t>(length), '\0');
        const Transfer rest = receive_exact(socket_.get(), body.data(), body.size(), deadline);
        if (rest != Transfer::kDone) fail_child(where, what, seconds, rest == Transfer::kTimedOut);
        if (status == kOk) return body;
        Wire error(body);
        const int64_t kind = error.get_i64();
        if (kind < static_cast<int64_t>(ErrorKind::kInvalidInput) ||
            kind > static_cast<int64_t>(ErrorKind::kInternal)) {
          fail(ErrorKind::kInternal, where + ": " + std::string(what) + " answered an unknown error kind");
        }
        fail(static_cast<ErrorKind>(kind), error.get_string());
      }
      fail_child(where, what, seconds, got == Transfer::kTimedOut);
    }
    if (sent == Transfer::kTimedOut) fail_child(where, what, seconds, true);
    if (fresh || attempt > 0) fail_child(where, what, seconds, false);
    stop();
  }
}

std::mutex servers_mutex;
std::map<std::string, std::unique_ptr<Server>, std::less<>> servers;

Server& server_for(std::string_view entry) {
  std::lock_guard lock(servers_mutex);
  auto it = servers.find(entry);
  if (it == servers.end()) it = servers.emplace(std::string(entry), std::make_unique<Server>(std::string(entry))).first;
  return *it->second;
}

// Child side: the next request, with the file descriptor passed along; false at the end of the stream.
bool receive_request(int socket, double& seconds, std::string& request, OwnedFd& file) {
  char header[16];
  iovec iov{header, sizeof(header)};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  ssize_t n;
  do {
    n = ::recvmsg(socket, &msg, MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  if (n <= 0) return false;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
      int fd = -1;
      std::memcpy(&fd, CMSG_DATA(c), sizeof(int));
      file = OwnedFd(fd);
    }
  }
  const auto forever = Clock::now() + std::chrono::hours(24 * 365);
  if (static_cast<size_t>(n) < sizeof(header) &&
      receive_exact(socket, header + n, sizeof(header) - static_cast<size_t>(n), forever) != Transfer::kDone) {
    return false;
  }
  Wire h(std::string_view(header, sizeof(header)));
  seconds = static_cast<double>(h.get_i64()) / 1000;
  const int64_t length = h.get_i64();
  if (length < 0 || static_cast<uint64_t>(length) > kMaxRequestBytes) return false;
  request.assign(static_cast<size_t>(length), '\0');
  return receive_exact(socket, request.data(), request.size(), forever) == Transfer::kDone;
}

// Child side: the soft CPU limit at `seconds` beyond what the child used so far (SIGXCPU ends it).
void limit_cpu_from_now(double seconds) {
  rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);
  const double used = static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
                      static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6;
  rlimit limit{};
  ::getrlimit(RLIMIT_CPU, &limit);
  limit.rlim_cur = static_cast<rlim_t>(std::ceil(used + std::max(1.0, seconds)));
  if (limit.rlim_max != RLIM_INFINITY && limit.rlim_cur > limit.rlim_max) limit.rlim_cur = limit.rlim_max;
  ::setrlimit(RLIMIT_CPU, &limit);
}

void set_limit(int resource, rlim_t value) {
  const rlimit limit{value, value};
  ::setrlimit(resource, &limit);
}

std::string error_answer(ErrorKind kind, std::string_view message) {
  Wire w;
  w.put_i64(static_cast<int64_t>(kind));
  w.put_string(message);
  return frame(kFailed, w.take());
}

}  // namespace

void restart_for_testing(double scale) {
  std::lock_guard lock(servers_mutex);
  for (auto& [name, server] : servers) {
    std::lock_guard server_lock(server->mutex());
    server->stop();
  }
  time_scale.store(scale);
}

std::string run(std::string_view entry, std::string_view request, int file_fd, const std::string& where,
                std::string_view what, const Limits& limits) {
  Server& server = server_for(entry);
  std::lock_guard lock(server.mutex());
  return server.call(request, file_fd, where, what, limits);
}

void serve_if_child(int argc, char** argv, std::string_view entry, EntryPoint function) {
  if (argc != 3 || std::string_view(argv[1]) != kChildFlag || std::string_view(argv[2]) != entry) return;
  set_limit(RLIMIT_CORE, 0);
  set_limit(RLIMIT_FSIZE, 0);  // the child only reads
  if (!kUnderAddressSanitizer) set_limit(RLIMIT_AS, kChildAddressSpace);
  double seconds = 0;
  std::string request;
  OwnedFd file;
  while (receive_request(kChildSocketFd, seconds, request, file)) {
    limit_cpu_from_now(seconds);
    std::string answer;
    try {
      answer = frame(kOk, function(request, file.get()));
    } catch (const Error& e) {
      answer = error_answer(e.kind(), e.what());
    } catch (const std::bad_alloc&) {
      answer =
          error_answer(ErrorKind::kCorrupt, "parsing it needs more than " + std::to_string(kChildAddressSpace >> 30) +
                                                " GiB of memory (damaged or crafted data?)");
    } catch (const std::exception& e) {
      answer = error_answer(ErrorKind::kInternal, e.what());
    }
    file.reset();
    const auto forever = Clock::now() + std::chrono::hours(24 * 365);
    if (send_all(kChildSocketFd, answer, -1, forever) != Transfer::kDone) break;
  }
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
