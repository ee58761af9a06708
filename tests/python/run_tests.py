"""Runs tests/python (unittest discover, verbose) with a watchdog, as ctest's Python test.

ctest ends a test past its TIMEOUT with SIGKILL, which leaves no trace of where it hung. Here,
after `--hang-seconds` (well below that limit), the watchdog prints what each process of the
run is waiting in (this one's threads, Python and native, and its children's native stacks: a
worker process that hung in a forked child shows there), kills the children and ends the run
with exit status 3.

    python3 run_tests.py [--hang-seconds S] [unittest arguments...]
"""
import argparse
import faulthandler
import os
import shutil
import signal
import subprocess
import sys
import threading
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))


def native_stacks(pid):
    """Each thread's native stack (gdb, where installed and allowed to attach), or where in
    the kernel each waits (/proc)."""
    if shutil.which("gdb"):
        # Not under the sanitizer runtimes the ASan run preloads: gdb hangs at its start there.
        environment = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "ASAN_OPTIONS", "UBSAN_OPTIONS")}
        try:
            stacks = subprocess.run(["gdb", "-p", str(pid), "-batch", "-nx", "-ex", "thread apply all bt"],
                                    capture_output=True, text=True, timeout=20, env=environment).stdout
            if "Thread" in stacks:
                return stacks
        except (OSError, subprocess.SubprocessError):
            pass  # refused (ptrace_scope) or stuck: what /proc shows instead

    def read(tid, name):
        try:
            with open(f"/proc/{pid}/task/{tid}/{name}") as f:
                return f.read().strip()
        except OSError as e:
            return f"({e.strerror})"
    try:
        tids = sorted(os.listdir(f"/proc/{pid}/task"), key=int)
    except OSError as e:
        return f"(process {pid}: {e.strerror})"
    return "\n".join(f"thread {tid} ({read(tid, 'comm')}): wchan {read(tid, 'wchan')}, syscall {read(tid, 'syscall')}"
                     f"\n{read(tid, 'stack')}" for tid in tids)


def descendants(pid):
    """The processes below `pid`, children first (from /proc, read once)."""
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parent = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry))
    found, queue = [], [pid]
    while queue:
        for child in sorted(children.get(queue.pop(0), [])):
            found.append(child)
            queue.append(child)
    return found


def report_hang_and_exit(seconds):
    # A thread of its own, so that it runs while the main thread waits in native code. Not
    # faulthandler.dump_traceback_later, which needs no GIL: a forked child inherits its
    # watchdog as running, without the thread, and hangs at its own first call of it.
    out = sys.stderr
    print(f"\n*** tests/python still running after {seconds} s: a hang. Where each process waits:", file=out, flush=True)
    children = descendants(os.getpid())
    for child in children[:8]:  # 20 s of gdb each at most
        try:
            with open(f"/proc/{child}/cmdline", "rb") as f:
                command = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            command = "?"
        print(f"\n--- child process {child}: {command}\n{native_stacks(child)}", file=out, flush=True)
    print(f"\n--- this process ({os.getpid()}), native:\n{native_stacks(os.getpid())}", file=out, flush=True)
    print("\n--- this process, Python:", file=out, flush=True)
    faulthandler.dump_traceback(file=out, all_threads=True)
    out.flush()
    # Hung workers would outlive the run, holding ctest's output pipes open.
    for child in children:
        try:
            os.kill(child, signal.SIGKILL)
        except OSError:
            pass
    os._exit(3)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hang-seconds", type=float, default=480,
                        help="print where the run waits and end it after this long (default 480; the "
                             "run's limit must leave 6 minutes more for the report)")
    args, rest = parser.parse_known_args()
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        # Started as a background job (`cmd &` in a script), Python keeps SIGINT ignored; the
        # tests of Ctrl-C need the KeyboardInterrupt an interactive run gets.
        signal.signal(signal.SIGINT, signal.default_int_handler)
    watchdog = threading.Timer(args.hang_seconds, report_hang_and_exit, (args.hang_seconds,))
    watchdog.daemon = True
    watchdog.start()
    program = unittest.main(module=None, argv=[sys.argv[0], "discover", "-s", HERE, "-v"] + rest, exit=False)
    watchdog.cancel()
    if program.result.testsRun == 0:
        sys.exit("run_tests.py: no test ran (a -k pattern that matches none?)")
    sys.exit(0 if program.result.wasSuccessful() else 1)


if __name__ == "__main__":
    main()
