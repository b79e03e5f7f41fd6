#!/usr/bin/env python3
"""Same-host benchmark: vSocket vs kernel TCP between the same two VMs
(network namespaces of deploy/testbed.sh), in the same run.

  bench/same_host_bench.py [--bin BAZEL_BIN] [--seconds N] [--reps N] [--out DIR] [--only A,B]

Measures, REPS times (default 3) in turn for each mode — kernel TCP;
vSocket as a user gets it (libvsocket.so preloaded on both ends, default
upgrade policy: on a machine of few CPUs vsocketd shares, request/response
connections stay on kernel TCP until they stream, decision 51); and, for the
request/response measurements, vSocket with VSOCKET_UPGRADE=always (the
accelerated path's own cost) —
  - sockperf ping-pong RTT, 16 B (p50, p99, p99.9)
  - sockperf message rate, 16 B and 1 KiB, one connection
  - iperf3 bandwidth, 64 KiB writes, one stream
  - redis-benchmark SET/GET requests/s with 1 and 50 clients
  - CPU seconds per million messages (16 B message-rate test: client +
    server + vsocketd)
  - connect-to-first-byte time (connect, send 1 B, get the echo back)
  - redis-benchmark with 100 clients and 16 requests pipelined
  - nginx serving a 4 KiB file to wrk -c 16, keep-alive and with
    "Connection: close" (a connection per request)
  - Apache httpd, mpm_prefork (workers as www-data, through vm2's group)
    serving a 4 KiB file to ab -c 64, keep-alive (-k) and a connection per
    request
  - PostgreSQL (server as the user postgres, through vm2's group): pgbench
    TPC-B with 8 clients on 2 threads, select-only with 1 and 8 clients
  - socat copying 1 GiB one way, default 8 KiB buffers, into `wc -c` (a
    pipeline that counts what arrived), from the sender's start to the
    receiver's exit; and again with 512 KiB rings (VSOCKET_RING_KB=512 at
    both ends: what holding the sender's ring until the receiver consumed
    costs)
and prints a table of medians (min-max) and vSocket/kernel ratios of the
medians, against the do-no-harm goals of issue 15. Results go to
OUT/same-host-latest.json and .md (replacing the previous run's; older runs
are in git history), plots (.dat and, with gnuplot, .png) next to them.
"""
import argparse
import datetime
import glob
import os
import re
import shutil
import subprocess
import tempfile
import time

from benchlib import (DEFAULT_BIN, ROOT, SOCKPERF_PP_CAP, Bed, cpu_ticks, find_bin, machine, median_range, paired_ratio,
                      parse_iperf, parse_sockperf, plot_histogram, ratio_text, rep_values, save_results)

CLIENT_VM, SERVER_VM = "vm1", "vm2"


def sockperf(bed, accel, mode, size, seconds, port):
    srv = bed.start(bed.server_vm, accel, ["sockperf", "sr", "--tcp", "-i", bed.server_addr, "-p", str(port)],
                    seconds + 90)
    try:
        bed.wait_listening(bed.server_vm, port)
        server = [srv.child()]
        client = bed.start(bed.client_vm, accel, ["sockperf", mode, "--tcp", "-i", bed.server_addr, "-p", str(port),
                                              "-t", str(seconds), "-m", str(size)] + SOCKPERF_PP_CAP.get(mode, []),
                           seconds + 60)
        time.sleep(0.3)
        client_pids = [client.child()]
        daemon = list(bed.daemons.values())
        t0 = cpu_ticks(server + client_pids + daemon)
        client.finish()
        t1 = cpu_ticks(server + daemon)  # the client is gone; its time is in t1 below
    finally:
        srv.stop()
    res = parse_sockperf(client.text)
    res["cpu_ticks_server_daemon"] = t1 - t0
    return res


