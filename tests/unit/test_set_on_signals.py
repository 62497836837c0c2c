"""`bear.common.service.set_on_signals`: a signal sets a threading.Event even when it lands while the main thread is
inside the event's own lock (as it is, briefly, in every `event.wait()` of a polling loop)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCENARIO = textwrap.dedent("""
    import os, signal, threading
    from bear.common.service import set_on_signals

    stop = threading.Event()
    set_on_signals(stop, (signal.SIGUSR1,))
    with stop._cond:  # where the main thread is between taking the event's lock and waiting, or after waking
        os.kill(os.getpid(), signal.SIGUSR1)  # the handler runs here, in this thread, at the next bytecode
        held = sum(range(1000))  # a few more bytecodes with the lock held
    print("set" if stop.wait(10) else "not set", flush=True)
    """)


def test_a_signal_that_lands_while_the_main_thread_holds_the_events_lock_still_sets_it() -> None:
    """(CI: `bear snapshotter`, polling its region with `stop.wait(5 ms)`, ignored SIGTERM; its handler called
    `stop.set()` and waited for the lock its own thread held. Run in a process of its own: the old handler hangs.)"""
    done = subprocess.run([sys.executable, "-c", SCENARIO], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "set", done.stderr[-2000:]


def test_the_old_handler_does_hang_there() -> None:
    """The scenario does reach the deadlock: with `stop.set()` in the handler, it never finishes."""
    old = SCENARIO.replace("set_on_signals(stop, (signal.SIGUSR1,))",
                           "signal.signal(signal.SIGUSR1, lambda *_: stop.set())")
    try:
        subprocess.run([sys.executable, "-c", old], capture_output=True, text=True, timeout=5)
    except subprocess.TimeoutExpired:
        return
    raise AssertionError("the handler that sets the event itself finished: the scenario does not test the deadlock")
