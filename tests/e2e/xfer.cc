// xfer: byte-checked TCP transfers for end-to-end tests (plain POSIX, so it
// runs with and without libvsocket preloaded).
//
//   xfer server ADDR PORT [--conns N] [--one-way] [--fork] [--stall-ms S]
//   xfer client ADDR PORT [--conns N] [--bytes L] [--one-way] [--crash] [--pause-ms P]
//
// Each connection: the client sends a 16-byte header {length, seed} and
// `length` bytes of a deterministic stream derived from the seed, in random
// chunk sizes; the server checks every byte, then (unless --one-way) sends
// `length` bytes of the stream for seed^1, which the client checks. Then an
// orderly shutdown: each side must see EOF exactly after the data.
// --crash: the client SIGKILLs itself right after its last write (no close):
// the server must still receive every byte, then EOF.
// --close-after-write (client, with --one-way): close() right after the
// last write, no shutdown; --exit-delay-ms D: stay D ms after the
// last connection before exiting (a long-lived process).
// --fork: the server accepts, then forks a child per connection that serves
// it, and closes its own copy (as PostgreSQL and Apache do).
// --rounds R [--gap-ms G] (both sides): request/response instead of one
// stream each way: R rounds of length/R bytes from the client, each
// answered by as many from the server, G ms apart, so a connection lives
// long enough to see its path change (link loss, RESYNC, re-upgrade).
// --pause-ms P (client): sleep P ms between the header and the stream, or
// the first round (so the stream goes accelerated); --split-pause-ms Q (client): and Q ms
// between the stream's two halves; --split-wait-file F (client): instead
// of a fixed pause, wait (at most 60 s) until file F exists before the
// second half (the test creates it once its fault is in place);
// --start-wait-file F (client): wait (at most 60 s) after the header
// (and the pause) until file F exists before the stream's first byte (the
// test creates it once it saw every connection accelerated);
// --stall-ms S (server): sleep S ms between
// the header and reading the stream (so the client's bytes and its
// shutdown wait, unconsumed, e.g. across a link loss).
// Exit status 0 only if every connection verified.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace {

uint8_t StreamByte(uint64_t seed, uint64_t i) {
  uint64_t z = seed + (i / 8) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<uint8_t>(z >> (8 * (i % 8)));
}

// Until FILE exists (bounded: 60 s); nothing if FILE is empty.
void WaitForFile(const std::string& file) {
  for (int t = 0; !file.empty() && access(file.c_str(), F_OK) != 0 && t < 6000; ++t) usleep(10000);
}

bool WriteAll(int fd, const uint8_t* p, size_t n) {
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      std::fprintf(stderr, "xfer: write: %s\n", std::strerror(errno));
      return false;
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

// Sends `len` bytes of stream `seed` in random chunks.
bool SendStream(int fd, uint64_t seed, uint64_t len, std::mt19937& rng) {
  std::vector<uint8_t> buf(256 * 1024);
  for (uint64_t off = 0; off < len;) {
    size_t n = std::min<uint64_t>(len - off, 1 + rng() % buf.size());
    for (size_t i = 0; i < n; ++i) buf[i] = StreamByte(seed, off + i);
    if (!WriteAll(fd, buf.data(), n)) return false;
    off += n;
  }
  return true;
}

// Receives and checks `len` bytes of stream `seed`; then expects EOF.
bool RecvStream(int fd, uint64_t seed, uint64_t len, std::mt19937& rng, const char* who) {
  std::vector<uint8_t> buf(256 * 1024);
  uint64_t off = 0;
  while (off < len) {
    size_t want = std::min<uint64_t>(len - off, 1 + rng() % buf.size());
    ssize_t r = read(fd, buf.data(), want);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      std::fprintf(stderr, "xfer %s: %s after %llu of %llu bytes\n", who, r == 0 ? "early EOF" : std::strerror(errno),
                   (unsigned long long)off, (unsigned long long)len);
      return false;
    }
    for (ssize_t i = 0; i < r; ++i) {
      if (buf[i] != StreamByte(seed, off + i)) {
        std::fprintf(stderr, "xfer %s: byte %llu corrupted\n", who, (unsigned long long)(off + i));
        return false;
      }
    }
    off += static_cast<uint64_t>(r);
  }
  uint8_t extra;
  ssize_t r;
  do {
    r = read(fd, &extra, 1);
  } while (r < 0 && errno == EINTR);
  if (r != 0) {
    std::fprintf(stderr, "xfer %s: expected EOF, got %zd (%s)\n", who, r, r < 0 ? std::strerror(errno) : "data");
    return false;
  }
  return true;
}