def iperf(bed, accel, seconds, port):
    srv = bed.start(bed.server_vm, accel, ["iperf3", "-s", "-B", bed.server_addr, "-p", str(port), "-1"], seconds + 90)
    try:
        bed.wait_listening(bed.server_vm, port)
        r = bed.run(bed.client_vm, accel, ["iperf3", "-c", bed.server_addr, "-p", str(port), "-t", str(seconds),
                                       "-l", "64K", "-J"], timeout=seconds + 60)
    finally:
        srv.stop()
    return parse_iperf(r.stdout, r.stderr)


def redis(bed, accel, port, runs=((1, 20000), (50, 100000), (100, 400000, 16))):
    """redis-benchmark SET and GET, for each (clients, requests[, pipeline])
    of runs: {set,get}_c<clients>[_p<pipeline>]_rps."""
    srv = bed.start(bed.server_vm, accel, ["redis-server", "--bind", bed.server_addr, "--port", str(port),
                                       "--save", "", "--appendonly", "no", "--protected-mode", "no"], 600)
    res = {}
    try:
        bed.wait_listening(bed.server_vm, port)
        for clients, n, *pipe in runs:
            extra = ["-P", str(pipe[0])] if pipe else []
            r = bed.run(bed.client_vm, accel, ["redis-benchmark", "-h", bed.server_addr, "-p", str(port),
                                           "-t", "set,get", "-n", str(n), "-c", str(clients), "--csv"] + extra)
            suffix = f"_p{pipe[0]}" if pipe else ""
            for line in r.stdout.splitlines():
                m = re.match(r'"(SET|GET)","([0-9.]+)"', line)
                if m:
                    res[f"{m.group(1).lower()}_c{clients}{suffix}_rps"] = float(m.group(2))
    finally:
        srv.stop()
    return res


NGINX_CONF = """daemon off;
master_process on;
user root;
worker_processes 1;
pid {d}/nginx.pid;
error_log {d}/error.log warn;
events {{ worker_connections 1024; }}
http {{
  access_log off;
  sendfile on;
  client_body_temp_path {d}/tmp;
  proxy_temp_path {d}/tmp;
  fastcgi_temp_path {d}/tmp;
  uwsgi_temp_path {d}/tmp;
  scgi_temp_path {d}/tmp;
  server {{ listen {addr}:{port}; root {d}/www; }}
}}
"""


def nginx(bed, accel, port, close, seconds=2, conns=16):
    """wrk -t2 -c<conns> on a 4 KiB file, with "Connection: close" (a
    connection per request) or keep-alive: {"rps", ["errors"]}."""
    d = tempfile.mkdtemp(prefix="vsocket-quick-")
    os.makedirs(f"{d}/www")
    os.makedirs(f"{d}/tmp")
    with open(f"{d}/www/f4096", "wb") as f:
        f.write(os.urandom(4096))
    with open(f"{d}/nginx.conf", "w") as f:
        f.write(NGINX_CONF.format(d=d, addr=bed.server_addr, port=port))
    srv = bed.start(bed.server_vm, accel, ["nginx", "-c", f"{d}/nginx.conf"], 120)
    try:
        bed.wait_listening(bed.server_vm, port)
        hdr = ["-H", "Connection: close"] if close else []
        r = bed.run(bed.client_vm, accel, ["wrk", "-t", "2", "-c", str(conns), "-d", str(seconds)] + hdr +
                    [f"http://{bed.server_addr}:{port}/f4096"], timeout=seconds + 60)
    finally:
        srv.stop()
        shutil.rmtree(d, ignore_errors=True)
    return wrk_result(r)


def wrk_result(r):
    m = re.search(r"Requests/sec:\s+([0-9.]+)", r.stdout)
    res = {"rps": float(m.group(1)) if m else 0.0}
    if "Socket errors" in r.stdout:
        res["errors"] = re.search(r"Socket errors:.*", r.stdout).group(0)
    if "Non-2xx" in r.stdout:
        res["errors"] = re.search(r"Non-2xx.*", r.stdout).group(0)
    return res


