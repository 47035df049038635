#include "infer/http_connections.h"

#ifdef TREX_HAVE_HTTPLIB
#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/log.h"

namespace trex::infer {

using Clock = std::chrono::steady_clock;
constexpr int kListenBacklog = 1024;

struct ConnectionGuard::Conn {
  int fd = -1;  // -1: not identified (no deadline, cannot be refused)
  ino_t ino = 0;
  bool armed = false, killed = false, done = false, close_after = false;
  Clock::time_point deadline;
  std::thread thread;
};

namespace {

thread_local ConnectionGuard::Conn* t_conn = nullptr;

Clock::duration seconds(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

int local_port(int fd) {
  sockaddr_storage a{};
  socklen_t n = sizeof a;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&a), &n) != 0) return -1;
  if (a.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&a)->sin_port);
  if (a.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&a)->sin6_port);
  return -1;
}

bool connected(int fd) {
  sockaddr_storage a{};
  socklen_t n = sizeof a;
  return getpeername(fd, reinterpret_cast<sockaddr*>(&a), &n) == 0;
}

// The same socket still behind fd (httplib may have closed it and the number been reused)?
bool same_socket(int fd, ino_t ino) {
  struct stat st {};
  return fstat(fd, &st) == 0 && S_ISSOCK(st.st_mode) && st.st_ino == ino;
}

}  // namespace

class GuardQueue final : public httplib::TaskQueue {
 public:
  explicit GuardQueue(ConnectionGuard& g) : g_(g) {}
  void enqueue(std::function<void()> fn) override { g_.start(std::move(fn)); }
  void shutdown() override { g_.drain(); }

 private:
  ConnectionGuard& g_;
};

ConnectionGuard::ConnectionGuard(ConnectionLimits limits) : limits_(limits) {
  watchdog_ = std::thread([this] { watch(); });
}

