"""Key reads driven by ``wrk`` (Debian's package), cycling through a fixed key set.

A Lua script reads the request paths from a file, one per line, and each of wrk's
connections sends one GET after another, in turn over the paths; its ``done`` hook prints
one JSON line of wrk's own counts and latency percentiles. The answer has the shape of
``bench.loadgen``'s summary, so either tool's figures go into the report the same way.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import orjson

#: The tool named in the report when wrk measured.
WRK = "wrk"
#: wrk's percentiles (microseconds in wrk) reported as bench.loadgen's keys (ms).
QUANTILES = ((50.0, "p50"), (90.0, "p90"), (99.0, "p99"), (99.9, "p99.9"))

SCRIPT = """\
local requests = {}
local next_index = 1
local threads_made = 0

-- Each thread starts elsewhere in the key set.
function setup(thread)
  thread:set("offset", threads_made * 7919)
  threads_made = threads_made + 1
end

function init(args)
  for line in io.lines(args[1]) do
    if #line > 0 then
      requests[#requests + 1] = wrk.format("GET", line)
    end
  end
  if #requests == 0 then
    error("no request paths in " .. args[1])
  end
  next_index = (offset or 0) % #requests + 1
end

function request()
  local chosen = requests[next_index]
  next_index = next_index % #requests + 1
  return chosen
end

function done(summary, latency, requests_seen)
  local quantiles = {QUANTILES}
  local parts = {}
  for _, q in ipairs(quantiles) do
    parts[#parts + 1] = string.format('"%g": %d', q, math.floor(latency:percentile(q)))
  end
  local errors = summary.errors
  io.write(string.format(
    '{"wrk": {"requests": %d, "duration_us": %d, "connect": %d, "read": %d, '
      .. '"write": %d, "status": %d, "timeout": %d, "latency_us": {%s}}}\\n',
    summary.requests, summary.duration, errors.connect, errors.read, errors.write,
    errors.status, errors.timeout, table.concat(parts, ", ")))
end
"""


def available() -> bool:
    """Whether ``wrk`` is on the PATH (``make tools`` installs it where it can)."""
    return shutil.which(WRK) is not None


def script() -> str:
    """The Lua script, with the percentiles this module reports."""
    return SCRIPT.replace("{QUANTILES}", "{" + ", ".join(f"{q:g}" for q, _ in QUANTILES) + "}")


def request_paths(base: str, table: str, keys: list[str], query: str = "") -> list[str]:
    """The path of each key's read, URL-encoded, with ``query`` appended when given."""
    prefix = urlsplit(base).path.rstrip("/")
    suffix = f"?{query}" if query else ""
    return [f"{prefix}/tables/{table}/keys/{quote(key, safe='')}{suffix}" for key in keys]


def summarize(output: str) -> dict[str, Any]:
    """bench.loadgen's summary of one wrk run, from the JSON line its ``done`` hook printed."""
    lines = [line for line in output.splitlines() if line.startswith('{"wrk"')]
    if not lines:
        raise ValueError(f"wrk printed no summary line: {output[-500:]!r}")
    found = orjson.loads(lines[-1])["wrk"]
    seconds = found["duration_us"] / 1e6
    # A non-2xx answer is counted under "status"; socket errors mean no answer at all.
    failed = found["status"] + found["connect"] + found["read"] + found["write"]
    failed += found["timeout"]
    ok = max(0, found["requests"] - found["status"])
    latency = found["latency_us"]
    return {
        "tool": WRK,
        "requests": found["requests"],
        "ok": ok,
        "failed": failed,
        "errors": {k: found[k] for k in ("connect", "read", "write", "status", "timeout")},
        "replicas": {},
        "rps": ok / seconds if seconds > 0 else 0.0,
        "latency_ms": {name: latency[f"{q:g}"] / 1000 for q, name in QUANTILES},
        "duration_s": seconds,
    }


def run(
    base: str,
    table: str,
    keys: list[str],
    *,
    duration_s: float,
    connections: int,
    work: Path,
    name: str,
    query: str = "",
    threads: int = 1,
) -> dict[str, Any]:
    """Read ``keys`` from ``base`` with wrk for ``duration_s``; the summary of the run."""
    if not keys:
        raise ValueError("wrk needs at least one key to read")
    paths_file = work / f"{name}-paths.txt"
    paths_file.write_text("\n".join(request_paths(base, table, keys, query)) + "\n")
    script_file = work / "wrk-keys.lua"
    script_file.write_text(script())
    command = [
        WRK,
        f"-t{threads}",
        f"-c{max(connections, threads)}",
        f"-d{max(1, round(duration_s))}s",
        "--timeout",
        "10s",
        "-s",
        str(script_file),
        base,
        "--",
        str(paths_file),
    ]
    finished = subprocess.run(
        command, capture_output=True, text=True, timeout=duration_s + 60, check=False
    )
    (work / f"{name}-wrk.log").write_text(finished.stdout + finished.stderr)
    if finished.returncode != 0:
        raise RuntimeError(f"wrk exited {finished.returncode}: {finished.stderr[-500:]}")
    summary = summarize(finished.stdout)
    summary["command"] = " ".join(command[:-2])
    return summary