def node_http(bed, accel, port, seconds=2, conns=32):
    """Node.js's http server (tests/e2e/apps/http_server.js: libuv) serving
    a 4 KiB file to wrk -t2 -c<conns>, keep-alive: {"rps", ["errors"]}."""
    d = tempfile.mkdtemp(prefix="vsocket-node-")
    os.chmod(d, 0o755)
    with open(f"{d}/f4096", "wb") as f:
        f.write(os.urandom(4096))
    app = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "e2e", "apps", "http_server.js")
    srv = bed.start(bed.server_vm, accel, ["node", app, bed.server_addr, str(port), d], 120)
    try:
        bed.wait_listening(bed.server_vm, port, timeout_s=15.0)
        r = bed.run(bed.client_vm, accel, ["wrk", "-t", "2", "-c", str(conns), "-d", str(seconds),
                                           f"http://{bed.server_addr}:{port}/f4096"], timeout=seconds + 60)
    finally:
        srv.stop()
        shutil.rmtree(d, ignore_errors=True)
    return wrk_result(r)


# PostgreSQL runs as the user postgres, Apache's workers as www-data; they
# reach vm2's socket through a group of the run's own (vsocketd's `group =`,
# VSOCKET_VM_VM2_GROUP), removed at the end, and load a copy of the library
# they can read (Postgres.lib).
PG_GROUP = "vsocket-bench-vm2"
PG_GROUP_USERS = ("postgres", "www-data")


def add_pg_group(bed, vm):
    """Before the bed is up: the users postgres and www-data join
    PG_GROUP, which vm's socket is opened to (VSOCKET_VM_<VM>_GROUP).
    remove_pg_group undoes it."""
    subprocess.run(["groupadd", "-f", PG_GROUP], check=True)
    for u in PG_GROUP_USERS:
        subprocess.run(["usermod", "-aG", PG_GROUP, u], check=False, capture_output=True)
    bed.base_env[f"VSOCKET_VM_{vm.upper()}_GROUP"] = PG_GROUP


def remove_pg_group():
    for u in PG_GROUP_USERS:
        subprocess.run(["gpasswd", "-d", u, PG_GROUP], capture_output=True)
    subprocess.run(["groupdel", PG_GROUP], capture_output=True)


APACHE_CONF = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "e2e", "apps",
                           "apache_prefork.conf")


def apache_conf(d, addr, port):
    """tests/e2e/apps/apache_prefork.conf (the application matrix's too),
    its files under d."""
    text = open(APACHE_CONF).read()
    for k, v in (("@LISTEN@", f"{addr}:{port}"), ("@PIDFILE@", f"{d}/apache.pid"), ("@RUNDIR@", f"{d}/run"),
                 ("@ERRORLOG@", f"{d}/error.log"), ("@WWW@", f"{d}/www")):
        text = text.replace(k, v)
    return text


def apache(bed, accel, port, lib, keepalive, seconds=2, conns=64):
    """Apache httpd, mpm_prefork, 72 workers as www-data (the library a
    copy they can read, `lib`), serving a 4 KiB file to ab -c <conns> for
    `seconds`, with -k (keep-alive) or a connection per request:
    {"rps", ["errors"]}."""
    if not os.path.exists("/usr/sbin/apache2"):
        return {"rps": 0.0, "errors": "apache2 not installed"}
    d = tempfile.mkdtemp(prefix="vsocket-apache-")
    os.chmod(d, 0o755)
    os.makedirs(f"{d}/www")
    os.makedirs(f"{d}/run")
    with open(f"{d}/www/f4096", "wb") as f:
        f.write(os.urandom(4096))
    os.chmod(f"{d}/www/f4096", 0o644)
    with open(f"{d}/apache.conf", "w") as f:
        f.write(apache_conf(d, bed.server_addr, port))
    env = ["env", "-u", "LD_PRELOAD"]
    if accel:
        env = ["env", f"LD_PRELOAD={lib}", "VSOCKET_UPGRADE=" + ("always" if accel == "always" else "auto")]
    srv = bed.start(bed.server_vm, False, env + ["/usr/sbin/apache2", "-f", f"{d}/apache.conf", "-DFOREGROUND"], 120)
    try:
        bed.wait_listening(bed.server_vm, port, 15)
        time.sleep(0.5)  # (the 72 workers forked)
        r = bed.run(bed.client_vm, accel, ["ab", "-q", "-t", str(seconds), "-n", "10000000", "-c", str(conns)] +
                    (["-k"] if keepalive else []) + [f"http://{bed.server_addr}:{port}/f4096"], timeout=seconds + 60)
    finally:
        srv.stop()
        shutil.rmtree(d, ignore_errors=True)
    m = re.search(r"Requests per second:\s+([0-9.]+)", r.stdout)
    res = {"rps": float(m.group(1)) if m else 0.0}
    failed = re.search(r"Failed requests:\s+([0-9]+)", r.stdout)
    if not m or (failed and int(failed.group(1))):
        res["errors"] = (failed.group(0) if failed else r.stderr[-200:])
    return res


