"""Which thread of a worker runs a sync call: the reading thread for quick tools, pool threads for slow
ones, so that calls arriving together neither pay a thread hand-off each nor queue behind a slow call.

Each test pipelines its calls in one write, so they reach the worker together, and reads the name of
the thread that ran each one (``tool`` is a pool thread; the reader is ``MainThread`` or, after a
hand-off, ``tool-reader``).
"""

from __future__ import annotations

import collections
import json
import time

from helpers import Env, RawConnection

WHERE = """
    import threading, time

    def where(sleep: float = 0.0) -> str:
        if sleep:
            time.sleep(sleep)
        return threading.current_thread().name
"""


def pipelined(raw: RawConnection, count: int, sleep: float = 0.0, behind: float | None = None) -> collections.Counter[str]:
    """Send ``count`` calls of ``where`` in one write (behind one that sleeps ``behind`` seconds,
    when given); count the threads that answered the ``count``."""
    sleeps = ([] if behind is None else [behind]) + [sleep] * count
    raw.send_bytes(b"".join(
        json.dumps({"jsonrpc": "2.0", "id": i, "method": "tools/call",
                    "params": {"name": "where", "arguments": {"sleep": each}}}).encode() + b"\n"
        for i, each in enumerate(sleeps)
    ))
    threads: collections.Counter[str] = collections.Counter()
    for _ in sleeps:
        reply = raw.recv()
        assert not reply["result"].get("isError"), reply
        if behind is None or reply["id"] != 0:
            threads[reply["result"]["content"][0]["text"]] += 1
    return threads