// Exactly n bytes of stream `seed` from offset off, checked.
bool RecvRange(int fd, uint64_t seed, uint64_t off, uint64_t n, const char* who) {
  std::vector<uint8_t> buf(64 * 1024);
  for (uint64_t done = 0; done < n;) {
    ssize_t r = read(fd, buf.data(), std::min<uint64_t>(n - done, buf.size()));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      std::fprintf(stderr, "xfer %s: %s at byte %llu\n", who, r == 0 ? "early EOF" : std::strerror(errno),
                   (unsigned long long)(off + done));
      return false;
    }
    for (ssize_t i = 0; i < r; ++i) {
      if (buf[i] != StreamByte(seed, off + done + i)) {
        std::fprintf(stderr, "xfer %s: byte %llu corrupted\n", who, (unsigned long long)(off + done + i));
        return false;
      }
    }
    done += static_cast<uint64_t>(r);
  }
  return true;
}

bool SendRange(int fd, uint64_t seed, uint64_t off, uint64_t n) {
  std::vector<uint8_t> buf(n);
  for (uint64_t i = 0; i < n; ++i) buf[i] = StreamByte(seed, off + i);
  return WriteAll(fd, buf.data(), n);
}

bool ExpectEof(int fd, const char* who) {
  uint8_t extra;
  ssize_t r;
  do {
    r = read(fd, &extra, 1);
  } while (r < 0 && errno == EINTR);
  if (r != 0) std::fprintf(stderr, "xfer %s: expected EOF, got %zd\n", who, r);
  return r == 0;
}

