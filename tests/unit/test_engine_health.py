"""The sidecar's health probe of the vLLM server (bear.snapshotter.engine_health), against a real HTTP server on a
loopback port, and the sidecar's loop gated by it: an instance is registered only once its server answers, withdrawn
when it stops answering, and published again when it answers again even though its (idle) region did not change."""

from __future__ import annotations

import time
import urllib.request

import pytest

from bear.snapshotter.calibration import OnlineCalibrator
from bear.snapshotter.config import SnapshotterConfig
from bear.snapshotter.engine_health import EngineHealthProbe
from bear.snapshotter.reader import RegionReader
from bear.snapshotter.region import Capacities
from bear.snapshotter.serve import add_arguments, config_from
from bear.snapshotter.sidecar import Snapshotter
from tests.http_health import HealthServer, RawServer, closed_port_url
from tests.region_builders import FakeEngine, decoding


@pytest.fixture
def server():
    running = HealthServer()
    yield running
    running.close()


def test_healthy_from_the_first_200_and_failed_after_two_failures_in_a_row(server: HealthServer) -> None:
    probe = EngineHealthProbe(server.url, timeout_s=2.0)
    assert not probe.healthy()  # nothing known yet: not registered on faith
    server.status = 503
    assert not probe.probe_once()  # vLLM's API server is up but its engine is not
    server.status = 200
    assert probe.probe_once()
    server.status = 503
    assert probe.probe_once()  # one failure on a loaded server is no death
    server.status = 200
    assert probe.probe_once()
    server.status = 503
    probe.probe_once()
    assert not probe.probe_once()  # two in a row: the engine died
    server.status = 200
    assert probe.probe_once()
    assert (probe.num_probes, probe.num_failures) == (7, 4)


