// A minimal RPC server for TVM's runtime (apache-tvm 0.27), for an aarch64 board or an emulated
// aarch64 CPU. It speaks the handshake of TVM's Python server (python/tvm/rpc/server.py and
// base.py: RPC_MAGIC, the "client:KEY [-timeout=S]" key, RPC_CODE_SUCCESS / RPC_CODE_MISMATCH,
// then "server:KEY"), registers the two server-side functions that TVM's runtime library leaves
// to the server (tvm.rpc.server.workpath, tvm.rpc.server.load_module; upload, download and remove
// are the runtime's own and call workpath), and hands each accepted socket to the runtime's
// rpc.ServerLoop. It needs only libtvm_runtime.so and libtvm_ffi.so.
//
// Each session runs in a child process (forked, so the runtime is loaded once) in a fresh work
// directory, side by side with the others. A session that crashes (SIGILL where the compiled
// code needs an instruction this CPU lacks, SIGSEGV) or passes its -timeout leaves the server
// serving: the server sends the client an RPC exception that names the signal or the timeout,
// and the client's pending call raises it.
//
// With --tracker HOST:PORT it registers with TVM's RPC tracker (python -m tvm.exec.rpc_tracker;
// the protocol of python/tvm/rpc/tracker.py and server.py's _listen_loop): UPDATE_INFO as
// "server:KEY", then PUT of (port, a random match key) under KEY. A client that the tracker gives
// this server connects with "client:MATCHKEY"; the server then takes no other client until that
// session ends, and PUTs a new match key (the tracker hands a board to one client at a time). A
// match key handed out but not used for 8 s is replaced, as TVM's server does; a lost tracker is
// reconnected every 2 s.
//
//   rpc_server [--host 127.0.0.1] [--port 9090] [--key KEY] [--once] [--no-core-dumps]
//              [--exit-with-parent] [--tracker HOST:PORT [--custom-addr ADDR]]
//
// --port 0 takes a free port; --once exits after the first session; --no-core-dumps sets a
// session's core size limit to 0; --exit-with-parent stops the server when the process that
// started it is gone (a test harness killed before it could stop the server); --custom-addr is
// the address the tracker gives clients (default: the one it sees this server connect from).
// The server prints "listening on HOST:PORT" on stdout once it accepts connections and, with a
// tracker, "registered with HOST:PORT under key KEY" once the tracker lists it; everything else
// goes to stderr.

#include <arpa/inet.h>
#include <fcntl.h>
#include <ftw.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <tvm/ffi/function.h>
#include <tvm/ffi/string.h>