sockaddr_in Addr(const char* ip, int port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, ip, &a.sin_addr) != 1) {
    std::fprintf(stderr, "xfer: bad address %s\n", ip);
    std::exit(2);
  }
  return a;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: xfer server|client ADDR PORT [--conns N] [--bytes L] [--one-way] [--crash]\n");
    return 2;
  }
  std::string mode = argv[1];
  sockaddr_in addr = Addr(argv[2], std::atoi(argv[3]));
  int conns = 1;
  uint64_t bytes = 1 << 20;
  bool one_way = false, crash = false, fork_server = false, close_after_write = false;
  int exit_delay_ms = 0;
  uint64_t rounds = 0;
  int gap_ms = 0, pause_ms = 0, stall_ms = 0, split_pause_ms = 0;
  std::string split_wait_file, start_wait_file;
  for (int i = 4; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--conns" && i + 1 < argc) conns = std::atoi(argv[++i]);
    else if (a == "--bytes" && i + 1 < argc) bytes = std::strtoull(argv[++i], nullptr, 10);
    else if (a == "--one-way") one_way = true;
    else if (a == "--crash") crash = true;
    else if (a == "--close-after-write") close_after_write = true;
    else if (a == "--exit-delay-ms" && i + 1 < argc) exit_delay_ms = std::atoi(argv[++i]);
    else if (a == "--fork") fork_server = true;
    else if (a == "--rounds" && i + 1 < argc) rounds = std::strtoull(argv[++i], nullptr, 10);
    else if (a == "--gap-ms" && i + 1 < argc) gap_ms = std::atoi(argv[++i]);
    else if (a == "--pause-ms" && i + 1 < argc) pause_ms = std::atoi(argv[++i]);
    else if (a == "--stall-ms" && i + 1 < argc) stall_ms = std::atoi(argv[++i]);
    else if (a == "--split-pause-ms" && i + 1 < argc) split_pause_ms = std::atoi(argv[++i]);
    else if (a == "--split-wait-file" && i + 1 < argc) split_wait_file = argv[++i];
    else if (a == "--start-wait-file" && i + 1 < argc) start_wait_file = argv[++i];
  }
  signal(SIGPIPE, SIG_IGN);
  std::atomic<int> ok{0};
  std::atomic<uint64_t> total{0};
  if (mode == "server") {
    int ls = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(ls, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || listen(ls, 128) != 0) {
      std::perror("xfer server: bind/listen");
      return 1;
    }
    std::vector<std::thread> threads;
    std::vector<pid_t> children;
    for (int i = 0; i < conns; ++i) {
      int c = accept(ls, nullptr, nullptr);
      if (c < 0) {
        std::perror("xfer server: accept");
        return 1;
      }
      auto serve = [&, c, i] {
        std::mt19937 rng(1000 + i);
        uint8_t hdr[16];
        size_t got = 0;
        while (got < 16) {
          ssize_t r = read(c, hdr + got, 16 - got);
          if (r <= 0) {
            std::fprintf(stderr, "xfer server: no header\n");
            close(c);
            return;
          }
          got += static_cast<size_t>(r);
        }
        uint64_t len, seed;
        std::memcpy(&len, hdr, 8);
        std::memcpy(&seed, hdr + 8, 8);
        bool good;
        if (rounds > 0) {
          uint64_t chunk = len / rounds;
          good = true;
          for (uint64_t r = 0; good && r < rounds; ++r)
            good = RecvRange(c, seed, r * chunk, chunk, "server") && SendRange(c, seed ^ 1, r * chunk, chunk);
          good = good && ExpectEof(c, "server") && shutdown(c, SHUT_WR) == 0;
          if (good) {
            ok++;
            total += chunk * rounds;
          }
          close(c);
          return;
        }
        if (stall_ms > 0) usleep(static_cast<useconds_t>(stall_ms) * 1000);
        good = RecvStream(c, seed, len, rng, "server");
        if (good && !one_way) good = SendStream(c, seed ^ 1, len, rng) && shutdown(c, SHUT_WR) == 0;
        if (good) {
          ok++;
          total += len;
        }
        close(c);
      };
      if (!fork_server) {
        threads.emplace_back(serve);
        continue;
      }
      pid_t pid = fork();
      if (pid == 0) {
        close(ls);
        serve();
        _exit(ok == 1 ? 0 : 1);
      }
      children.push_back(pid);
      close(c);  // the child owns the connection now
    }
    for (auto& t : threads) t.join();
    for (pid_t pid : children) {
      int status = 0;
      waitpid(pid, &status, 0);
      if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
        ok++;
        total += bytes;  // the child verified its own length
      } else if (WIFSIGNALED(status)) {
        std::fprintf(stderr, "xfer server: child %d killed by signal %d\n", pid, WTERMSIG(status));
      }
    }
    close(ls);
    std::printf("xfer server: %d/%d connections verified, %llu bytes each way\n", ok.load(), conns,
                (unsigned long long)total.load());
    std::fflush(stdout);
    // (As the client's: a server that goes on after its connections closed.)
    if (exit_delay_ms > 0) usleep(static_cast<useconds_t>(exit_delay_ms) * 1000);
    return ok == conns ? 0 : 1;
  }
  std::vector<std::thread> threads;
  for (int i = 0; i < conns; ++i) {
    threads.emplace_back([&, i] {
      std::mt19937 rng(2000 + i);
      int s = socket(AF_INET, SOCK_STREAM, 0);
      int r = -1;
      for (int attempt = 0; attempt < 50 && r != 0; ++attempt) {
        r = connect(s, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr));
        if (r != 0 && errno == ECONNREFUSED && attempt < 49) usleep(20000);
        else if (r != 0) break;
        if (r != 0) {
          close(s);
          s = socket(AF_INET, SOCK_STREAM, 0);
        }
      }
      if (r != 0) {
        std::fprintf(stderr, "xfer client: connect: %s\n", std::strerror(errno));
        close(s);
        return;
      }
      uint64_t seed = 0xC0FFEE00ull + static_cast<uint64_t>(i);
      uint8_t hdr[16];
      std::memcpy(hdr, &bytes, 8);
      std::memcpy(hdr + 8, &seed, 8);
      if (rounds > 0) {
        uint64_t chunk = bytes / rounds;
        bool good = WriteAll(s, hdr, 16);
        if (good && pause_ms > 0) usleep(static_cast<useconds_t>(pause_ms) * 1000);
        for (uint64_t r = 0; good && r < rounds; ++r) {
          good = SendRange(s, seed, r * chunk, chunk) && RecvRange(s, seed ^ 1, r * chunk, chunk, "client");
          if (gap_ms > 0) usleep(static_cast<useconds_t>(gap_ms) * 1000);
        }
        good = good && shutdown(s, SHUT_WR) == 0 && ExpectEof(s, "client");
        if (good) {
          ok++;
          total += chunk * rounds;
        }
        close(s);
        return;
      }
      bool good = WriteAll(s, hdr, 16);
      if (good && pause_ms > 0) usleep(static_cast<useconds_t>(pause_ms) * 1000);
      if (good) WaitForFile(start_wait_file);
      if (split_pause_ms > 0 || !split_wait_file.empty()) {
        good = good && SendRange(s, seed, 0, bytes / 2);
        usleep(static_cast<useconds_t>(split_pause_ms) * 1000);
        WaitForFile(split_wait_file);
        good = good && SendRange(s, seed, bytes / 2, bytes - bytes / 2);
      } else {
        good = good && SendStream(s, seed, bytes, rng);
      }
      if (crash) {
        kill(getpid(), SIGKILL);  // no close, no shutdown: as if the process died
      }
      if (close_after_write) {
        close(s);  // no shutdown, no reading: the bytes may still be in flight
        if (good) {
          ok++;
          total += bytes;
        }
        return;
      }
      if (good) good = shutdown(s, SHUT_WR) == 0;
      if (good && !one_way) good = RecvStream(s, seed ^ 1, bytes, rng, "client");
      if (good) {
        ok++;
        total += bytes;
      }
      close(s);
    });
  }
  for (auto& t : threads) t.join();
  std::printf("xfer client: %d/%d connections verified, %llu bytes each way\n", ok.load(), conns,
              (unsigned long long)total.load());
  std::fflush(stdout);
  // A long-lived process (a server that closed a connection and goes on):
  // what the library does after close() in the background gets its time.
  if (exit_delay_ms > 0) usleep(static_cast<useconds_t>(exit_delay_ms) * 1000);
  return ok == conns ? 0 : 1;
}
