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
//   rpc_server [--host 127.0.0.1] [--port 9090] [--key KEY] [--once] [--no-core-dumps]
//              [--exit-with-parent]
//
// --port 0 takes a free port; --once exits after the first session; --no-core-dumps sets a
// session's core size limit to 0; --exit-with-parent stops the server when the process that
// started it is gone (a test harness killed before it could stop the server). The server prints "listening on HOST:PORT" on stdout once it
// accepts connections; everything else goes to stderr.

#include <arpa/inet.h>
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
#include <string>
#include <vector>

#include <tvm/ffi/function.h>
#include <tvm/ffi/string.h>

namespace {

constexpr int32_t kRPCMagic = 0xFF271;               // base.RPC_MAGIC
constexpr int32_t kRPCCodeSuccess = kRPCMagic + 0;   // base.RPC_CODE_SUCCESS
constexpr int32_t kRPCCodeMismatch = kRPCMagic + 2;  // base.RPC_CODE_MISMATCH
constexpr int32_t kMaxKeyLength = 4096;

struct Options {
  std::string host = "127.0.0.1";
  int port = 9090;
  std::string key;
  bool once = false;
  bool no_core_dumps = false;
  bool exit_with_parent = false;
};

volatile sig_atomic_t stop_requested = 0;

void RequestStop(int) { stop_requested = 1; }

void Log(const std::string& text) { std::fprintf(stderr, "[rpc_server] %s\n", text.c_str()); }

[[noreturn]] void Usage(const char* prog, int code) {
  std::fprintf(code ? stderr : stdout,
               "usage: %s [--host ADDR] [--port N (0: a free one)] [--key KEY] [--once] "
               "[--no-core-dumps] [--exit-with-parent]\n",
               prog);
  std::exit(code);
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
    } else if (arg == "-h" || arg == "--help") {
      Usage(argv[0], 0);
    } else {
      Usage(argv[0], 2);
    }
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

// The handshake of TVM's Python server: returns whether the client was accepted, and the
// session timeout it asked for (seconds, 0: none).
bool Handshake(int fd, const Options& opts, double* timeout) {
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
  if (words.empty() || words[0] != "client:" + opts.key) {
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
  std::printf("listening on %s:%d\n", opts.host.c_str(), BoundPort(listen_fd));
  std::fflush(stdout);

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
    struct pollfd wait_for = {listen_fd, POLLIN, 0};
    if (poll(&wait_for, 1, 50) <= 0) continue;
    int fd = accept(listen_fd, nullptr, nullptr);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      Log(std::string("accept failed: ") + std::strerror(errno));
      return 1;
    }
    double timeout = 0;
    if (!Handshake(fd, opts, &timeout)) {
      close(fd);
      continue;
    }
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
  for (const Session& session : sessions) kill(session.pid, SIGKILL);
  for (const Session& session : sessions) {
    waitpid(session.pid, nullptr, 0);
    CloseSession(session);
  }
  if (stop_requested) Log("stopped");
  return 0;
}