class Postgres:
    """A database made once per run (initdb, pgbench -i -s 1); the server
    is started per mode, preloaded or not."""

    def __init__(self, bed, lib):
        bins = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: [int(x) for x in re.findall(r"\d+", p)])
        self.bin = bins[-1] if bins else None
        self.dir = tempfile.mkdtemp(prefix="vsocket-bench-pg-")
        os.chmod(self.dir, 0o755)
        self.lib = os.path.join(self.dir, "libvsocket.so")
        shutil.copy(lib, self.lib)
        os.chmod(self.lib, 0o755)
        self.bed = bed
        self.port = 5433
        self.ready = False

    def _as_postgres(self, argv, timeout=60):
        return subprocess.run(["runuser", "-u", "postgres", "--"] + argv, capture_output=True, text=True,
                              timeout=timeout)

    def init(self):
        if self.bin is None:
            return "PostgreSQL not installed (deploy/install-deps.sh)"
        data = os.path.join(self.dir, "data")
        os.makedirs(data)
        os.makedirs(os.path.join(self.dir, "run"))
        shutil.chown(data, "postgres")
        shutil.chown(os.path.join(self.dir, "run"), "postgres")
        r = self._as_postgres([f"{self.bin}/initdb", "-D", data, "-A", "trust", "--no-sync"])
        if r.returncode != 0:
            return "initdb: " + r.stderr[-300:]
        with open(os.path.join(data, "postgresql.conf"), "a") as f:
            f.write(f"listen_addresses = '{self.bed.server_addr}'\nport = {self.port}\n"
                    f"unix_socket_directories = '{self.dir}/run'\nmax_connections = 40\nfsync = off\n")
        with open(os.path.join(data, "pg_hba.conf"), "a") as f:
            f.write("host all all 0.0.0.0/0 trust\n")
        srv = self.start(False)
        try:
            r = self.bed.run(self.bed.client_vm, False, ["pgbench", "-h", self.bed.server_addr, "-p", str(self.port),
                                                "-U", "postgres", "-i", "-s", "1", "-q", "postgres"])
        finally:
            self.stop(srv)
        if r.returncode != 0:
            return "pgbench -i: " + r.stderr[-300:]
        self.ready = True
        return None

    def start(self, accel):
        env = ["env", "-u", "LD_PRELOAD"]
        if accel:
            env = ["env", f"LD_PRELOAD={self.lib}", "VSOCKET_UPGRADE=" + ("always" if accel == "always" else "auto")]
        srv = self.bed.start(self.bed.server_vm, False, ["runuser", "-u", "postgres", "--"] + env +
                             [f"{self.bin}/postgres", "-D", os.path.join(self.dir, "data")], 600)
        self.bed.wait_listening(self.bed.server_vm, self.port, 15)
        return srv

    def stop(self, srv):
        self._as_postgres([f"{self.bin}/pg_ctl", "-D", os.path.join(self.dir, "data"), "stop", "-m", "fast", "-w"])
        srv.finish(10)

    def remove(self):
        shutil.rmtree(self.dir, ignore_errors=True)


