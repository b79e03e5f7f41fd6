#!/usr/bin/env python3
"""Load test of the cluster directory (issue 38, deliverable 5) against a
real etcd started here on loopback (127.0.0.1, free ports, a temporary data
directory; killed by its PID at the end).

A simulated fleet of HOSTS hypervisors x VMS VMs publishes the directory's
keys as vsocketd does (docs/multi-host.md, "The etcd directory"; the layout
of decision 103): per host one lease (TTL 10 s) and, under it,
/vsocket/hosts/<host> and one /vsocket/tenants/<tenant>/<host>/<vm> per VM
(one transaction per host; VM n of the fleet is of tenant 1 + n % TENANTS).
Then, for a bounded steady phase, every lease is renewed every TTL/3 (as
vsocketd does), N migrations per minute each move one VM's record to
another host (one transaction: delete from the old host, put under the new
host's lease), and WATCHERS simulated hosts (the first ones) follow the
directory as vsocketd does: one watch stream each, with a watch of the
host records and one per tenant of its VMs (--watch-scope tenants, the
default), or of every record (--watch-scope all, the layout before
decision 103); each times the migrations it is told of from their write to
their arrival (publish->watch latency).

Measured: publish rate, the keepalive rate reached against the one needed,
publish->watch latency p50/p99, the events each watcher received, etcd's
CPU (utime+stime from /proc) and RSS in each phase, the database size, and
the first read of a starting vsocketd (the host records, then its tenants'
records as of that revision). Everything is bounded: each phase has a
deadline and the whole run stops itself.

  bench/directory_load.py [--hosts 1000,10000] [--vms 50] [--tenants 1000] [--migrations-per-min 600]
                          [--watchers 8] [--watch-scope tenants|all] [--steady-s 30]
                          [--out bench/results] [--out-name directory-load-latest]

Writes bench/results/directory-load-latest.{json,md} (--out-name changes
the name: the docs are generated from the default one). Uses etcd's JSON
gateway over keep-alive HTTP connections, as vsocketd's client does.
"""
import argparse
import base64
import http.client
import json
import multiprocessing
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

PREFIX = "/vsocket/hosts/"           # host records
TENANT_PREFIX = "/vsocket/tenants/"  # VM records, by tenant (decision 103)
ROOT = "/vsocket/"
TENANTS = 1000                       # --tenants
TTL_S = 10
CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


def b64(s):
    return base64.b64encode(s.encode()).decode()


def prefix_end(p):
    return p[:-1] + chr(ord(p[-1]) + 1)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Etcd:
    """One etcd member on loopback, its data in a temporary directory."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="vsocket-dirload-")
        self.port, peer = free_port(), free_port()
        url, purl = f"http://127.0.0.1:{self.port}", f"http://127.0.0.1:{peer}"
        self.log = open(os.path.join(self.dir, "etcd.log"), "w")
        self.proc = subprocess.Popen(
            ["etcd", "--name=load", f"--data-dir={self.dir}/data", f"--listen-client-urls={url}",
             f"--advertise-client-urls={url}", f"--listen-peer-urls={purl}", f"--initial-advertise-peer-urls={purl}",
             f"--initial-cluster=load={purl}", "--logger=zap", "--log-level=warn",
             "--quota-backend-bytes=4294967296"],
            stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 15
        while time.time() < deadline:
            try:
                Client(self.port).call("/v3/kv/range", {"key": b64("/probe")})
                return
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError("etcd did not answer within 15 s")

    def cpu_s(self):
        with open(f"/proc/{self.proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK

    def rss_mb(self):
        with open(f"/proc/{self.proc.pid}/statm") as f:
            return int(f.read().split()[1]) * PAGE / 2**20

    def stop(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


class Client:
    """Unary calls over one keep-alive HTTP connection (one per thread)."""

    def __init__(self, port, timeout=10):
        self.port, self.timeout, self.conn = port, timeout, None

    def call(self, path, body):
        for attempt in (0, 1):
            try:
                if self.conn is None:
                    self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=self.timeout)
                self.conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
                r = self.conn.getresponse()
                data = r.read()
                return json.loads(data)
            except (OSError, http.client.HTTPException):
                self.conn = None
                if attempt:
                    raise


_local = threading.local()


def client(port):
    c = getattr(_local, "c", None)
    if c is None:
        c = _local.c = Client(port)
    return c


def host_key(h):
    return f"{PREFIX}h{h:05d}"


def tenant_of(h, v):
    return 1 + (h * 64 + v) % TENANTS


def tenant_prefix(t):
    return f"{TENANT_PREFIX}{t}/"


def vm_key(h, v, host=None, name=None):
    """VM v of host h's record, on `host` (default h) under `name`."""
    return f"{tenant_prefix(tenant_of(h, v))}h{(h if host is None else host):05d}/{name or f'vm{v:02d}'}"


