"""Helpers shared by the benchmark drivers in bench/ (same_host_bench.py,
cross_host_bench.py, conn_scale.py): running commands with time limits,
processes inside the test bed's VMs, CPU and memory from /proc, parsing
sockperf and iperf3, and writing result files and gnuplot charts.
"""
import datetime
import json
import os
import re
import statistics
import select
import shutil
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_BIN = os.path.join(ROOT, "bazel-out/k8-opt/bin")


def sh(args, env=None, timeout=120, check=False):
    r = subprocess.run(args, env=env, capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise RuntimeError(f"{args}: {r.stderr[-500:]}")
    return r


def find_bin(bin_dir, bazel_path):
    """A binary under a Bazel output tree (bin_dir/guest/libvsocket.so) or
    in a flat directory of copies (bin_dir/libvsocket.so)."""
    for p in (os.path.join(bin_dir, bazel_path), os.path.join(bin_dir, os.path.basename(bazel_path))):
        if os.path.exists(p):
            return os.path.abspath(p)
    raise SystemExit(f"{bazel_path} not found in {bin_dir} (bazel build it, or pass --bin)")


def binary_info(paths):
    """sha256 and modification time of the binaries a run used."""
    import hashlib
    out = {}
    for p in paths:
        with open(p, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()
        mtime = datetime.datetime.fromtimestamp(os.stat(p).st_mtime, datetime.timezone.utc)
        out[os.path.basename(p)] = {"sha256": digest[:16], "mtime": mtime.strftime("%Y-%m-%dT%H:%M:%SZ")}
    return out


# ---- processes and /proc ------------------------------------------------------------


def cpu_ticks(pids):
    """utime + stime of the processes (all their threads), in clock ticks."""
    t = 0
    for p in pids:
        try:
            f = open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()
            t += int(f[11]) + int(f[12])
        except (OSError, IndexError):
            pass
    return t


def machine_ticks():
    """(busy, total, irq + softirq) clock ticks of all CPUs together, from
    /proc/stat. Interrupt and softirq time (the kernel's network receive
    path, among others) is charged to no process."""
    f = [int(x) for x in open("/proc/stat").readline().split()[1:]]
    idle = f[3] + f[4]  # idle + iowait
    return sum(f[:8]) - idle, sum(f[:8]), f[5] + f[6]


def ticks_per_process(pids):
    return {str(p): cpu_ticks([p]) for p in pids}


def mem_status(pid):
    """VmRSS, RssAnon, RssFile, RssShmem of a process in KiB (None if gone)."""
    try:
        text = open(f"/proc/{pid}/status").read()
    except OSError:
        return None
    out = {}
    for key in ("VmRSS", "RssAnon", "RssFile", "RssShmem"):
        m = re.search(rf"^{key}:\s+(\d+) kB", text, re.M)
        out[key] = int(m.group(1)) if m else 0
    return out


class VmProcess:
    """A command started in a VM namespace through the test bed's `exec`,
    wrapped in `timeout` so that it ends even if this script dies. The bed
    script and `ip netns exec` exec into `timeout`, so `self.pid` is the
    timeout process and `child()` the program itself. Output (stdout and
    stderr) is read without blocking, line by line, with deadlines."""

    def __init__(self, bed_cmd, vm, argv, env, limit_s, stdin=False):
        self.limit_s = limit_s
        self.p = subprocess.Popen(bed_cmd + ["exec", vm, "timeout", "-k", "2", str(int(limit_s))] + argv,
                                  env=env, stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.pid = self.p.pid
        self.text = ""
        self._pending = b""
        self._lines = []
        self._eof = False
        self._child = None

    def child(self, wait_s=5.0):
        """PID of the program under `timeout` (None if it did not start)."""
        deadline = time.monotonic() + wait_s
        while self._child is None and time.monotonic() < deadline:
            try:
                comm = open(f"/proc/{self.pid}/comm").read().strip()
                kids = open(f"/proc/{self.pid}/task/{self.pid}/children").read().split()
            except OSError:
                return None
            if comm == "timeout" and kids:
                self._child = int(kids[0])
            else:
                time.sleep(0.01)
        return self._child

    def _read(self, timeout_s):
        if self._eof:
            return False
        r, _, _ = select.select([self.p.stdout], [], [], max(0.0, timeout_s))
        if not r:
            return False
        data = os.read(self.p.stdout.fileno(), 65536)
        if not data:
            self._eof = True
            if self._pending:
                self._lines.append(self._pending.decode(errors="replace"))
                self._pending = b""
            return False
        self.text += data.decode(errors="replace")
        self._pending += data
        *lines, self._pending = self._pending.split(b"\n")
        self._lines += [l.decode(errors="replace") for l in lines]
        return True

    def expect(self, prefix, timeout_s):
        """The next output line starting with `prefix` (earlier lines are
        skipped); raises TimeoutError after timeout_s or at EOF."""
        deadline = time.monotonic() + timeout_s
        while True:
            while self._lines:
                line = self._lines.pop(0)
                if line.startswith(prefix):
                    return line
            left = deadline - time.monotonic()
            if left <= 0 or self._eof:
                raise TimeoutError(f"no '{prefix}' line from {self.p.args[2:]}; output: {self.text[-600:]}")
            self._read(min(left, 0.5))

    def send(self, line):
        self.p.stdin.write((line + "\n").encode())
        self.p.stdin.flush()

    def wait_exit(self, timeout_s):
        """The exit status if the program ends within timeout_s, else None
        (and it keeps running)."""
        deadline = time.monotonic() + timeout_s
        while not self._eof and time.monotonic() < deadline:
            self._read(min(0.5, deadline - time.monotonic()))
        if not self._eof:
            return None
        try:
            return self.p.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            return None

    def finish(self, timeout_s=None):
        """Waits for the end (stopping it after timeout_s); returns the exit
        status. All output is in self.text."""
        deadline = time.monotonic() + (timeout_s if timeout_s is not None else self.limit_s + 5)
        while not self._eof and time.monotonic() < deadline:
            self._read(min(0.5, deadline - time.monotonic()))
        if not self._eof:
            self.stop()
        try:
            return self.p.wait(5)
        except subprocess.TimeoutExpired:
            self.stop()
            return self.p.wait(5)

    def json_line(self):
        """The last output line that is a JSON object (None if none)."""
        for line in reversed(self.text.splitlines()):
            if line.startswith("{"):
                try:
                    return json.loads(line)
                except ValueError:
                    pass
        return None

    def stop(self):
        """SIGTERM (timeout passes it to the program), then SIGKILL to both."""
        if self.p.poll() is not None:
            return
        child = self._child or self.child(0.1)
        self.p.send_signal(signal.SIGTERM)
        try:
            self.p.wait(5)
        except subprocess.TimeoutExpired:
            for pid in (child, self.pid):
                if pid:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except OSError:
                        pass
            self.p.wait(5)
        if self.p.stdin:
            self.p.stdin.close()


# ---- the test beds -----------------------------------------------------------------


class Bed:
    """A test bed script (deploy/testbed.sh, one host; deploy/testbed2.sh, two
    hosts: TwoHostBed): processes in its VMs, started through the script's
    `exec` with libvsocket.so preloaded or not. VSOCKETD (and for two hosts
    VSOCKETCTL) default to the binaries in bin_dir; the bed scripts' other
    VSOCKET_* variables pass through."""

    SCRIPT = os.path.join(ROOT, "deploy/testbed.sh")
    NAME = "testbed"

    def __init__(self, bin_dir):
        self.lib = find_bin(bin_dir, "guest/libvsocket.so")
        self.base_env = dict(os.environ)
        self.base_env.pop("LD_PRELOAD", None)
        self.base_env.setdefault("VSOCKETD", find_bin(bin_dir, "host-backend/vsocketd"))
        self.cmd = ["bash", self.SCRIPT]

    def binaries(self):
        return binary_info([self.lib, self.base_env["VSOCKETD"]])

    def tb(self, *args, timeout=60, check=False):
        return sh(self.cmd + list(args), env=self.base_env, timeout=timeout, check=check)

    def _daemon_pids(self):
        return {"vsocketd": int(self.tb("daemon-pid", check=True).stdout)}

    def up(self, client_vm, server_vm):
        """Builds the bed; sets client_addr, server_addr and daemons (name -> PID)."""
        r = self.tb("up", timeout=120)
        if r.returncode != 0:
            self.down()
            raise SystemExit(f"{self.NAME} up failed: " + r.stdout[-1000:] + r.stderr[-1000:])
        self.client_vm, self.server_vm = client_vm, server_vm
        self.client_addr = self.tb("addr", client_vm, check=True).stdout.strip()
        self.server_addr = self.tb("addr", server_vm, check=True).stdout.strip()
        self.daemons = self._daemon_pids()

    def down(self):
        self.tb("down", timeout=120)

    def counters(self, *host):
        """The daemon's counters (vsocketctl counters; of `host` on two hosts)."""
        out = self.tb("ctl", *host, "counters", timeout=20).stdout
        return {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+(\d+)$", out, re.M)}

    def env(self, accel, report=None, extra=None):
        """accel: False (kernel TCP), True or "auto" (libvsocket preloaded,
        the default upgrade policy), "always" (preloaded, every connection
        registered at its first I/O: VSOCKET_UPGRADE=always)."""
        e = dict(self.base_env)
        if accel:
            e["LD_PRELOAD"] = self.lib
            e["VSOCKET_UPGRADE"] = "always" if accel == "always" else "auto"
        if report:
            e["VSOCKET_REPORT"] = report
        e.update(extra or {})
        return e

    def run(self, vm, accel, argv, timeout=120, extra_env=None):
        """Runs argv in vm to its end; stdout and stderr apart."""
        return sh(self.cmd + ["exec", vm] + argv, env=self.env(accel, extra=extra_env), timeout=timeout)

    def start(self, vm, accel, argv, limit_s, stdin=False, report=None, extra_env=None):
        """Starts argv in vm, bounded by limit_s (VmProcess)."""
        return VmProcess(self.cmd, vm, argv, self.env(accel, report, extra_env), limit_s, stdin=stdin)

    def wait_listening(self, vm, port, timeout_s=5.0):
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            r = self.tb("exec", vm, "ss", "-Hltn", f"sport = :{port}", timeout=10)
            if r.stdout.strip():
                return True
            time.sleep(0.05)
        return False


class TwoHostBed(Bed):
    """deploy/testbed2.sh: a vsocketd per host (hostA, hostB) and their
    counters; VSOCKET_TESTBED2_NS_PREFIX and VSOCKET_TESTBED2_DIR pass
    through. Needs vsocketctl and the netload load generator."""

    SCRIPT = os.path.join(ROOT, "deploy/testbed2.sh")
    NAME = "testbed2"
    HOSTS = ("hostA", "hostB")

    def __init__(self, bin_dir):
        super().__init__(bin_dir)
        self.netload = find_bin(bin_dir, "bench/netload")
        self.base_env.setdefault("VSOCKETCTL", find_bin(bin_dir, "host-backend/vsocketctl"))

    def binaries(self):
        return binary_info([self.lib, self.netload, self.base_env["VSOCKETD"], self.base_env["VSOCKETCTL"]])

    def _daemon_pids(self):
        return {h: int(self.tb("daemon-pid", h, check=True).stdout) for h in self.HOSTS}

    def state_dir(self):
        return self.base_env.get("VSOCKET_TESTBED2_DIR", "/run/vsocket-testbed2")

    def host_ns(self, host):
        return self.base_env.get("VSOCKET_TESTBED2_NS_PREFIX", "vs2") + host

    def link(self, host):
        try:
            return json.loads(self.tb("ctl", host, "--json", "stats", timeout=20).stdout)["links"][0]
        except (ValueError, KeyError, IndexError):
            return {}


# ---- tool output ------------------------------------------------------------------


# sockperf's ping-pong keeps a table of its round trips as large as its
# default rate cap allows (about 1.8 M in a 2 s run); a direct pair's 0.5 us
# round trips fill it, and sockperf stops with "_seqN > m_maxSequenceNo"
# and no percentiles. A cap of 10 M messages a second paces nothing either
# path reaches here.
SOCKPERF_PP_CAP = {"pp": ["--mps", "10000000"]}


def parse_sockperf(out):
    """Latency (one way, µs) percentiles or message rate from sockperf's
    summary."""
    res = {"raw": out[-2000:]}
    m = re.search(r"Summary: Latency is ([0-9.]+) usec", out)
    if m:
        res["latency_us"] = float(m.group(1))
    for pct in ("50.000", "99.000", "99.900"):
        m = re.search(r"percentile " + re.escape(pct) + r" =\s+([0-9.]+)", out)
        if m:
            res["p" + pct.rstrip("0").rstrip(".")] = float(m.group(1))
    m = re.search(r"Summary: Message Rate is ([0-9]+)", out)
    if m:
        res["msg_per_s"] = int(m.group(1))
    m = re.search(r"SentMessages=([0-9]+)", out)
    if m:
        res["messages"] = int(m.group(1))
    m = re.search(r"ERROR: (.*)", out)
    if m:
        res["errors"] = m.group(1)[:200]
    return res


def parse_iperf(stdout, stderr=""):
    try:
        j = json.loads(stdout)
        return {"gbit_per_s": j["end"]["sum_received"]["bits_per_second"] / 1e9,
                "bytes": j["end"]["sum_received"]["bytes"]}
    except (ValueError, KeyError, TypeError):
        return {"error": stdout[-500:] + stderr[-500:]}


def ratio(a, b):
    return a / b if a and b else float("nan")


def ratio_text(row, dash="-", nan="nan"):
    """A row's vSocket/kernel ratio, and (min-max) of its repetitions' ratios
    when the row has them (paired_ratio) and they differ; `dash` between
    min and max, `nan` for no ratio (the docs use an en dash for both)."""
    r, rr = row["ratio"], row.get("ratio_range")
    if r != r:
        return nan
    if not rr or rr[0] != rr[0] or f"{rr[0]:.2f}" == f"{rr[1]:.2f}":
        return f"{r:.2f}"
    return f"{r:.2f} ({rr[0]:.2f}{dash}{rr[1]:.2f})"


def rep_values(reps, fn, zero_is_none=False):
    """fn(R) as a float for each repetition R; None where it has none (fn
    fails with KeyError or TypeError, NaN, or 0 when zero_is_none)."""
    vals = []
    for R in reps:
        try:
            x = float(fn(R))
        except (KeyError, TypeError):
            x = None
        vals.append(x if x == x and (x or not zero_is_none) else None)
    return vals


def median_range(vals):
    """(median, min, max) of the values that are not None; NaNs if none."""
    vals = [v for v in vals if v is not None]
    if not vals:
        return float("nan"), float("nan"), float("nan")
    return statistics.median(vals), min(vals), max(vals)


def paired_ratio(kernel, other):
    """The modes alternate per measurement, so repetition i of kernel TCP and
    of vSocket ran next to each other: (median, min, max) of their ratios
    other[i] / kernel[i], over the pairs where both have a value (None, 0 or
    NaN: no value). A drift of the machine's speed during the run moves both
    halves of a pair, not their ratio, where a ratio of the two modes'
    medians may take them from different repetitions."""
    rs = [o / k for k, o in zip(kernel, other) if k and o and k == k and o == o]
    if not rs:
        return float("nan"), float("nan"), float("nan")
    return statistics.median(rs), min(rs), max(rs)


# ---- results ------------------------------------------------------------------------


def utc_now():
    return datetime.datetime.now(datetime.timezone.utc)


def machine():
    """What a result was measured on: host name, CPU model and count, kernel."""
    model = ""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    u = os.uname()
    return {"hostname": u.nodename, "cpu_model": model, "cpus": os.cpu_count(), "kernel": u.release}


# The benchmarks whose goals are tracked day by day (OUT/days.json).
DAY_TABLES = {"same-host": (("table", ""),),
              "cross-host": (("table", ""), ("apps_table", ""), ("pinned_table", "one CPU per host: ")),
              "quick": (("table", ""),)}


def day_rows(name, results):
    """The rows of a result that have a goal: [{metric, ratio, goal, met}]."""
    rows = []
    for key, prefix in DAY_TABLES.get(name, ()):
        for r in results.get(key) or []:
            if not r.get("goal") or "--upgrade always" in r["metric"]:
                continue  # (the accelerated path's own cost: not what a user gets)
            met = r.get("met", r.get("ok"))
            rows.append({"metric": prefix + r["metric"], "ratio": r.get("ratio"), "goal": r["goal"],
                         "met": bool(met)})
    return rows


def record_day(out_dir, name, results):
    """OUT/days.json keeps, per benchmark and per day (UTC), the goal rows
    of that day's last run and the commit it ran: the issue's goals must
    hold on two different days, and this is where the docs read that."""
    rows = day_rows(name, results)
    day = str(results.get("date", ""))[:10]
    if not rows or not re.match(r"\d{4}-\d\d-\d\d$", day):
        return
    path = os.path.join(out_dir, "days.json")
    try:
        with open(path) as f:
            days = json.load(f)
    except (OSError, ValueError):
        days = {}
    head = subprocess.run(["git", "-C", ROOT, "describe", "--always", "--dirty"], capture_output=True, text=True)
    days.setdefault(name, {})[day] = {"date": results["date"], "commit": head.stdout.strip() or "?", "rows": rows}
    with open(path, "w") as f:
        json.dump(days, f, indent=1, sort_keys=True)


def save_results(out_dir, name, results, markdown):
    """Writes OUT/NAME-latest.json and .md (when results / markdown are
    given), replacing the previous result (older ones live in git history);
    returns the base path OUT/NAME-latest."""
    os.makedirs(out_dir, exist_ok=True)
    latest = os.path.join(out_dir, f"{name}-latest")
    if results is not None:
        with open(latest + ".json", "w") as f:
            json.dump(results, f, indent=1)
    if markdown is not None:
        with open(latest + ".md", "w") as f:
            f.write(markdown)
    if results is not None:
        record_day(out_dir, name, results)
    if os.path.realpath(out_dir) == os.path.realpath(os.path.join(ROOT, "bench/results")):
        # The docs' tables come from these files (//bench:benchmarks_doc_test
        # compares them): a result committed without its tables fails CI, so
        # every run into the repository's results regenerates them at once.
        subprocess.run([sys.executable, os.path.join(ROOT, "bench/render_docs.py")], check=False)
    return latest


def plot_histogram(base, name, title, ylabel, labels, series, logscale=False, hline=None):
    """Clustered bar chart BASE-NAME.png with gnuplot, from BASE-NAME.dat
    (written in any case): `series` is [(title, [value per label])]; `hline`
    = (y, title) draws a reference line. Returns the PNG path, or None
    without gnuplot (then an older BASE-NAME.png is removed: it would show
    another run)."""
    dat = f"{base}-{name}.dat"
    png = f"{base}-{name}.png"
    with open(dat, "w") as f:
        for i, label in enumerate(labels):
            values = " ".join(f"{s[1][i]:.3f}" for s in series)
            f.write(f'{i} "{label.replace(" ", "_")}" {values}\n')
    if shutil.which("gnuplot") is None:
        print(f"gnuplot not installed: no {png}")
        if os.path.exists(png):
            os.unlink(png)
        return None
    parts = []
    for k, (stitle, _) in enumerate(series):
        using = f"{3 + k}:xtic(2)" if k == 0 else f"{3 + k}"
        parts.append(f'"{dat}" using {using} title "{stitle}"' if k == 0 else f'"" using {using} title "{stitle}"')
    if hline is not None:
        parts.append(f'{hline[0]} with lines lw 2 title "{hline[1]}"')
    script = f'''
set terminal png size 1100,520 font ",10"
set output "{png}"
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.8 border -1
set boxwidth 0.9
set ylabel "{ylabel}"
set xtics rotate by -25 noenhanced
set grid ytics
set key top left
set title "{title}"
{'set logscale y' if logscale else ''}
plot {", ".join(parts)}
'''
    subprocess.run(["gnuplot"], input=script, text=True)
    print(f"plot: {png}")
    return png