def pgbench(bed, pg, accel, seconds):
    """TPC-B (-c 8 -j 2) and select-only (-S, 1 and 8 clients), pgbench
    under the same mode as the server: {tpcb_c8_tps, select_c1_tps,
    select_c8_tps} (tps without connection set-up)."""
    if not pg.ready:
        return {"error": "no database"}
    srv = pg.start(accel)
    res = {}
    try:
        for key, extra in (("tpcb_c8_tps", ["-c", "8", "-j", "2"]), ("select_c1_tps", ["-S", "-c", "1"]),
                           ("select_c8_tps", ["-S", "-c", "8", "-j", "2"])):
            r = bed.run(bed.client_vm, accel, ["pgbench", "-h", bed.server_addr, "-p", str(pg.port), "-U", "postgres",
                                           "-n", "-T", str(seconds)] + extra + ["postgres"], timeout=seconds + 60)
            m = re.search(r"tps = ([0-9.]+) \((?:without initial connection time|excluding connections establishing)",
                          r.stdout)
            if m:
                res[key] = float(m.group(1))
            else:
                res.setdefault("errors", []).append(key + ": " + (r.stdout + r.stderr)[-200:])
    finally:
        pg.stop(srv)
    return res


SOCAT_BYTES = 1 << 30

# The applications' rows, here and in cross_host_bench (same runners, same
# result keys): (metric, measurement, field of its result); the do-no-harm
# goal of each is >= 1.
APP_METRICS = [
    ("redis SET, 1 client (req/s)", "redis", "set_c1_rps"),
    ("redis GET, 1 client (req/s)", "redis", "get_c1_rps"),
    ("redis SET, 50 clients (req/s)", "redis", "set_c50_rps"),
    ("redis GET, 50 clients (req/s)", "redis", "get_c50_rps"),
    ("redis SET, 100 clients, pipeline 16 (req/s)", "redis", "set_c100_p16_rps"),
    ("redis GET, 100 clients, pipeline 16 (req/s)", "redis", "get_c100_p16_rps"),
    ("nginx 4 KiB, keep-alive, wrk -c 16 (req/s)", "nginx_keepalive", "rps"),
    ("nginx 4 KiB, keep-alive, wrk -c 32 (req/s)", "nginx_keepalive_32", "rps"),
    ("Node.js http 4 KiB, keep-alive, wrk -c 32 (req/s)", "node_keepalive_32", "rps"),
    ("nginx 4 KiB, Connection: close, wrk -c 16 (req/s)", "nginx_close", "rps"),
    ("Apache prefork 4 KiB, keep-alive, ab -c 64 -k (req/s)", "apache_keepalive", "rps"),
    ("Apache prefork 4 KiB, a connection per request, ab -c 64 (req/s)", "apache_close", "rps"),
    ("PostgreSQL TPC-B, pgbench -c 8 -j 2 (tps)", "pgbench", "tpcb_c8_tps"),
    ("PostgreSQL select-only, 1 client (tps)", "pgbench", "select_c1_tps"),
    ("PostgreSQL select-only, 8 clients (tps)", "pgbench", "select_c8_tps"),
    ("socat 1 GiB one way (Gbit/s)", "socat", "gbit_per_s"),
]