def host_tenants(h, vms):
    return sorted({tenant_of(h, v) for v in range(vms)})


def host_value(h):
    return json.dumps({"fabric_address": f"203.0.{h // 250 % 256}.{h % 250 + 1}:7300", "fabrics": ["tcp"]})


def vm_value(h, v, stamp=None):
    n = h * 64 + v
    r = {"tenant": tenant_of(h, v), "addresses": [f"10.{n >> 16 & 255}.{n >> 8 & 255}.{n & 255}"]}
    if stamp is not None:
        r["t"] = stamp  # (the load test's write time: the watchers' latency)
    return json.dumps(r)


def publish_host(port, h, vms):
    c = client(port)
    lease = c.call("/v3/lease/grant", {"TTL": str(TTL_S)})["ID"]
    ops = [{"request_put": {"key": b64(host_key(h)), "value": b64(host_value(h)), "lease": lease}}]
    ops += [{"request_put": {"key": b64(vm_key(h, v)), "value": b64(vm_value(h, v)), "lease": lease}}
            for v in range(vms)]
    r = c.call("/v3/kv/txn", {"success": ops})
    if not r.get("succeeded"):
        raise RuntimeError(f"publish h{h}: {r}")
    return lease


class Watcher(threading.Thread):
    """One watch stream with a watch per prefix (what each vsocketd holds:
    EtcdClient::WatchRanges, several create_requests in one request body);
    times the events whose value carries the load test's write time."""

    def __init__(self, port, start_rev, stop, prefixes):
        super().__init__(daemon=True)
        self.port, self.start_rev, self.stop, self.prefixes = port, start_rev, stop, prefixes
        self.latencies, self.events, self.error, self.ready = [], 0, None, threading.Event()

    def run(self):
        try:
            # (the stream is idle at times: a long timeout; the thread is a
            # daemon, and etcd is killed at the end)
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
            body = "".join(json.dumps({"create_request": {"key": b64(p), "range_end": b64(prefix_end(p)),
                                                          "start_revision": str(self.start_rev)}})
                           for p in self.prefixes)
            conn.request("POST", "/v3/watch", body, {"Content-Type": "application/json"})
            created = 0
            r = conn.getresponse()
            buf = b""
            while not self.stop.is_set():
                chunk = r.readline()  # (HTTPResponse undoes the chunked encoding)
                if not chunk:
                    break
                buf += chunk
                if not buf.endswith(b"\n"):
                    continue
                line, buf = buf.strip(), b""
                if not line:
                    continue
                now = time.time()
                msg = json.loads(line).get("result", {})
                if msg.get("created"):
                    created += 1
                    if created == len(self.prefixes):
                        self.ready.set()
                for e in msg.get("events", []):
                    self.events += 1
                    if e.get("type", "PUT") == "PUT":
                        v = base64.b64decode(e["kv"].get("value", ""))
                        if b'"t"' in v:
                            self.latencies.append(now - json.loads(v)["t"])
        except Exception as ex:  # reported in the results
            self.error = repr(ex)
            self.ready.set()


def cpu_of(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def pct(xs, p):
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))]