def test_quick_calls_that_arrive_together_run_on_the_reading_thread(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    env.write_tool(env.global_tools, "where.py", WHERE)
    with make_daemon().raw() as raw:
        pipelined(raw, 1)  # the worker starts
        threads = pipelined(raw, 64)
    print(f"64 quick calls sent together ran on: {dict(threads)}")
    # Before, every call that found another waiting went to a pool thread (62-64 of 64). A quick
    # call that a busy machine stretched past 1 ms sends at most the next 32 to the pool.
    assert sum(n for name, n in threads.items() if name != "tool") >= 16, threads


def test_slow_calls_that_arrive_together_still_overlap(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    env.write_tool(env.global_tools, "where.py", WHERE)
    with make_daemon().raw() as raw:
        pipelined(raw, 1)
        started = time.monotonic()
        threads = pipelined(raw, 8, sleep=0.5)
        elapsed = time.monotonic() - started
    print(f"8 calls of 0.5 s sent together: {elapsed:.2f} s, on {dict(threads)}")
    # The first runs inline until the watchdog hands the reading role on (10 ms), which marks the
    # tool slow: the others go to pool threads (or each to a reader of its own) and overlap.
    assert elapsed < 2.5, f"8 calls of 0.5 s took {elapsed:.1f} s: they queued instead of overlapping"
    assert len(threads) >= 2, threads


def test_a_tool_that_was_slow_runs_inline_again_after_quick_calls(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    env.write_tool(env.global_tools, "where.py", WHERE)
    with make_daemon().raw() as raw:
        # The quick calls come in one write behind a slow one: while it runs inline they pile up
        # in the channel, however the daemon's writes trickle on a loaded machine; the watchdog
        # hands the reading role on (the tool is slow now), and the new reader finds them together.
        after_slow = pipelined(raw, 64, behind=0.1)
        # Quick again after QUICK_AGAIN quick calls in a row; on a loaded machine a call can take a
        # millisecond and start the count again, so up to eight rounds for it to come back inline.
        for _round in range(8):
            later = pipelined(raw, 64)
            if sum(n for name, n in later.items() if name != "tool") >= 16:
                break
    print(f"64 quick calls right after a slow one ran on {dict(after_slow)}; the next 64 on {dict(later)}")
    assert after_slow["tool"] >= 1, after_slow
    assert sum(n for name, n in later.items() if name != "tool") >= 16, later


MARKS = """
    import time

    def mark(name: str, log: str, sleep: float = 0.0) -> str:
        with open(log, "a") as ran:
            ran.write(name + "\\n")
        time.sleep(sleep)
        return name
"""


def test_a_call_cancelled_while_it_waits_for_a_thread_never_runs(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    # One thread: a call that comes while the first runs waits in the worker's backlog. Cancelled
    # there, it is taken out: it never runs, is never answered, and the next call runs as usual.
    env.write_tool(env.global_tools, "mark.py", MARKS)
    ran = env.project / "ran.txt"

    def mark(name: str, sleep: float = 0.0) -> int:
        return raw.send_request("tools/call", {"name": "mark", "arguments": {"name": name, "log": str(ran), "sleep": sleep}})

    with make_daemon({"ATOMICTOOLS_WORKER_THREADS": "1"}).raw() as raw:
        assert raw.answer(mark("warm"))
        first = mark("first", sleep=1.5)
        deadline = time.monotonic() + 10
        while "first" not in (ran.read_text() if ran.exists() else ""):
            assert time.monotonic() < deadline, "the first call did not start"
            time.sleep(0.01)
        time.sleep(0.1)  # past the inline budget: the reading role has moved on, so the next is read
        waiting = mark("waiting")
        time.sleep(0.2)
        raw.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": waiting}})
        assert raw.reply(first)["result"]["content"][0]["text"] == "first"
        last = mark("last")
        reply = raw.recv()
        assert reply["id"] == last, f"the cancelled call was answered: {reply}"
    assert ran.read_text().split() == ["warm", "first", "last"]


BUSY = """
    import threading, time

    _lock = threading.Lock()
    _now = [0, 0]  # calls running, the most seen at once

    def busy(sleep: float) -> int:
        with _lock:
            _now[0] += 1
            _now[1] = max(_now)
        time.sleep(sleep)
        with _lock:
            _now[0] -= 1
        return _now[1]
"""


def test_no_more_calls_run_at_once_than_worker_threads(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    # Counted whichever thread runs them: the reader's own call, the one it hands on when it
    # overstays, and the pool's.
    env.write_tool(env.global_tools, "busy.py", BUSY)
    with make_daemon({"ATOMICTOOLS_WORKER_THREADS": "3"}).raw() as raw:
        raw.send_bytes(b"".join(
            json.dumps({"jsonrpc": "2.0", "id": i, "method": "tools/call",
                        "params": {"name": "busy", "arguments": {"sleep": 0.3}}}).encode() + b"\n"
            for i in range(1, 10)
        ))
        replies = [raw.recv() for _ in range(9)]  # in the order they end
        most = max(reply["result"]["structuredContent"]["result"] for reply in replies)
    assert most == 3, f"{most} calls ran at once with worker_threads = 3"


BIG = """
    import os, threading, time

    def big(n: int, sleep: float = 0.0) -> str:
        if sleep:
            time.sleep(sleep)
        return f"{n} {threading.current_thread().name} {os.getpid()} " + "x" * 150_000
"""


def test_frames_sent_at_once_by_the_reader_and_pool_threads_never_interleave(env: Env, make_daemon) -> None:  # type: ignore[no-untyped-def]
    # The reader sends the results of the calls it runs inline without the lock while no other
    # thread sends (worker/sender.py). Here quick calls run inline while slow ones finish
    # on pool threads, every result larger than one write of the channel: a frame of one cut into
    # by another's would be read by the daemon as garbage, and the worker killed.
    env.write_tool(env.global_tools, "big.py", BIG)
    daemon = make_daemon({"ATOMICTOOLS_TRUNCATE_BYTES": str(1 << 20)})
    with daemon.raw() as raw:
        first = raw.request("tools/call", {"name": "big", "arguments": {"n": -1}})
        pid = first["result"]["content"][0]["text"].split()[2]
        threads: collections.Counter[str] = collections.Counter()
        for _ in range(6):
            count = 40
            raw.send_bytes(b"".join(
                json.dumps({"jsonrpc": "2.0", "id": i, "method": "tools/call",
                            "params": {"name": "big", "arguments": {"n": i, "sleep": 0.002 if i % 2 else 0.0}}}).encode() + b"\n"
                for i in range(count)
            ))
            for _ in range(count):
                reply = raw.recv()
                assert not reply["result"].get("isError"), reply["result"]["content"][0]["text"][:300]
                n, thread, worker, body = reply["result"]["content"][0]["text"].split(" ", 3)
                assert (int(n), worker, len(body)) == (reply["id"], pid, 150_000)
                threads[thread] += 1
    print(f"{6 * 40} results of 150 kB sent at once by {dict(threads)}, one worker throughout")
    assert threads["tool"] and sum(n for name, n in threads.items() if name != "tool"), threads
