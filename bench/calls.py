"""tools/call latency and throughput: atomictoolsd against FastMCP and MCPServer, in one run.

    python bench/calls.py            # pinned to one core, then unpinned
    python bench/calls.py --quick    # fewer calls, for a smoke run

Latency: sequential calls of the same one-line echo tool, after a warm-up, with the same raw
NDJSON client for every system (the peers over stdio, atomictoolsd over its socket), plus
atomictoolsd through its own tiny Python client. Throughput: 16 requests in flight — 16 socket
connections for atomictoolsd; the peers' one stdio connection with 16 pipelined requests.
Prints a table with the ratios and saves JSON under bench/results/.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from atomictools import Client  # noqa: E402
from clients import measure_latency, measure_throughput, socket_channel, stdio_channel  # noqa: E402
from common import DaemonUnderTest, Stats, affinity, peer_commands, print_table, save  # noqa: E402


def tiny_client_latency(socket_path: str, calls: int, warmup: int) -> Stats:
    stats = Stats()
    with Client(socket_path, autostart=False) as client:
        for i in range(warmup + calls):
            started = time.perf_counter()
            result = client.call("echo", text="hi")
            elapsed = time.perf_counter() - started
            if result.is_error:
                raise RuntimeError(result.text)
            if i >= warmup:
                stats.samples.append(elapsed)
    return stats


def run_mode(pinned: bool, args: argparse.Namespace, peers: dict[str, list[str]]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    mode = "pinned" if pinned else "unpinned"
    with affinity(pinned):
        with DaemonUnderTest() as daemon:
            channel = socket_channel(str(daemon.socket))
            channel.handshake()
            raw = measure_latency(channel, args.calls, args.warmup).summary()
            channel.close()
            tiny = tiny_client_latency(str(daemon.socket), args.calls, args.warmup).summary()
            rate = measure_throughput(str(daemon.socket), streams=16, depth=1, seconds=args.seconds)
            rows.append({"system": "atomictoolsd (socket, raw client)", "mode": mode, **raw, "calls_per_s": round(rate)})
            rows.append({"system": "atomictoolsd (tiny client)", "mode": mode, **tiny, "calls_per_s": None})
        for name, command in peers.items():
            proc, channel = stdio_channel(command)
            channel.handshake()
            stats = measure_latency(channel, args.peer_calls, args.warmup // 5).summary()
            channel.close()
            rate = measure_throughput(command, streams=16, depth=1, seconds=args.seconds)
            rows.append({"system": name, "mode": mode, **stats, "calls_per_s": round(rate)})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=5000, help="timed calls per atomictoolsd latency run")
    parser.add_argument("--peer-calls", type=int, default=1000, help="timed calls per peer latency run")
    parser.add_argument("--warmup", type=int, default=500)
    parser.add_argument("--seconds", type=float, default=5.0, help="length of each throughput run")
    parser.add_argument("--quick", action="store_true", help="a short smoke run")
    args = parser.parse_args()
    if args.quick:
        args.calls, args.peer_calls, args.warmup, args.seconds = 500, 200, 100, 1.0

    peers = peer_commands()
    rows = run_mode(True, args, peers) + run_mode(False, args, peers)
    for row in rows:
        if not row["system"].startswith("atomictoolsd"):
            continue
        for peer in peers:
            other = next(r for r in rows if r["system"] == peer and r["mode"] == row["mode"])
            key = "fastmcp" if "fastmcp" in peer else "mcpserver"
            row[f"x_faster_than_{key}"] = round(other["p50_us"] / row["p50_us"], 1)
            if row["calls_per_s"]:
                row[f"x_throughput_vs_{key}"] = round(row["calls_per_s"] / other["calls_per_s"], 1)
    print_table(
        ["system", "mode", "p50 µs", "p99 µs", "calls/s (16 in flight)", "p50 × vs fastmcp", "p50 × vs mcpserver"],
        [
            [r["system"], r["mode"], r["p50_us"], r["p99_us"], r["calls_per_s"] or "-",
             r.get("x_faster_than_fastmcp", "-"), r.get("x_faster_than_mcpserver", "-")]
            for r in rows
        ],
    )
    print(f"\nsaved {save('calls', {'args': vars(args), 'rows': rows})}")


if __name__ == "__main__":
    main()