namespace {

constexpr int32_t kRPCMagic = 0xFF271;               // base.RPC_MAGIC
constexpr int32_t kRPCCodeSuccess = kRPCMagic + 0;   // base.RPC_CODE_SUCCESS
constexpr int32_t kRPCCodeMismatch = kRPCMagic + 2;  // base.RPC_CODE_MISMATCH
constexpr int32_t kMaxKeyLength = 4096;
constexpr int32_t kTrackerMagic = 0x2F271;  // base.RPC_TRACKER_MAGIC
// base.TrackerCode
constexpr int kTrackerPut = 3;
constexpr int kTrackerUpdateInfo = 5;
constexpr int kTrackerGetPendingMatchkeys = 7;
// server.py's _accept_conn: ping_period, and the unmatch_timeout after which a match key
// handed out but not used is replaced
constexpr double kTrackerPingPeriod = 2.0;
constexpr double kTrackerUnmatchedTimeout = 4.0;
constexpr double kTrackerIOTimeout = 10.0;
constexpr int32_t kMaxTrackerMessage = 1 << 20;

struct Options {
  std::string host = "127.0.0.1";
  int port = 9090;
  std::string key;
  bool once = false;
  bool no_core_dumps = false;
  bool exit_with_parent = false;
  std::string tracker_host;  // empty: no tracker
  int tracker_port = 0;
  std::string custom_addr;
};

volatile sig_atomic_t stop_requested = 0;

void RequestStop(int) { stop_requested = 1; }

void Log(const std::string& text) { std::fprintf(stderr, "[rpc_server] %s\n", text.c_str()); }

[[noreturn]] void Usage(const char* prog, int code) {
  std::fprintf(code ? stderr : stdout,
               "usage: %s [--host ADDR] [--port N (0: a free one)] [--key KEY] [--once] "
               "[--no-core-dumps] [--exit-with-parent] [--tracker HOST:PORT "
               "[--custom-addr ADDR]]\n",
               prog);
  std::exit(code);
}

[[noreturn]] void BadOption(const std::string& text) {
  std::fprintf(stderr, "rpc_server: %s\n", text.c_str());
  std::exit(2);
}

bool PlainWord(const std::string& text) {
  if (text.empty()) return false;
  for (char c : text) {
    if (c < 0x21 || c > 0x7e) return false;
  }
  return true;
}

Options ParseOptions(int argc, char** argv) {
  Options opts;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) Usage(argv[0], 2);
      return argv[++i];
    };
    if (arg == "--host") {
      opts.host = value();
    } else if (arg == "--port") {
      opts.port = std::atoi(value().c_str());
    } else if (arg == "--key") {
      opts.key = value();
    } else if (arg == "--once") {
      opts.once = true;
    } else if (arg == "--no-core-dumps") {
      opts.no_core_dumps = true;
    } else if (arg == "--exit-with-parent") {
      opts.exit_with_parent = true;
    } else if (arg == "--tracker") {
      std::string address = value();
      size_t colon = address.rfind(':');
      char* end = nullptr;
      long port = 0;
      if (colon != std::string::npos) port = std::strtol(address.c_str() + colon + 1, &end, 10);
      if (colon == 0 || colon == std::string::npos || *end != '\0' || port <= 0 ||
          port > 65535) {
        BadOption("--tracker takes HOST:PORT, got '" + address + "'");
      }
      opts.tracker_host = address.substr(0, colon);
      if (opts.tracker_host.size() > 2 && opts.tracker_host.front() == '[' &&
          opts.tracker_host.back() == ']') {
        opts.tracker_host = opts.tracker_host.substr(1, opts.tracker_host.size() - 2);
      }
      opts.tracker_port = static_cast<int>(port);
    } else if (arg == "--custom-addr") {
      opts.custom_addr = value();
    } else if (arg == "-h" || arg == "--help") {
      Usage(argv[0], 0);
    } else {
      Usage(argv[0], 2);
    }
  }
  if (!opts.tracker_host.empty()) {
    // the key goes into the tracker's JSON and into "client:KEY" words: one printable word
    if (!PlainWord(opts.key)) {
      BadOption("--tracker needs --key KEY, one word of printable ASCII characters (the key "
                "clients request), got '" + opts.key + "'");
    }
    if (!opts.custom_addr.empty() && !PlainWord(opts.custom_addr)) {
      BadOption("--custom-addr takes one word, got '" + opts.custom_addr + "'");
    }
  } else if (!opts.custom_addr.empty()) {
    BadOption("--custom-addr needs --tracker");
  }
  return opts;
}

