#!/usr/bin/env python
"""Time the README's first command in a fresh clone with cold caches; record every output line's time."""
import json, os, subprocess, sys, tempfile, time, platform
repo = sys.argv[1]; out = sys.argv[2]
clone = tempfile.mkdtemp(prefix="fresh-")
subprocess.run(["git", "clone", "-q", repo, clone + "/main"], check=True)
env = {**os.environ, "DSPY_CACHEDIR": tempfile.mkdtemp(prefix="dspy-"), "TRACE_DSPY_CACHE": tempfile.mkdtemp(prefix="tc-"),
       "PYTHONUNBUFFERED": "1"}
env.pop("TRACE_DSPY_DATA", None)
cmd = [sys.executable, "-m", "trace_dspy.compile"]
start = time.monotonic(); lines = []
p = subprocess.Popen(cmd, cwd=clone + "/main", env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
for line in p.stdout:
    lines.append([round(time.monotonic() - start, 2), line.rstrip("\n")])
    print(f"{lines[-1][0]:7.1f} {lines[-1][1]}", flush=True)
rc = p.wait(); total = time.monotonic() - start
times = [0.0] + [t for t, _ in lines] + [total]
gaps = [b - a for a, b in zip(times, times[1:])]
rec = {"command": "python -m trace_dspy.compile", "where": "a fresh clone of HEAD, empty DSPy cache (DSPY_CACHEDIR) and empty project caches (TRACE_DSPY_CACHE), no TRACE_DSPY_DATA",
       "git_commit": subprocess.run(["git", "-C", repo, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip(),
       "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "load_before": os.getloadavg()},
       "returncode": rc, "seconds": round(total, 1), "longest_silence_seconds": round(max(gaps), 1), "lines": lines}
json.dump(rec, open(out, "w"), indent=1)
print("total", round(total, 1), "longest gap", round(max(gaps), 1), "rc", rc)
