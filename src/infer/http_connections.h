// Connection limits for the HTTP server that cpp-httplib (Debian 12: 0.11.4) does not have: a cap on open
// connections, and time-outs on the whole of a request's headers and on its body (httplib's read time-out
// is per read(), so a client that sends one byte every few seconds would hold a worker forever).
//
// It plugs in as httplib's task queue (Server::new_task_queue): every accepted connection is one task.
// Each connection gets its own thread, so idle keep-alive connections and slow clients never keep
// /health waiting behind them. The accepted socket is found by its inode among the process's sockets
// bound to the server's port (httplib hands the queue only an opaque task), which lets the guard refuse
// connections beyond the cap (503, closed) and end the ones past their deadline (shutdown(2); httplib
// then closes them as a client that went away). set_port() also raises the listen backlog (httplib's is 5:
// a burst of connections would wait seconds in SYN retransmits).
//
// The server calls the hooks from the connection's own thread: headers_read() when routing starts (the
// body deadline starts), body_read() once the body is in (no deadline while the handler runs and
// streams), response_written() after each response (the next request's header deadline starts; it also
// bounds a keep-alive connection's idle time).
#pragma once
#ifdef TREX_HAVE_HTTPLIB
#include <httplib.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <thread>

namespace trex::infer {

struct ConnectionLimits {
  int64_t max_connections = 256;  // open at once; more are answered 503 and closed
  double header_timeout_s = 10;   // accept (or previous response) -> end of the request headers
  double body_timeout_s = 30;     // end of the headers -> end of the body
};

struct ConnectionStats {
  int64_t open = 0, accepted = 0, refused = 0, timed_out = 0;
};

class ConnectionGuard {
 public:
  explicit ConnectionGuard(ConnectionLimits limits);
  ~ConnectionGuard();
  ConnectionGuard(const ConnectionGuard&) = delete;
  ConnectionGuard& operator=(const ConnectionGuard&) = delete;

  void set_port(int port);              // the server's bound port (before it listens)
  httplib::TaskQueue* new_task_queue();  // for Server::new_task_queue (httplib owns the queue)
  void headers_read();
  void body_read();
  void response_written();
  // The response being written is the connection's last (e.g. a body left unread): after it, the write side
  // is shut (the client reads the response, then EOF) and the connection ends within a second.
  void close_after_response();
  ConnectionStats stats() const;

  struct Conn;

 private:
  friend class GuardQueue;
  void start(std::function<void()> task);
  void drain();  // the listener stopped: end every connection and wait for their threads
  void watch();
  void reap(std::unique_lock<std::mutex>& lk);

  ConnectionLimits limits_;
  int port_ = -1;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::list<std::shared_ptr<Conn>> conns_;
  ConnectionStats stats_;
  bool stopping_ = false;
  std::thread watchdog_;
};

}  // namespace trex::infer
#endif