bool RecvAll(int fd, void* data, size_t size) {
  char* buf = static_cast<char*>(data);
  while (size > 0) {
    ssize_t n = recv(fd, buf, size, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    buf += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

bool SendAll(int fd, const void* data, size_t size) {
  const char* buf = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t n = send(fd, buf, size, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    buf += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

bool SendInt(int fd, int32_t value) { return SendAll(fd, &value, sizeof(value)); }

// The handshake of TVM's Python server: returns whether the client, which must name
// `match_key` (nullptr: none may connect now), was accepted, and the session timeout it asked
// for (seconds, 0: none).
bool Handshake(int fd, const Options& opts, const std::string* match_key, double* timeout) {
  int32_t magic = 0;
  int32_t keylen = 0;
  if (!RecvAll(fd, &magic, sizeof(magic)) || magic != kRPCMagic) return false;
  if (!RecvAll(fd, &keylen, sizeof(keylen)) || keylen < 0 || keylen > kMaxKeyLength) return false;
  std::string key(static_cast<size_t>(keylen), '\0');
  if (keylen > 0 && !RecvAll(fd, &key[0], key.size())) return false;
  // "client:KEY [-timeout=S]": the first word must match, the others are options
  std::vector<std::string> words;
  size_t pos = 0;
  while (pos < key.size()) {
    size_t start = key.find_first_not_of(" \t\n", pos);
    if (start == std::string::npos) break;
    size_t end = key.find_first_of(" \t\n", start);
    if (end == std::string::npos) end = key.size();
    words.push_back(key.substr(start, end - start));
    pos = end;
  }
  if (words.empty() || match_key == nullptr || words[0] != "client:" + *match_key) {
    SendInt(fd, kRPCCodeMismatch);
    Log("key mismatch: '" + key + "'");
    return false;
  }
  *timeout = 0;
  for (size_t i = 1; i < words.size(); ++i) {
    if (words[i].rfind("-timeout=", 0) == 0) *timeout = std::atof(words[i].c_str() + 9);
  }
  std::string server_key = "server:" + opts.key;
  return SendInt(fd, kRPCCodeSuccess) && SendInt(fd, static_cast<int32_t>(server_key.size())) &&
         SendAll(fd, server_key.data(), server_key.size());
}

// Where an uploaded name lives in the session's work directory; names that leave it are refused.
std::string WorkPath(const std::string& workdir, const std::string& name) {
  if (name.empty() || name[0] == '/' || name == ".." || name.rfind("../", 0) == 0 ||
      name.find("/../") != std::string::npos ||
      (name.size() >= 3 && name.compare(name.size() - 3, 3, "/..") == 0)) {
    TVM_FFI_THROW(ValueError) << "rpc_server: the path '" << name
                              << "' leaves the session's work directory";
  }
  return workdir + "/" + name;
}

void RegisterSessionFunctions(const std::string& workdir) {
  namespace ffi = tvm::ffi;
  ffi::Function::SetGlobal(
      "tvm.rpc.server.workpath",
      ffi::Function::FromTyped(
          [workdir](ffi::String name) -> ffi::String { return WorkPath(workdir, name); }),
      true);
  ffi::Function::SetGlobal(
      "tvm.rpc.server.load_module",
      ffi::Function::FromTyped([workdir](ffi::String name) -> ffi::Any {
        std::string path = WorkPath(workdir, name);
        size_t dot = path.rfind('.');
        std::string ext = dot == std::string::npos ? "" : path.substr(dot);
        if (ext == ".o" || ext == ".tar") {
          TVM_FFI_THROW(ValueError)
              << "rpc_server loads shared libraries only (" << name
              << "): export the library with a cross compiler, e.g. "
                 "tvm.support.cc.cross_compiler(\"aarch64-linux-gnu-g++\")";
        }
        static const ffi::Function load = ffi::Function::GetGlobalRequired(
            "ffi.ModuleLoadFromFile");
        Log("load_module " + path);
        return load(ffi::String(path));
      }),
      true);
}

// The session child: a fresh work directory, the server functions, then the runtime's loop.
[[noreturn]] void ServeSession(int fd, const std::string& workdir, const Options& opts) {
  signal(SIGTERM, SIG_DFL);
  signal(SIGINT, SIG_DFL);
  if (opts.no_core_dumps) {
    struct rlimit none = {0, 0};
    setrlimit(RLIMIT_CORE, &none);
  }
  if (chdir(workdir.c_str()) != 0) Log("cannot enter " + workdir);
  int code = 0;
  try {
    RegisterSessionFunctions(workdir);
    tvm::ffi::Function::GetGlobalRequired("rpc.ServerLoop")(static_cast<int64_t>(fd));
  } catch (const std::exception& err) {
    Log(std::string("session error: ") + err.what());
    code = 1;
  }
  std::fflush(stderr);
  _exit(code);
}

std::string SignalName(int sig) {
  switch (sig) {
    case SIGILL: return "SIGILL";
    case SIGSEGV: return "SIGSEGV";
    case SIGBUS: return "SIGBUS";
    case SIGFPE: return "SIGFPE";
    case SIGABRT: return "SIGABRT";
    case SIGKILL: return "SIGKILL";
    default: return "signal " + std::to_string(sig);
  }
}

// Sends an RPC exception packet (the runtime's rpc.ReturnException) so the client's pending
// call raises with this text instead of waiting or reading a closed socket.
void ReturnException(int fd, const std::string& text) {
  try {
    tvm::ffi::Function::GetGlobalRequired("rpc.ReturnException")(static_cast<int64_t>(fd),
                                                                  tvm::ffi::String(text));
  } catch (const std::exception& err) {
    Log(std::string("could not tell the client: ") + err.what());
  }
}

int RemoveEntry(const char* path, const struct stat*, int, struct FTW*) { return remove(path); }

// A session being served: its child process, its socket (kept open here so that the client
// can be told why the session ended) and its work directory.
struct Session {
  int id;
  pid_t pid;
  int fd;
  std::string workdir;
  double deadline;  // monotonic seconds; 0: none
};

double Now() {
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return now.tv_sec + 1e-9 * now.tv_nsec;
}

// Reports how a session child ended (an RPC exception to the client if it was killed).
void SessionEnded(const Session& session, int status) {
  std::string tag = "session " + std::to_string(session.id) + ": ";
  if (WIFSIGNALED(status)) {
    int sig = WTERMSIG(status);
    const char* what = strsignal(sig);
    std::string text = SignalName(sig) + " (" + (what ? what : "?") + ")";
    if (sig == SIGILL) {
      text = "the remote CPU raised " + text +
             ": the code needs an instruction it lacks, e.g. +fullfp16 or +bf16 (compile for "
             "this CPU's mattr/mcpu); the session's process died";
    } else {
      text = "the session's process on the RPC server died of " + text;
    }
    Log(tag + text);
    ReturnException(session.fd, text);
  } else if (WIFEXITED(status) && WEXITSTATUS(status) != 0) {
    Log(tag + "ended with exit code " + std::to_string(WEXITSTATUS(status)));
  } else {
    Log(tag + "ended");
  }
}

void CloseSession(const Session& session) {
  close(session.fd);
  nftw(session.workdir.c_str(), RemoveEntry, 16, FTW_DEPTH | FTW_PHYS);
}

// Reaps ended sessions and kills those past their timeout.
void ReapSessions(std::vector<Session>* sessions) {
  for (size_t i = 0; i < sessions->size();) {
    Session& session = (*sessions)[i];
    int status = 0;
    pid_t done = waitpid(session.pid, &status, WNOHANG);
    if (done == 0 && session.deadline > 0 && Now() > session.deadline) {
      kill(session.pid, SIGKILL);
      waitpid(session.pid, &status, 0);
      Log("session " + std::to_string(session.id) + ": past its timeout, killed");
      ReturnException(session.fd,
                      "RPCSessionTimeoutError: the session passed its timeout and was killed, "
                      "try to increase the \"session_timeout\" value.");
      done = session.pid;
    } else if (done == session.pid) {
      SessionEnded(session, status);
    }
    if (done == session.pid || (done < 0 && errno == ECHILD)) {
      CloseSession(session);
      sessions->erase(sessions->begin() + static_cast<std::ptrdiff_t>(i));
    } else {
      ++i;
    }
  }
}

int Listen(const Options& opts) {
  struct addrinfo hints;
  std::memset(&hints, 0, sizeof(hints));
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  struct addrinfo* info = nullptr;
  std::string port = std::to_string(opts.port);
  if (getaddrinfo(opts.host.c_str(), port.c_str(), &hints, &info) != 0 || info == nullptr) {
    Log("cannot resolve " + opts.host);
    return -1;
  }
  int fd = socket(info->ai_family, info->ai_socktype, info->ai_protocol);
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  bool ok = fd >= 0 && bind(fd, info->ai_addr, info->ai_addrlen) == 0 && listen(fd, 4) == 0;
  freeaddrinfo(info);
  if (!ok) {
    Log("cannot listen on " + opts.host + ":" + port + ": " + std::strerror(errno));
    return -1;
  }
  return fd;
}

int BoundPort(int fd) {
  struct sockaddr_storage addr;
  socklen_t len = sizeof(addr);
  if (getsockname(fd, reinterpret_cast<struct sockaddr*>(&addr), &len) != 0) return -1;
  if (addr.ss_family == AF_INET6) {
    return ntohs(reinterpret_cast<struct sockaddr_in6*>(&addr)->sin6_port);
  }
  return ntohs(reinterpret_cast<struct sockaddr_in*>(&addr)->sin_port);
}

// ---- TVM's RPC tracker: a connection that registers this server (tracker.py's protocol: the
// magic, then messages of an int32 size and JSON, each answered by the tracker)

std::string Quote(const std::string& text) {  // a JSON string; PlainWord text needs no more
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

// A blocking socket connected to host:port within `timeout` seconds, with send and
// receive timeouts so that a tracker that stops answering cannot stall the server.
int ConnectTo(const std::string& host, int port, double timeout, std::string* why) {
  struct addrinfo hints;
  std::memset(&hints, 0, sizeof(hints));
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  struct addrinfo* info = nullptr;
  int code = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &info);
  if (code != 0 || info == nullptr) {
    *why = std::string("cannot resolve ") + host + ": " + gai_strerror(code);
    return -1;
  }
  int fd = -1;
  for (struct addrinfo* at = info; at != nullptr && fd < 0; at = at->ai_next) {
    fd = socket(at->ai_family, at->ai_socktype, at->ai_protocol);
    if (fd < 0) continue;
    int flags = fcntl(fd, F_GETFL, 0);
    fcntl(fd, F_SETFL, flags | O_NONBLOCK);
    int error = 0;
    if (connect(fd, at->ai_addr, at->ai_addrlen) != 0) {
      error = errno;
      if (error == EINPROGRESS) {
        struct pollfd wait_for = {fd, POLLOUT, 0};
        socklen_t len = sizeof(error);
        if (poll(&wait_for, 1, static_cast<int>(timeout * 1000)) != 1) {
          error = ETIMEDOUT;
        } else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &len) != 0) {
          error = errno;
        }
      }
    }
    if (error != 0) {
      *why = std::strerror(error);
      close(fd);
      fd = -1;
      continue;
    }
    fcntl(fd, F_SETFL, flags);
    struct timeval limit = {static_cast<time_t>(kTrackerIOTimeout), 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof(limit));
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &limit, sizeof(limit));
  }
  freeaddrinfo(info);
  return fd;
}

// One request to the tracker and its answer (the JSON text).
bool TrackerCall(int fd, const std::string& request, std::string* answer) {
  int32_t size = static_cast<int32_t>(request.size());
  if (!SendInt(fd, size) || !SendAll(fd, request.data(), request.size())) return false;
  if (!RecvAll(fd, &size, sizeof(size)) || size <= 0 || size > kMaxTrackerMessage) return false;
  answer->assign(static_cast<size_t>(size), '\0');
  return RecvAll(fd, &(*answer)[0], answer->size());
}

struct Tracker {
  int fd = -1;
  std::string match_key;  // what the tracker hands a client for this server; empty: not put
  bool registered = false;  // ever: the stdout line is printed once
  bool failing = false;     // the last attempt to reach the tracker failed (logged once)
  double next_connect = 0;
  double next_ping = 0;
  int unmatched = 0;  // pings in a row that found the match key handed out but not used
};

std::string TrackerName(const Options& opts) {
  return opts.tracker_host + ":" + std::to_string(opts.tracker_port);
}

std::string AddressJson(const Options& opts) {
  return opts.custom_addr.empty() ? "null" : Quote(opts.custom_addr);
}

void DropTracker(Tracker* tracker, const std::string& why) {
  close(tracker->fd);
  tracker->fd = -1;
  tracker->match_key.clear();
  tracker->failing = true;
  Log("lost the tracker (" + why + "), reconnecting every 2 s");
}

// The magic, then UPDATE_INFO: the tracker lists this server as "server:KEY" at its address.
bool ConnectTracker(const Options& opts, int port, Tracker* tracker) {
  std::string why = "no answer";
  int fd = ConnectTo(opts.tracker_host, opts.tracker_port, kTrackerIOTimeout, &why);
  int32_t magic = 0;
  std::string answer;
  bool ok = fd >= 0 && SendInt(fd, kTrackerMagic) && RecvAll(fd, &magic, sizeof(magic));
  if (ok && magic != kTrackerMagic) {
    why = "not a TVM RPC tracker (its first answer is not RPC_TRACKER_MAGIC)";
    ok = false;
  }
  ok = ok && TrackerCall(fd,
                         "[" + std::to_string(kTrackerUpdateInfo) + ", {\"key\": " +
                             Quote("server:" + opts.key) + ", \"addr\": [" + AddressJson(opts) +
                             ", " + std::to_string(port) + "]}]",
                         &answer) &&
       answer == "0";
  if (!ok) {
    if (fd >= 0) close(fd);
    if (!tracker->failing) {
      Log("cannot register with the tracker at " + TrackerName(opts) + " (" + why +
          "), trying every 2 s");
    }
    tracker->failing = true;
    return false;
  }
  tracker->fd = fd;
  tracker->failing = false;
  Log("connected to the tracker at " + TrackerName(opts));
  return true;
}

// PUT (port, a new match key) under KEY: the tracker may hand this server to a client.
bool PutMatchKey(const Options& opts, int port, Tracker* tracker) {
  static std::mt19937_64 random{std::random_device{}()};
  char suffix[17];
  std::snprintf(suffix, sizeof(suffix), "%016llx", static_cast<unsigned long long>(random()));
  std::string match_key = opts.key + ":" + suffix;
  std::string answer;
  if (!TrackerCall(tracker->fd,
                   "[" + std::to_string(kTrackerPut) + ", " + Quote(opts.key) + ", [" +
                       std::to_string(port) + ", " + Quote(match_key) + "], " +
                       AddressJson(opts) + "]",
                   &answer) ||
      answer != "0") {
    DropTracker(tracker, "PUT failed");
    return false;
  }
  tracker->match_key = match_key;
  tracker->unmatched = 0;
  tracker->next_ping = Now() + kTrackerPingPeriod;
  if (!tracker->registered) {
    tracker->registered = true;
    std::printf("registered with %s under key %s\n", TrackerName(opts).c_str(), opts.key.c_str());
    std::fflush(stdout);
  }
  return true;
}

// Called every turn of the main loop: (re)connects, puts a match key while the server is free
// (`idle`: no session of a tracker's client runs), and replaces one handed out but not used.
void ServeTracker(const Options& opts, int port, bool idle, Tracker* tracker) {
  double now = Now();
  if (tracker->fd < 0) {
    if (now < tracker->next_connect) return;
    tracker->next_connect = now + 2;
    if (!ConnectTracker(opts, port, tracker)) return;
  }
  if (!idle) return;
  if (tracker->match_key.empty()) {
    PutMatchKey(opts, port, tracker);
    return;
  }
  if (now < tracker->next_ping) return;
  tracker->next_ping = now + kTrackerPingPeriod;
  std::string pending;
  if (!TrackerCall(tracker->fd, "[" + std::to_string(kTrackerGetPendingMatchkeys) + "]",
                   &pending)) {
    DropTracker(tracker, "no answer to GET_PENDING_MATCHKEYS");
    return;
  }
  if (pending.find(Quote(tracker->match_key)) != std::string::npos) {
    tracker->unmatched = 0;
  } else if (++tracker->unmatched * kTrackerPingPeriod >
             kTrackerUnmatchedTimeout + kTrackerPingPeriod) {
    Log("the tracker handed out " + tracker->match_key + " but no client came: a new key");
    PutMatchKey(opts, port, tracker);
  }
}

}  // namespace

int main(int argc, char** argv) {
  Options opts = ParseOptions(argc, argv);
  // a client that went away must not kill the server when it is told why its session ended
  signal(SIGPIPE, SIG_IGN);
  // SIGTERM / SIGINT: end the sessions, remove their work directories, exit
  struct sigaction stop;
  std::memset(&stop, 0, sizeof(stop));
  stop.sa_handler = RequestStop;
  sigaction(SIGTERM, &stop, nullptr);
  sigaction(SIGINT, &stop, nullptr);
  // the runtime must provide the loop; fail now rather than at the first client
  if (!tvm::ffi::Function::GetGlobal("rpc.ServerLoop").has_value()) {
    Log("libtvm_runtime.so provides no rpc.ServerLoop (a runtime built without RPC?)");
    return 1;
  }
  int listen_fd = Listen(opts);
  if (listen_fd < 0) return 1;
  const int port = BoundPort(listen_fd);
  std::printf("listening on %s:%d\n", opts.host.c_str(), port);
  std::fflush(stdout);
  const bool tracked = !opts.tracker_host.empty();
  Tracker tracker;

  std::vector<Session> sessions;
  int accepted = 0;
  const pid_t parent = getppid();
  while (!stop_requested) {
    if (opts.exit_with_parent && getppid() != parent) {
      Log("the process that started the server is gone");
      break;
    }
    // sessions run side by side; the loop wakes every 50 ms to reap them and check timeouts
    ReapSessions(&sessions);
    if (opts.once && accepted > 0) {
      if (sessions.empty()) break;
      usleep(50 * 1000);
      continue;
    }
    if (tracked) ServeTracker(opts, port, sessions.empty(), &tracker);
    struct pollfd wait_for = {listen_fd, POLLIN, 0};
    if (poll(&wait_for, 1, 50) <= 0) continue;
    int fd = accept(listen_fd, nullptr, nullptr);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      Log(std::string("accept failed: ") + std::strerror(errno));
      return 1;
    }
    double timeout = 0;
    // without a tracker the key is the match key; with one, the key it handed out, and none
    // while the server is taken
    const std::string* match_key = &opts.key;
    if (tracked) match_key = tracker.match_key.empty() ? nullptr : &tracker.match_key;
    // a client that connects and says nothing must not stall the server (and its tracker
    // connection): the handshake has 10 s, the session no limit
    struct timeval limit = {10, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof(limit));
    if (!Handshake(fd, opts, match_key, &timeout)) {
      close(fd);
      continue;
    }
    limit = {0, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof(limit));
    if (tracked) tracker.match_key.clear();
    char pattern[] = "/tmp/tvm_rpc_XXXXXX";
    const char* tmp = mkdtemp(pattern);
    if (tmp == nullptr) {
      ReturnException(fd, std::string("rpc_server: no work directory: ") + std::strerror(errno));
      close(fd);
      continue;
    }
    Session session{++accepted, 0, fd, tmp, timeout > 0 ? Now() + timeout : 0};
    Log("session " + std::to_string(session.id) + ": serving in " + session.workdir);
    std::fflush(stderr);
    session.pid = fork();
    if (session.pid == 0) {
      close(listen_fd);
      if (tracker.fd >= 0) close(tracker.fd);
      for (const Session& other : sessions) close(other.fd);
      ServeSession(fd, session.workdir, opts);
    }
    if (session.pid < 0) {
      ReturnException(fd, std::string("rpc_server: fork failed: ") + std::strerror(errno));
      CloseSession(session);
      continue;
    }
    sessions.push_back(session);
  }
  close(listen_fd);
  if (tracker.fd >= 0) close(tracker.fd);
  for (const Session& session : sessions) kill(session.pid, SIGKILL);
  for (const Session& session : sessions) {
    waitpid(session.pid, nullptr, 0);
    CloseSession(session);
  }
  if (stop_requested) Log("stopped");
  return 0;
}
