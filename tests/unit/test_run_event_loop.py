"""`bear.common.service.run_event_loop`: a SIGTERM or SIGINT that lands while a service is still starting (before
serve_until_stopped takes the signals over) runs the clean-up of what start-up built, where the signal's default action
would end the process at once (a router with an embedded Redis left the Redis running). And `bear`'s entry point: a
Ctrl-C while it imports its commands says so without a traceback. Each case runs in a process of its own."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

import pytest

STARTING = textwrap.dedent("""
    import asyncio, time
    from bear.common.service import run_event_loop

    async def main():
        try:
            print("started", flush=True)
            {work}
            print("still running", flush=True)
        finally:
            print("cleaned up", flush=True)

    run_event_loop(main())
    print("exited normally", flush=True)
    """)

SERVING = textwrap.dedent("""
    import asyncio, signal
    from bear.common.service import run_event_loop

    async def main():
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)  # as serve_until_stopped does
        print("started", flush=True)
        await stop.wait()
        await asyncio.sleep(0.05)  # a graceful stop's own work, not cut short
        print("stopped gracefully", flush=True)

    run_event_loop(main())
    """)


def signalled(script: str, signum: int) -> subprocess.CompletedProcess[str]:
    process = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    try:
        assert process.stdout is not None
        assert process.stdout.readline().strip() == "started"
        process.send_signal(signum)
        stdout, stderr = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    return subprocess.CompletedProcess(process.args, process.returncode, "started\n" + stdout, stderr)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_while_starting_cancels_start_up_and_runs_its_clean_up(signum: int) -> None:
    done = signalled(STARTING.format(work="await asyncio.sleep(60)"), signum)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["started", "cleaned", "up", "exited", "normally"]
    assert "Traceback" not in done.stderr


def test_a_signal_during_blocking_start_up_work_cancels_it_at_the_next_await() -> None:
    """(Loading an artifact, starting the embedded Redis: work that does not await.)"""
    done = signalled(STARTING.format(work="time.sleep(1); await asyncio.sleep(0.5); time.sleep(60)"), signal.SIGTERM)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["started", "cleaned", "up", "exited", "normally"]


def test_the_default_action_alone_would_skip_the_clean_up() -> None:
    """The scenario tests the handler: without it, SIGTERM ends the process with nothing cleaned up."""
    script = STARTING.format(work="await asyncio.sleep(60)").replace("run_event_loop(main())", "asyncio.run(main())")
    done = signalled(script, signal.SIGTERM)
    assert done.returncode == -signal.SIGTERM and "cleaned up" not in done.stdout


def test_a_service_serving_with_its_own_handler_stops_gracefully_not_cancelled() -> None:
    done = signalled(SERVING, signal.SIGTERM)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "stopped gracefully" in done.stdout


def test_a_cancellation_not_caused_by_a_signal_is_not_taken_for_one() -> None:
    script = STARTING.format(work="asyncio.current_task().cancel(); await asyncio.sleep(60)")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "CancelledError" in done.stderr


def test_ctrl_c_while_bear_imports_its_commands_says_interrupted_without_a_traceback() -> None:
    """(QA: Ctrl-C in the first second of any `bear` command printed the traceback of an import of numpy or scipy.)"""
    script = textwrap.dedent("""
        import os, signal, sys, time
        import bear.cli.main as cli
        real = cli.build_parser
        def interrupted():
            os.kill(os.getpid(), signal.SIGINT)  # as the subcommands' modules are imported
            time.sleep(1)
            return real()
        cli.build_parser = interrupted
        sys.exit(cli.main(["serve", "router"]))
        """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 130 and done.stderr.strip() == "bear: interrupted", done.stderr[-2000:]


def test_the_entry_points_module_leaves_the_commands_imports_to_main() -> None:
    """What `bear` imports before `main` runs is outside its KeyboardInterrupt handler: the standard library only."""
    script = "import sys, bear.cli.main; print(sorted({'numpy', 'grpc', 'scipy', 'redis'} & set(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "[]", done.stdout + done.stderr[-2000:]
