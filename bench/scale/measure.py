#!/usr/bin/env python3
"""Times `evtc partition --joint --opt --stats` and `evtc opt` on the generated scale graphs (gen.py).

    python3 bench/scale/measure.py [--evtc build/evtc] [--kinds chain,fan,mlp] [--sizes 1000,4000,10000,100000]
                                   [--timeout 300] [--mem-gb 8] [--workdir /tmp/evt-scale] [--skip-opt]

Each command runs under /usr/bin/time -v (wall time and peak RSS), with a wall-clock timeout and an address-space
cap (ulimit -v) so a runaway size fails instead of taking the machine. Prints one markdown row per graph:
kind, N, the partition's wall time / peak RSS / kernels / optimality line, and `evtc opt`'s wall time / peak RSS.
"""
import argparse
import os
import re
import signal
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def timed(cmd, timeout, mem_gb):
    """(seconds, peak MiB, rc, stdout, stderr) of cmd under /usr/bin/time -v."""
    sh = f"ulimit -v {int(mem_gb * 1024 * 1024)}; exec /usr/bin/time -v " + " ".join(cmd)
    p = subprocess.Popen(["bash", "-c", sh], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)   # time and evtc too, not only the shell
        p.communicate()
        return None, None, "timeout", "", ""
    wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (\S+)", err)
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", err)
    secs = None
    if wall:
        parts = [float(x) for x in wall.group(1).split(":")]
        secs = sum(x * 60 ** i for i, x in enumerate(reversed(parts)))
    return secs, int(rss.group(1)) / 1024 if rss else None, p.returncode, out, err


def cell(secs, mib, rc):
    if rc == "timeout":
        return "timeout", "—"
    t = f"{secs:.2f} s" if secs is not None else "?"
    m = f"{mib:.0f} MiB" if mib is not None else "?"
    return (t if rc == 0 else f"{t} (exit {rc})"), m


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--evtc", default="build/evtc")
    ap.add_argument("--kinds", default="chain,fan,mlp")
    ap.add_argument("--sizes", default="1000,4000,10000,100000")
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--mem-gb", type=float, default=8)
    ap.add_argument("--workdir", default="/tmp/evt-scale")
    ap.add_argument("--skip-opt", action="store_true")
    ap.add_argument("--extra", default="", help="more flags for evtc partition, e.g. '--time-limit 1'")
    a = ap.parse_args()
    os.makedirs(a.workdir, exist_ok=True)
    print("| graph | N | partition time | peak RSS | kernels | optimality | opt time | opt peak RSS |")
    print("|---|---:|---:|---:|---:|---|---:|---:|")
    for kind in a.kinds.split(","):
        for n in [int(s) for s in a.sizes.split(",")]:
            path = os.path.join(a.workdir, f"{kind}{n}.evt")
            if not os.path.exists(path):
                subprocess.run([sys.executable, os.path.join(HERE, "gen.py"), kind, str(n), "-o", path], check=True)
            cmd = [a.evtc, "partition", path, "--joint", "--opt", "--stats", "--quiet", "--no-cache"] + a.extra.split()
            secs, mib, rc, out, err = timed(cmd, a.timeout, a.mem_gb)
            t, m = cell(secs, mib, rc)
            kern = re.search(r"kernels: (\d+)", out)
            optl = re.search(r"optimality: (.*)", out)
            died = [ln for ln in err.splitlines() if "terminate" in ln or "fatal" in ln or "what()" in ln]
            note = optl.group(1) if optl else (died[0].strip()[:70] if died else "")
            ot, om = "—", "—"
            if not a.skip_opt:
                osecs, omib, orc, _, _ = timed([a.evtc, "opt", path, ">/dev/null"], a.timeout, a.mem_gb)
                ot, om = cell(osecs, omib, orc)
            print(f"| {kind} | {n} | {t} | {m} | {kern.group(1) if kern else '—'} | {note} | {ot} | {om} |", flush=True)


if __name__ == "__main__":
    main()