def socat(bed, accel, port, ring_kb=None):
    """socat copies 1 GiB one way (socat's default 8 KiB buffers) into
    `wc -c`: {"seconds", "gbit_per_s"} from the sender's start to the
    receiver's exit; an error unless every byte arrived. ring_kb: both
    ends' VSOCKET_RING_KB (vSocket modes)."""
    extra = {"VSOCKET_RING_KB": str(ring_kb)} if ring_kb else None
    srv = bed.start(bed.server_vm, accel, ["sh", "-c", f"socat -u TCP-LISTEN:{port},bind={bed.server_addr},reuseaddr "
                                       "STDOUT | wc -c"], 300, extra_env=extra)
    try:
        bed.wait_listening(bed.server_vm, port)
        t0 = time.monotonic()
        r = bed.run(bed.client_vm, accel, ["socat", "-u", f"OPEN:/dev/zero,readbytes={SOCAT_BYTES}",
                                       f"TCP:{bed.server_addr}:{port}"], timeout=240, extra_env=extra)
        srv.finish(240)
        t = time.monotonic() - t0
    finally:
        srv.stop()
    got = int(srv.text.split()[-1]) if srv.text.split() and srv.text.split()[-1].isdigit() else -1
    if r.returncode != 0 or got != SOCAT_BYTES:
        return {"error": f"received {got} of {SOCAT_BYTES} bytes: " + r.stderr[-200:]}
    return {"seconds": t, "gbit_per_s": SOCAT_BYTES * 8 / t / 1e9}


CONNECT_PROBE = r'''
import socket, sys, time
addr, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
ts = []
for i in range(n):
    t0 = time.perf_counter()
    c = socket.create_connection((addr, port))
    c.sendall(b"E!")
    c.recv(1)
    ts.append((time.perf_counter() - t0) * 1e6)
    c.close()
ts.sort()
print(ts[len(ts) // 2], ts[int(len(ts) * 0.99)])
'''


def connect_first_byte(bed, accel, peer_bin, port):
    srv = bed.start(bed.server_vm, accel, [peer_bin, bed.server_addr, str(port)], 300)
    try:
        bed.wait_listening(bed.server_vm, port)
        r = bed.run(bed.client_vm, accel, ["python3", "-c", CONNECT_PROBE, bed.server_addr, str(port), "300"])
    finally:
        srv.stop()
    try:
        p50, p99 = (float(x) for x in r.stdout.split())
        return {"p50_us": p50, "p99_us": p99}
    except ValueError:
        return {"error": r.stdout[-300:] + r.stderr[-300:]}


# Request/response measurements, also run with VSOCKET_UPGRADE=always.
RR = ("pingpong_16", "redis", "connect", "nginx_keepalive", "nginx_keepalive_32", "node_keepalive_32", "nginx_close",
      "apache_keepalive", "apache_close", "pgbench")


# The measurements, in the order a repetition runs them.
STEPS = ("pingpong_16", "rate_16", "rate_1k", "bandwidth_64k", "redis", "connect", "nginx_keepalive",
         "nginx_keepalive_32", "node_keepalive_32", "nginx_close", "apache_keepalive", "apache_close", "pgbench", "socat",
         "socat_ring512")