ConnectionGuard::~ConnectionGuard() {
  drain();
  {
    std::lock_guard<std::mutex> lk(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  watchdog_.join();
}

void ConnectionGuard::set_port(int port) {
  std::lock_guard<std::mutex> lk(mu_);
  port_ = port;
  // httplib listens with a backlog of 5: a burst of connections beyond it waits in SYN retransmits for
  // seconds (a client's /health among them). listen() again on the listening socket raises it.
  if (DIR* d = opendir("/proc/self/fd")) {
    while (const dirent* e = readdir(d)) {
      char* end = nullptr;
      const long fd = std::strtol(e->d_name, &end, 10);
      if (end == e->d_name || *end != '\0' || fd == dirfd(d)) continue;
      int listening = 0;
      socklen_t n = sizeof listening;
      if (getsockopt(int(fd), SOL_SOCKET, SO_ACCEPTCONN, &listening, &n) != 0 || !listening) continue;
      if (local_port(int(fd)) == port && ::listen(int(fd), kListenBacklog) != 0)
        log::warn("http server: cannot raise the listen backlog: {}", std::strerror(errno));
    }
    closedir(d);
  }
}

httplib::TaskQueue* ConnectionGuard::new_task_queue() {
  return new GuardQueue(*this);
}

void ConnectionGuard::start(std::function<void()> task) {
  auto c = std::make_shared<Conn>();
  std::unique_lock<std::mutex> lk(mu_);
  reap(lk);
  // The connection just accepted: the one socket on our port with a peer that is not registered yet (called
  // on the listener thread right after accept(), so no other new one can be there; the newest inode wins
  // should one that was never identified linger).
  if (port_ > 0) {
    std::vector<ino_t> known;
    for (const auto& k : conns_) known.push_back(k->ino);
    if (DIR* d = opendir("/proc/self/fd")) {
      while (const dirent* e = readdir(d)) {
        char* end = nullptr;
        const long fd = std::strtol(e->d_name, &end, 10);
        if (end == e->d_name || *end != '\0' || fd == dirfd(d)) continue;
        struct stat st {};
        if (fstat(int(fd), &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
        if (std::find(known.begin(), known.end(), st.st_ino) != known.end()) continue;
        if (local_port(int(fd)) != port_ || !connected(int(fd))) continue;
        if (c->fd < 0 || st.st_ino > c->ino) c->fd = int(fd), c->ino = st.st_ino;
      }
      closedir(d);
    }
  }
  if (c->fd >= 0 && stats_.open >= limits_.max_connections) {
    ++stats_.refused;
    lk.unlock();
    static const char kBusy[] =
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nConnection: close\r\n"
        "Content-Length: 109\r\n\r\n"
        "{\"error\":{\"message\":\"too many open connections\",\"type\":\"server_overloaded\",\"param\":null,"
        "\"code\":null}}\n";
    [[maybe_unused]] const ssize_t w = send(c->fd, kBusy, sizeof kBusy - 1, MSG_DONTWAIT | MSG_NOSIGNAL);
    ::shutdown(c->fd, SHUT_RDWR);
    ::close(c->fd);  // the task (which would have served and closed it) is dropped
    return;
  }
  ++stats_.open;
  ++stats_.accepted;
  c->armed = c->fd >= 0;
  c->deadline = Clock::now() + seconds(limits_.header_timeout_s);
  conns_.push_back(c);
  Conn* raw = c.get();
  c->thread = std::thread([this, raw, task = std::move(task)] {
    t_conn = raw;
    try {
      task();
    } catch (const std::exception& e) {
      log::warn("http connection: {}", e.what());
    }
    t_conn = nullptr;
    std::lock_guard<std::mutex> g(mu_);
    raw->done = true;
    --stats_.open;
    cv_.notify_all();
  });
}

void ConnectionGuard::reap(std::unique_lock<std::mutex>& lk) {
  std::vector<std::shared_ptr<Conn>> done;
  for (auto it = conns_.begin(); it != conns_.end();)
    if ((*it)->done) {
      done.push_back(*it);
      it = conns_.erase(it);
    } else {
      ++it;
    }
  if (done.empty()) return;
  lk.unlock();
  for (auto& c : done) c->thread.join();
  lk.lock();
}

void ConnectionGuard::headers_read() {
  if (!t_conn) return;
  std::lock_guard<std::mutex> lk(mu_);
  t_conn->deadline = Clock::now() + seconds(limits_.body_timeout_s);
}

void ConnectionGuard::body_read() {
  if (!t_conn) return;
  std::lock_guard<std::mutex> lk(mu_);
  t_conn->armed = false;
}

void ConnectionGuard::response_written() {
  if (!t_conn) return;
  std::lock_guard<std::mutex> lk(mu_);
  t_conn->armed = t_conn->fd >= 0;
  if (t_conn->close_after && t_conn->armed && same_socket(t_conn->fd, t_conn->ino)) {
    // httplib 0.11 keeps a connection open whatever the response says; what it reads next is the rest of
    // the refused body, and its answers to that now fail, which ends the connection.
    ::shutdown(t_conn->fd, SHUT_WR);
    t_conn->deadline = Clock::now() + std::chrono::seconds(1);
    return;
  }
  t_conn->deadline = Clock::now() + seconds(limits_.header_timeout_s);
}

void ConnectionGuard::close_after_response() {
  if (!t_conn) return;
  std::lock_guard<std::mutex> lk(mu_);
  t_conn->close_after = true;
}

ConnectionStats ConnectionGuard::stats() const {
  std::lock_guard<std::mutex> lk(mu_);
  return stats_;
}

void ConnectionGuard::watch() {
  std::unique_lock<std::mutex> lk(mu_);
  while (!stopping_) {
    cv_.wait_for(lk, std::chrono::milliseconds(50));
    const auto now = Clock::now();
    for (auto& c : conns_)
      if (c->armed && !c->killed && !c->done && now > c->deadline && same_socket(c->fd, c->ino)) {
        ::shutdown(c->fd, SHUT_RDWR);
        c->killed = true;
        ++stats_.timed_out;
      }
    reap(lk);
  }
}

void ConnectionGuard::drain() {
  std::unique_lock<std::mutex> lk(mu_);
  for (auto& c : conns_)
    if (!c->done && c->fd >= 0 && same_socket(c->fd, c->ino)) ::shutdown(c->fd, SHUT_RDWR);
  cv_.wait(lk, [&] { return stats_.open == 0; });
  reap(lk);
}

}  // namespace trex::infer
#endif
