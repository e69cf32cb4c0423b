"""Golden tests, FileCheck-style. Each .evt file under tests/golden file holds its own expectations in comments:

    # RUN: evtc print %s                 command; %s is this file, evtc is $EVTC (several RUN lines allowed)
    # CHECK: %y: f32[4,8] = relu(%x)     substring that must appear in stdout, in order after the previous CHECK
    # CHECK-NEXT: ...                    must be on the line right after the previous match
    # CHECK-NOT: sum(                    must not appear between the previous and the next CHECK match
    # CHECK-ERR: file.evt:3:7: expected  substring that must appear in stderr
    # EXIT: 1                            expected exit code (default 0)

Prints "ok  NAME" or "FAIL NAME" with the reason, then "golden: N passed, N failed"."""
import os, re, shlex, subprocess, sys

def check_file(path, evtc):
    text = open(path, encoding="utf-8", errors="replace").read()
    runs = re.findall(r"^#\s*RUN:\s*(.*)$", text, re.M)
    if not runs:
        return "no RUN line"
    directives = re.findall(r"^#\s*(CHECK|CHECK-NEXT|CHECK-NOT|CHECK-ERR):\s?(.*)$", text, re.M)
    m = re.search(r"^#\s*EXIT:\s*(\d+)", text, re.M)
    want_exit = int(m.group(1)) if m else 0
    out, err = "", ""
    for run in runs:
        cmd = [a.replace("%s", path) for a in shlex.split(run)]
        if cmd[0] == "evtc":
            cmd[0] = evtc
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        out += p.stdout
        err += p.stderr
        if p.returncode != want_exit:
            return f"`{run}` exited {p.returncode}, expected {want_exit}\nstdout:\n{p.stdout[-2000:]}\nstderr:\n{p.stderr[-2000:]}"
    lines = out.split("\n")
    pos_line, pos_col = 0, 0
    pending_not = []
    for kind, pat in directives:
        pat = pat.rstrip()
        if kind == "CHECK-ERR":
            if pat not in err:
                return f"stderr lacks {pat!r}; stderr was:\n{err[-2000:]}"
            continue
        if kind == "CHECK-NOT":
            pending_not.append(pat)
            continue
        start = (pos_line, pos_col)
        found = None
        if kind == "CHECK-NEXT":
            ln = pos_line + 1
            if ln < len(lines) and pat in lines[ln]:
                found = (ln, lines[ln].index(pat) + len(pat))
        else:
            for ln in range(pos_line, len(lines)):
                col = lines[ln].find(pat, pos_col if ln == pos_line else 0)
                if col >= 0:
                    found = (ln, col + len(pat))
                    break
        if not found:
            return f"{kind}: {pat!r} not found after line {pos_line + 1}; stdout was:\n{out[-3000:]}"
        region = "\n".join(lines[start[0]:found[0] + 1])
        for bad in pending_not:
            if bad in region:
                return f"CHECK-NOT: {bad!r} found before {pat!r}"
        pending_not = []
        pos_line, pos_col = found
    rest = "\n".join(lines[pos_line:])
    for bad in pending_not:
        if bad in rest:
            return f"CHECK-NOT: {bad!r} found"
    return None

def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "tests/golden"
    evtc = os.environ.get("EVTC", "build/evtc")
    files = sorted(os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs if f.endswith(".evt"))
    passed = failed = 0
    for f in files:
        why = check_file(f, evtc)
        if why is None:
            passed += 1
            print(f"ok   {f}")
        else:
            failed += 1
            print(f"FAIL {f}: {why}")
    print(f"golden: {passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)

if __name__ == "__main__":
    main()