def renew_process(port, hosts, part, renewers, leases, renewals, stop):
    """Renews every `renewers`-th host's lease every TTL/3, as vsocketd does,
    from its own process (3 threads), until `stop`."""
    mine = list(range(part, hosts, renewers))
    period = TTL_S / 3

    def loop(sub):
        slot = 2 * (3 * part + sub)  # this thread's (done, failed)
        while not stop.is_set():
            start = time.time()
            for h in mine[sub::3]:
                if stop.is_set():
                    break
                if leases[h] == 0:
                    continue
                try:
                    r = client(port).call("/v3/lease/keepalive", {"ID": str(leases[h])})
                    ok = int(r.get("result", r).get("TTL", 0)) > 0
                except OSError:
                    ok = False
                renewals[slot + (0 if ok else 1)] += 1
            stop.wait(max(0.0, period - (time.time() - start)))

    ts = [threading.Thread(target=loop, args=(i,)) for i in range(3)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()


def run_scale(hosts, vms, migrations_per_min, watchers, steady_s, threads, renewers, watch_scope="tenants",
              publish_rate=0):
    etcd = Etcd()
    res = {"hosts": hosts, "vms_per_host": vms, "keys": hosts * (vms + 1), "migrations_per_min": migrations_per_min,
           "watchers": watchers, "watch_scope": watch_scope, "tenants": TENANTS, "steady_s": steady_s,
           "lease_ttl_s": TTL_S, "renewing_threads": 3 * renewers, "layout": "tenants (decision 103)", "loadavg_at_start": round(os.getloadavg()[0], 2)}
    # Lease IDs (0: not granted yet) and renewal counts, shared with the
    # renewing processes: renewals must not wait on this process's GIL
    # (watchers parsing events, publishers), or leases expire for the load
    # generator's sake, not etcd's.
    leases = multiprocessing.Array("q", hosts, lock=False)
    renewals = multiprocessing.Array("q", 6 * renewers, lock=False)  # per renewing thread: done, failed
    stop_renew = multiprocessing.Event()
    procs = [multiprocessing.Process(target=renew_process, args=(etcd.port, hosts, p, renewers, leases, renewals,
                                                                 stop_renew), daemon=True)
             for p in range(renewers)]
    for pr in procs:
        pr.start()

    def renew_counts():
        return sum(renewals[0::2]), sum(renewals[1::2])

    try:
        # 1. Every host publishes (a lease and one transaction each).
        cpu0, t0 = etcd.cpu_s(), time.time()
        # (publish_rate: hosts a second at most, a fleet coming up in a
        # staggered way; 0: as fast as etcd takes them)
        budget = 150 + (hosts / publish_rate if publish_rate else 0)
        with ThreadPoolExecutor(threads) as pool:
            futs = {}
            for h in range(hosts):
                if publish_rate:
                    time.sleep(max(0.0, t0 + h / publish_rate - time.time()))
                f = pool.submit(publish_host, etcd.port, h, vms)
                # (renewed from the moment it is granted, not once all are)
                f.add_done_callback(lambda f, h=h: leases.__setitem__(h, int(f.result())) if not f.exception() else None)
                futs[f] = h
            for f in futs:
                leases[futs[f]] = int(f.result(timeout=max(1, budget - (time.time() - t0))))
        dt = time.time() - t0
        res["publish_s"] = round(dt, 2)
        res["publish_hosts_per_s_cap"] = publish_rate
        res["publish_keys_per_s"] = round(hosts * (vms + 1) / dt)
        res["publish_etcd_cpu_pct"] = round(100 * (etcd.cpu_s() - cpu0) / dt, 1)

        # 2. The first read of a starting vsocketd (host 0): the host
        # records, then each of its tenants' records as of that revision
        # (by curl: the time to receive them, the parse being the reader's).
        head = Client(etcd.port).call("/v3/kv/range", {"key": b64(PREFIX), "range_end": b64(prefix_end(PREFIX)),
                                                       "count_only": True})
        rev = int(head["header"]["revision"])
        read_s, read_bytes, read_keys = 0.0, 0, 0
        for i, p in enumerate([PREFIX] + [tenant_prefix(t) for t in host_tenants(0, vms)]):
            q = {"key": b64(p), "range_end": b64(prefix_end(p))}
            if i > 0:
                q["revision"] = str(rev)
            out = subprocess.run(["curl", "-s", "-o", "/dev/null", "-m", "60", "-w", "%{time_total} %{size_download}",
                                  "-X", "POST", f"http://127.0.0.1:{etcd.port}/v3/kv/range", "-d", json.dumps(q)],
                                 capture_output=True, text=True, timeout=70).stdout.split()
            read_s += float(out[0])
            read_bytes += int(out[1])
            read_keys += int(Client(etcd.port).call("/v3/kv/range", dict(q, count_only=True)).get("count", 0))
        res["full_read_s"] = round(read_s, 2)
        res["full_read_mb"] = round(read_bytes / 2**20, 1)
        res["full_read_keys"] = read_keys
        res["full_read_prefixes"] = 1 + len(host_tenants(0, vms))

        # 3. Steady state: renewals go on; migrations; watchers time them.
        stop = threading.Event()
        # Watcher i is host i: the host records and its tenants' (or all).
        scope = ((lambda i: [ROOT]) if watch_scope == "all"
                 else (lambda i: [PREFIX] + [tenant_prefix(t) for t in host_tenants(i % hosts, vms)]))
        ws = [Watcher(etcd.port, rev + 1, stop, scope(i)) for i in range(watchers)]
        res["watches_per_stream"] = round(statistics.mean(len(w.prefixes) for w in ws), 1) if ws else 0
        for w in ws:
            w.start()
        for w in ws:
            w.ready.wait(10)
        placement = {}  # (h, v) -> (the host it runs on now, its key)
        migrations = []
        deadline = time.time() + steady_s

        def migrate_loop():
            interval = 60.0 / migrations_per_min
            i, nxt = 0, time.time()
            while time.time() < deadline:
                stop.wait(max(0, nxt - time.time()))
                nxt += interval
                h, v = (i * 7919) % hosts, i % vms
                i += 1
                src, old = placement.get((h, v), (h, vm_key(h, v)))
                dst = (src + 1 + i % (hosts - 1)) % hosts
                t = time.time()
                new = vm_key(h, v, dst, f"m{h:05d}-{v:02d}")
                ops = [{"request_delete_range": {"key": b64(old)}},
                       {"request_put": {"key": b64(new), "value": b64(vm_value(h, v, t)), "lease": str(leases[dst])}}]
                client(etcd.port).call("/v3/kv/txn", {"success": ops})
                placement[(h, v)] = (dst, new)
                migrations.append(time.time() - t)

        done0, failed0 = renew_counts()
        gen_cpu = lambda: sum(os.times()[:2]) + sum(cpu_of(pr.pid) for pr in procs)
        cpu0, gen0, t0 = etcd.cpu_s(), gen_cpu(), time.time()
        mt = threading.Thread(target=migrate_loop, daemon=True)
        if migrations_per_min > 0:
            mt.start()
            mt.join(steady_s + 30)
        else:
            stop.wait(steady_s)
        dt = time.time() - t0
        res["steady_etcd_cpu_pct"] = round(100 * (etcd.cpu_s() - cpu0) / dt, 1)
        res["load_generator_cpu_pct"] = round(100 * (gen_cpu() - gen0) / dt, 1)
        done, failed = renew_counts()
        done, failed = done - done0, failed - failed0
        time.sleep(1)  # the last events reach the watchers
        stop.set()
        res["keepalives_needed_per_s"] = round(hosts / (TTL_S / 3), 1)
        res["keepalives_per_s"] = round(done / dt, 1)
        res["keepalive_failures"] = failed
        res["migrations"] = len(migrations)
        res["migration_write_p50_ms"] = round(1000 * pct(migrations, 50), 2) if migrations else None
        lat = [x for w in ws for x in w.latencies]
        res["watch_latency_samples"] = len(lat)
        res["publish_to_watch_p50_ms"] = round(1000 * pct(lat, 50), 2) if lat else None
        res["publish_to_watch_p99_ms"] = round(1000 * pct(lat, 99), 2) if lat else None
        res["publish_to_watch_max_ms"] = round(1000 * max(lat), 2) if lat else None
        res["watch_events_per_watcher"] = round(statistics.mean(w.events for w in ws)) if ws else 0
        res["watch_events_delivered_per_s"] = round(sum(w.events for w in ws) / dt, 1)
        res["watcher_errors"] = [w.error for w in ws if w.error]
        st = Client(etcd.port).call("/v3/maintenance/status", {})
        res["db_size_mb"] = round(int(st.get("dbSize", 0)) / 2**20, 1)
        res["etcd_rss_mb"] = round(etcd.rss_mb(), 1)
        res["keys_left"] = int(Client(etcd.port, timeout=60).call(
            "/v3/kv/range", {"key": b64(ROOT), "range_end": b64(prefix_end(ROOT)), "count_only": True}
        ).get("count", 0))
    finally:
        stop_renew.set()
        for pr in procs:
            pr.join(10)
            if pr.is_alive():
                pr.kill()
        etcd.stop()
    return res


def markdown(results, args):
    rows = [
        ("hosts x VMs (keys)", lambda r: f"{r['hosts']} x {r['vms_per_host']} ({r['keys']})"),
        ("publish: time, keys/s, etcd CPU", lambda r: f"{r['publish_s']} s, {r['publish_keys_per_s']}/s, {r['publish_etcd_cpu_pct']} %" + (f" (at most {r['publish_hosts_per_s_cap']:g} hosts/s)" if r.get('publish_hosts_per_s_cap') else "")),
        ("a starting host's first read (host records + its tenants)", lambda r: f"{r['full_read_s']} s ({r.get('full_read_prefixes', 1)} prefixes, {r['full_read_keys']} keys, {r['full_read_mb']} MB of JSON)"),
        ("keepalives needed / reached per s (renewing threads)", lambda r: f"{r['keepalives_needed_per_s']} / {r['keepalives_per_s']} ({r['keepalive_failures']} failed; {r.get('renewing_threads', 6)} threads)"),
        ("keys at the end (leases alive)", lambda r: f"{r['keys_left']} of {r['keys']}"),
        ("migrations (per min)", lambda r: f"{r['migrations']} in {r['steady_s']} s ({r['migrations_per_min']}/min)"),
        ("publish->watch p50 / p99 / max", lambda r: f"{r['publish_to_watch_p50_ms']} / {r['publish_to_watch_p99_ms']} / {r['publish_to_watch_max_ms']} ms ({r['watch_latency_samples']} samples, {r['watchers']} watchers)"),
        ("watch streams: scope (watches each), events per watcher, delivered per s", lambda r: f"{r['watchers']} x {r.get('watch_scope', 'prefix')} ({r.get('watches_per_stream', 1)}), {r.get('watch_events_per_watcher', '?')}, {r.get('watch_events_delivered_per_s', '?')}/s"),
        ("CPU, steady phase (% of one core): etcd, load generator", lambda r: f"{r['steady_etcd_cpu_pct']} %, {r['load_generator_cpu_pct']} %"),
        ("etcd RSS, database", lambda r: f"{r['etcd_rss_mb']} MB, {r['db_size_mb']} MB"),
        ("machine load average at the start", lambda r: f"{r['loadavg_at_start']}"),
    ]
    out = ["# Directory load test (bench/directory_load.py)", "",
           f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, etcd {etcd_version()} on loopback, "
           f"{os.cpu_count()} CPUs shared with the load generator; lease TTL {TTL_S} s renewed every TTL/3; "
           f"keys of decision 103 (VM records by tenant, {results[0].get('tenants', TENANTS)} tenants).", "",
           "| | " + " | ".join(f"{r['hosts']} hosts" for r in results) + " |",
           "|---|" + "---|" * len(results)]
    for name, f in rows:
        out.append(f"| {name} | " + " | ".join(f(r) for r in results) + " |")
    errs = [e for r in results for e in r.get("watcher_errors", [])]
    if errs:
        out += ["", "Watcher errors: " + "; ".join(errs)]
    return "\n".join(out) + "\n"


def etcd_version():
    try:
        return subprocess.run(["etcd", "--version"], capture_output=True, text=True, timeout=10).stdout.split()[2]
    except Exception:
        return "?"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hosts", default="1000,10000")
    p.add_argument("--vms", type=int, default=50)
    p.add_argument("--migrations-per-min", type=int, default=600)
    p.add_argument("--watchers", type=int, default=8)
    p.add_argument("--tenants", type=int, default=1000, help="tenants the fleet's VMs belong to (VM n: 1 + n %% T)")
    p.add_argument("--watch-scope", choices=["tenants", "all"], default="tenants",
                   help="tenants: each watcher follows its host's tenants (decision 103); all: every record")
    p.add_argument("--out-name", default="directory-load-latest")
    p.add_argument("--steady-s", type=int, default=30)
    p.add_argument("--threads", type=int, default=8, help="publishing threads")
    p.add_argument("--publish-hosts-per-s", type=float, default=0,
                   help="hosts published a second at most (a staggered start; 0: as fast as etcd takes them)")
    p.add_argument("--renewers", type=int, default=0,
                   help="processes renewing leases (3 threads each; 0: one per 1,700 hosts, at least 2). Each "
                        "thread renews its leases one after the other, so at 10,000 hosts 2 processes (6 threads) "
                        "need a keepalive answered in 2 ms; while etcd is busy they fall behind and the leases of "
                        "the fleet expire for the load generator's sake")
    p.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    a = p.parse_args()
    # A SIGTERM (a timeout, a CI stop) unwinds like an error: etcd is killed
    # and its directory removed by run_scale's finally.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("directory_load: terminated"))
    if shutil.which("etcd") is None:
        sys.exit("no etcd (apt-get install etcd-server)")
    if a.steady_s > 120:
        sys.exit("--steady-s: at most 120 (each run stays under ~3 min)")
    global TENANTS
    TENANTS = a.tenants
    results = []
    for hosts in (int(x) for x in a.hosts.split(",")):
        print(f"== {hosts} hosts x {a.vms} VMs", flush=True)
        renewers = a.renewers or max(2, -(-hosts // 1700))
        r = run_scale(hosts, a.vms, a.migrations_per_min, a.watchers, a.steady_s, a.threads, renewers,
                      a.watch_scope, a.publish_hosts_per_s)
        print(json.dumps(r), flush=True)
        results.append(r)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, a.out_name + ".json"), "w") as f:
        json.dump(results, f, indent=1)
    md = markdown(results, a)
    with open(os.path.join(a.out, a.out_name + ".md"), "w") as f:
        f.write(md)
    print(md)


if __name__ == "__main__":
    main()