def test_the_probe_goes_straight_to_the_server_whatever_proxy_the_environment_names(server: HealthServer,
                                                                                   monkeypatch) -> None:
    for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY"):
        monkeypatch.setenv(name, closed_port_url().removesuffix("/health"))
    for name in ("no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(urllib.request, "_opener", None)  # urlopen's opener reads the environment when first built
    assert EngineHealthProbe(server.url, timeout_s=2.0).probe_once()


def test_a_server_that_is_not_listening_is_never_healthy() -> None:
    probe = EngineHealthProbe(closed_port_url(), timeout_s=1.0)
    assert not probe.probe_once() and not probe.probe_once()


def test_a_server_that_stops_listening_fails(server: HealthServer) -> None:
    probe = EngineHealthProbe(server.url, timeout_s=2.0)
    assert probe.probe_once()
    server.close()
    probe.probe_once()
    assert not probe.probe_once()


def test_the_probe_thread_follows_the_server(server: HealthServer) -> None:
    probe = EngineHealthProbe(server.url, interval_s=0.05, timeout_s=2.0)
    probe.start()
    try:
        deadline = time.monotonic() + 5
        while not probe.healthy() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert probe.healthy()
        server.status = 503
        while probe.healthy() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not probe.healthy()
    finally:
        started = time.monotonic()
        probe.stop()
        assert time.monotonic() - started < 1.5
    count = server.num_requests
    time.sleep(0.2)
    assert server.num_requests == count  # stopped


def banner(connection) -> None:  # noqa: ANN001
    connection.sendall(b"SSH-2.0-OpenSSH_9.6\r\n")  # not HTTP: http.client raises BadStatusLine


def dribble(connection) -> None:  # noqa: ANN001
    connection.recv(4096)
    connection.sendall(b"HTTP/1.1 200 OK\r\n")
    for _ in range(40):  # headers one byte every 0.1 s: each read is quick, the answer never complete in time
        connection.sendall(b"X")
        time.sleep(0.1)


def silent(connection) -> None:  # noqa: ANN001
    connection.recv(4096)
    time.sleep(5)


@pytest.mark.parametrize("behave, failures", [(banner, ("BadStatusLine",)), (dribble, ("no answer within 0.5 s",)),
                                              (silent, ("no answer within 0.5 s", "timed out"))])
def test_whatever_the_peer_does_a_probe_fails_within_its_timeout_and_the_probe_goes_on(
        behave, failures: tuple[str, ...]) -> None:
    raw = RawServer(behave)
    try:
        probe = EngineHealthProbe(raw.url, timeout_s=0.5)
        for _ in range(2):
            started = time.monotonic()
            assert not probe.probe_once()
            assert time.monotonic() - started < 0.9
            assert any(failure in probe.last_failure for failure in failures)
    finally:
        raw.close()


def test_a_redirect_is_a_failure_not_followed(server: HealthServer) -> None:
    server.status = 302
    probe = EngineHealthProbe(server.url, timeout_s=2.0)
    assert not probe.probe_once() and probe.last_failure == "HTTP 302"


def test_stop_returns_at_once_while_a_probe_hangs() -> None:
    raw = RawServer(silent)
    try:
        probe = EngineHealthProbe(raw.url, interval_s=0.05, timeout_s=3.0)
        probe.start()
        time.sleep(0.3)
        started = time.monotonic()
        probe.stop()
        assert time.monotonic() - started < 0.5
    finally:
        raw.close()


@pytest.mark.parametrize("interval_s, timeout_s, failures", [(0, 1, 2), (0.5, 0, 2), (0.5, 1, 0)])
def test_bad_probe_settings_are_refused(interval_s: float, timeout_s: float, failures: int) -> None:
    with pytest.raises(ValueError):
        EngineHealthProbe("http://localhost:8000/health", interval_s, timeout_s, failures)


class RecordingPublisher:
    def __init__(self) -> None:
        self.snapshots: list = []
        self.registrations: list = []
        self.withdrawals = 0

    def offer_snapshot(self, snapshot) -> None:  # noqa: ANN001
        self.snapshots.append(snapshot)

    def offer_coefficients(self, coefficients) -> None:  # noqa: ANN001
        pass

    def set_registration(self, registration) -> None:  # noqa: ANN001
        self.registrations.append(registration)

    def withdraw_registration(self) -> None:
        self.withdrawals += 1


def test_the_sidecar_registers_only_a_server_that_answers_and_withdraws_one_that_stops(tmp_path) -> None:
    path = str(tmp_path / "region")
    engine = FakeEngine(path, Capacities(max_rows=16, max_step_entries=8, num_ring_steps=8, max_slots=64))
    engine.write_state([decoding("a")], written_at_s=time.time())
    healthy = {"now": False}
    availability: list[bool] = []
    publisher = RecordingPublisher()
    sidecar = Snapshotter(SnapshotterConfig(region=path, instance_id="pod-1"), RegionReader(path), publisher,
                          OnlineCalibrator(100, 10, 1.0), on_availability=availability.append,
                          engine_healthy=lambda: healthy["now"])

    # The plugin wrote its region; the API server does not answer yet (vLLM starting): nothing is registered.
    assert not sidecar.poll_once() and not sidecar.poll_once()
    assert (publisher.registrations, publisher.snapshots, sidecar.latest()) == ([], [], None)
    assert not sidecar.available and availability == [False]

    # It answers: registered and published, though the idle engine's region has not changed since.
    healthy["now"] = True
    assert sidecar.poll_once()
    assert len(publisher.registrations) == 1 and len(publisher.snapshots) == 1
    assert [r.request_id for r in publisher.snapshots[0].running] == ["a"] and sidecar.available

    # It stops answering (the engine died with its server): withdrawn at once, not engine_timeout_s later.
    healthy["now"] = False
    withdrawn = publisher.withdrawals
    assert not sidecar.poll_once()
    assert publisher.withdrawals == withdrawn + 1 and sidecar.latest() is None and availability == [False, True, False]

    # Back (a restart into the same region, idle): registered and published again.
    healthy["now"] = True
    assert sidecar.poll_once()
    assert len(publisher.registrations) == 2 and len(publisher.snapshots) == 2
    assert sidecar.latest() is not None and availability == [False, True, False, True]


def test_the_health_url_is_a_setting_and_a_flag() -> None:
    config = SnapshotterConfig.from_environ({"BEAR_ENGINE_HEALTH_URL": " http://localhost:8000/health?x=1 ",
                                             "BEAR_ENGINE_HEALTH_TIMEOUT_S": "1.5"})
    assert (config.engine_health_url, config.engine_health_timeout_s) == ("http://localhost:8000/health?x=1", 1.5)
    for bad in ("0", "-1", "nan", "inf", "61"):
        with pytest.raises(ValueError, match="BEAR_ENGINE_HEALTH_TIMEOUT_S"):
            SnapshotterConfig.from_environ({"BEAR_ENGINE_HEALTH_TIMEOUT_S": bad})
    assert SnapshotterConfig.from_environ({}).engine_health_url == ""  # off: the region's heartbeat alone
    import argparse

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--engine-health-url", "https://[::1]:8443/health"])
    assert config_from(args).engine_health_url == "https://[::1]:8443/health"


@pytest.mark.parametrize("url", ["localhost:8000/health", "ftp://localhost/health", "http://:8000/health",
                                 "http://localhost:99999/health", "sim://tiny-0", "http://localhost:8000/he alth",
                                 "http://localhost:8000/gesundheitsprüfung", "http://localhost:0/health",
                                 "http://admin:s3cret@localhost:8000/health", "http://:s3cret@localhost/health"])
def test_a_health_url_that_is_no_http_url_is_refused_naming_the_setting(url: str) -> None:
    with pytest.raises(ValueError, match="BEAR_ENGINE_HEALTH_URL"):
        SnapshotterConfig.from_environ({"BEAR_ENGINE_HEALTH_URL": url})