def measure(bed, accel, seconds, port, peer, pg, only=None):
    """One repetition of every measurement (or those in `only`) in one mode."""
    R = {}
    steps = [("pingpong_16", lambda p: sockperf(bed, accel, "pp", 16, seconds, p)),
             ("rate_16", lambda p: sockperf(bed, accel, "tp", 16, seconds, p)),
             ("rate_1k", lambda p: sockperf(bed, accel, "tp", 1024, seconds, p)),
             ("bandwidth_64k", lambda p: iperf(bed, accel, seconds, p)),
             ("redis", lambda p: redis(bed, accel, p)),
             ("connect", lambda p: connect_first_byte(bed, accel, peer, p)),
             ("nginx_keepalive", lambda p: nginx(bed, accel, p, close=False, seconds=seconds)),
             ("nginx_keepalive_32", lambda p: nginx(bed, accel, p, close=False, seconds=seconds, conns=32)),
             ("node_keepalive_32", lambda p: node_http(bed, accel, p, seconds=seconds)),
             ("nginx_close", lambda p: nginx(bed, accel, p, close=True, seconds=seconds)),
             ("apache_keepalive", lambda p: apache(bed, accel, p, pg.lib, keepalive=True, seconds=seconds)),
             ("apache_close", lambda p: apache(bed, accel, p, pg.lib, keepalive=False, seconds=seconds)),
             ("pgbench", lambda p: pgbench(bed, pg, accel, max(3, seconds))),
             ("socat", lambda p: socat(bed, accel, p)),
             # Twice the default rings: as many bytes in flight as a sender
             # that freed its ring at the copy would have (what holding the
             # ring until the receiver consumed costs: docs/benchmarks.md).
             ("socat_ring512", lambda p: socat(bed, accel, p, ring_kb=512))]
    assert tuple(k for k, _ in steps) == STEPS
    for i, (key, fn) in enumerate(steps):
        if only is None or key in only:
            R[key] = fn(port + i)
    return R


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=DEFAULT_BIN)
    ap.add_argument("--seconds", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", default=os.path.join(ROOT, "bench/results"))
    ap.add_argument("--only", help="comma-separated measurements (e.g. pgbench,socat): a partial run, "
                    "for development; its results go to --out all the same")
    a = ap.parse_args()
    only_arg = set(a.only.split(",")) if a.only else None
    bed = Bed(a.bin)
    peer = find_bin(a.bin, "tests/socket/socket_peer")
    add_pg_group(bed, SERVER_VM)
    bed.up(CLIENT_VM, SERVER_VM)
    pg = Postgres(bed, bed.lib)
    pg_error = pg.init()
    if pg_error:
        print("PostgreSQL rows skipped: " + pg_error, flush=True)
    t_start = time.time()
    results = {"date": datetime.datetime.utcnow().isoformat() + "Z", "cpus": os.cpu_count(),
               "machine": machine(), "binaries": bed.binaries(), "reps_n": a.reps, "seconds": a.seconds,
               "loadavg_before": os.getloadavg()[0], "reps": {"kernel": [], "vsocket": [], "always": []}, "interleaved": True}
    try:
        # The modes alternate per measurement (kernel, vSocket, always, then
        # the next measurement), so that whatever drifts during a run (the
        # machine's other load, a database's checkpoints after TPC-B) falls
        # on every mode alike rather than on whichever mode ran then.
        port = 12000
        modes = (("kernel", False, None), ("vsocket", "auto", None), ("always", "always", RR))
        for rep in range(a.reps):
            print(f"== rep {rep + 1}/{a.reps}", flush=True)
            for mode, _, _ in modes:
                results["reps"][mode].append({})
            for key in STEPS:
                if only_arg is not None and key not in only_arg:
                    continue
                for mode, accel, only in modes:
                    if only is not None and key not in only:
                        continue
                    results["reps"][mode][-1].update(measure(bed, accel, a.seconds, port, peer, pg, {key}))
                    port += 20
    finally:
        bed.down()
        pg.remove()
        remove_pg_group()
    results["loadavg_after"] = os.getloadavg()[0]
    results["wall_s"] = round(time.time() - t_start, 1)

    def cpu_per_million(R):
        t = R["rate_16"]
        msgs = t.get("messages") or t.get("msg_per_s", 0) * a.seconds
        hz = os.sysconf("SC_CLK_TCK")
        return (t["cpu_ticks_server_daemon"] / hz) / (msgs / 1e6) if msgs else float("nan")

    # (metric, value of one repetition, do-no-harm goal as a ratio, "<=" or ">=")
    rows = [
        # (A run sockperf did not finish has no percentiles: no value, not 0.)
        ("RTT p50, 16 B (us)", lambda R: 2 * R["pingpong_16"]["p50"], 1.0, "<="),
        ("RTT p99, 16 B (us)", lambda R: 2 * R["pingpong_16"]["p99"], 1.2, "<="),
        ("RTT p99.9, 16 B (us)", lambda R: 2 * R["pingpong_16"]["p99.9"], None, ""),
        ("message rate, 16 B (msg/s)", lambda R: R["rate_16"].get("msg_per_s", 0), 1.0, ">="),
        ("message rate, 1 KiB (msg/s)", lambda R: R["rate_1k"].get("msg_per_s", 0), 1.0, ">="),
        ("bandwidth, 64 KiB writes (Gbit/s)", lambda R: R["bandwidth_64k"].get("gbit_per_s", 0), 1.0, ">="),
        *[(name, lambda R, m=meas, f=field: R[m].get(f, 0), 1.0, ">=") for name, meas, field in APP_METRICS],
        ("socat 1 GiB one way, 512 KiB rings (Gbit/s)", lambda R: R["socat_ring512"].get("gbit_per_s", 0), None, ""),
        ("CPU s per million 16 B msgs (server+daemon)", cpu_per_million, None, ""),
        ("connect to first byte, p50 (us)", lambda R: R["connect"].get("p50_us", 0), 1.5, "<="),
    ]
    rr_metrics = ("RTT", "redis", "connect", "nginx", "Node.js", "Apache", "PostgreSQL")

    def values(mode, fn):
        return rep_values(results["reps"][mode], fn)

    table = []
    for metric, fn, g, op in rows:
        kv = values("kernel", fn)
        k = median_range(kv)
        for mode, suffix in (("vsocket", ""), ("always", ", --upgrade always")):
            if mode == "always" and not metric.startswith(rr_metrics):
                continue
            vv = values(mode, fn)
            v = median_range(vv)
            r = paired_ratio(kv, vv)
            goal_text = f"{op} {g:g}" if g is not None and mode == "vsocket" else ""
            met = None
            if goal_text:
                met = r[0] <= g if op == "<=" else r[0] >= g
            table.append({"metric": metric + suffix, "mode": mode, "kernel": k[0], "kernel_range": [k[1], k[2]],
                          "vsocket": v[0], "vsocket_range": [v[1], v[2]], "ratio": r[0], "ratio_range": [r[1], r[2]],
                          "goal": goal_text, "met": met})
    results["table"] = table
    md = [f"# Same-host benchmark, {results['date']} ({results['cpus']} CPUs), vSocket vs kernel TCP, same run",
          "", f"{a.reps} repetitions of {a.seconds} s per test, the modes alternating per test; medians (min-max); "
          "vSocket/kernel: the median (min-max) of each repetition's ratio. "
          "vSocket: the default upgrade policy; --upgrade always: every connection accelerated.", "",
          "| metric | kernel TCP | vSocket | vSocket/kernel | do-no-harm goal |", "|---|--:|--:|--:|---|"]
    for row in table:
        g = f"{row['goal']}: {'met' if row['met'] else 'missed'}" if row["goal"] else ""
        md.append(f"| {row['metric']} | {row['kernel']:.2f} ({row['kernel_range'][0]:.2f}-{row['kernel_range'][1]:.2f}) "
                  f"| {row['vsocket']:.2f} ({row['vsocket_range'][0]:.2f}-{row['vsocket_range'][1]:.2f}) "
                  f"| {ratio_text(row)} | {g} |")
    text = "\n".join(md) + "\n"
    latest = save_results(a.out, "same-host", results, text)
    print(text)
    plot(results, latest)


def plot(results, base):
    table = results["table"]
    lat = [r for r in table if r["metric"].startswith(("RTT", "connect"))]
    plot_histogram(base, "latency", "vSocket vs kernel TCP, same host (absolute)", "microseconds (lower is better)",
                   [r["metric"] for r in lat],
                   [("kernel TCP", [r["kernel"] for r in lat]), ("vSocket", [r["vsocket"] for r in lat])])
    rates = [r for r in table if not r["metric"].startswith(("RTT", "connect", "CPU"))]
    plot_histogram(base, "rates", "vSocket vs kernel TCP, same host (ratio)", "vSocket / kernel TCP (higher is better)",
                   [r["metric"] for r in rates], [("vSocket / kernel TCP", [r["ratio"] for r in rates])],
                   logscale=True, hline=(1, "kernel TCP = 1"))


if __name__ == "__main__":
    main()
