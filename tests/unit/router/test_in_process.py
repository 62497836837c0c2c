"""bear.router.in_process: the in-process services' settings (the remaining-length source, the shared discovery, the
settings not read), their error counters, and what a start that fails half-way closes."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from prometheus_client import REGISTRY, CollectorRegistry

from bear.common.redis_config import RedisConfig
from bear.discovery.static import StaticDiscovery
from bear.router import in_process, main
from bear.router.config import RouterConfig
from bear.router.signals import DependencyUnavailable

UNREACHABLE_REDIS = RedisConfig(url="redis://127.0.0.1:1/0")  # connections are made when used: none is here


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.predictor_builders import trained_artifact

    folder = tmp_path_factory.mktemp("artifact") / "predictor"
    trained_artifact().save(folder)
    return folder


def config(*services: str, **settings: object) -> RouterConfig:
    return RouterConfig(in_process=frozenset(services), redis=UNREACHABLE_REDIS, **settings)  # type: ignore[arg-type]


async def started(router_config: RouterConfig, environ: dict[str, str]) -> in_process.InProcess:
    return await in_process.start(router_config, StaticDiscovery(()), environ, registry=CollectorRegistry())


@pytest.mark.parametrize(("environ", "source"), [
    ({}, "router:1"),  # neither setting: the predictor the router calls
    ({"BEAR_PREDICTOR_ADDRESS": "predictor:2"}, "predictor:2"),
])
def test_the_estimator_takes_remaining_lengths_from_its_settings_else_the_routers_predictor(
        environ: dict[str, str], source: str) -> None:
    async def run() -> str:
        built = await started(config("estimator", predictor_address="router:1"), environ)
        try:
            assert built.estimator is not None and built.predictor is None
            return built.estimator._service.config.predictor_address  # noqa: SLF001
        finally:
            await built.close()

    assert asyncio.run(run()) == source


def test_the_estimator_reads_the_routers_discovery_and_leaves_it_running() -> None:
    async def run() -> None:
        discovery = StaticDiscovery(())
        built = await in_process.start(config("estimator"), discovery, {}, registry=CollectorRegistry())
        assert built.estimator is not None and built.estimator._service.discovery is discovery  # noqa: SLF001
        stopped: list[bool] = []
        discovery.stop = lambda: stopped.append(True)  # type: ignore[method-assign]
        await built.close()
        assert stopped == []

    asyncio.run(run())


def test_the_services_ports_are_not_read(model_dir: Path) -> None:
    """An environment shared with the standalone services starts the router whatever their ports say."""
    environ = {"BEAR_PREDICTOR_MODEL_DIR": str(model_dir), "BEAR_PREDICTOR_GRPC_PORT": "abc",
               "BEAR_ESTIMATOR_METRICS_PORT": "99999", "BEAR_ESTIMATOR_HOST": ""}

    async def run() -> None:
        built = await started(config("predictor", "estimator"), environ)
        assert built.predictor is not None and built.estimator is not None
        await built.close()

    asyncio.run(run())


def test_refusals_are_counted_as_the_predictors_grpc_face_counts_them(model_dir: Path) -> None:
    labels = {"method": "Predict", "code": "INVALID_ARGUMENT"}
    before = REGISTRY.get_sample_value("bear_predictor_errors_total", labels) or 0.0

    async def run() -> DependencyUnavailable:
        built = await started(config("predictor"), {"BEAR_PREDICTOR_MODEL_DIR": str(model_dir),
                                                    "BEAR_PREDICTOR_MAX_PROMPT_CHARS": "50"})
        try:
            assert built.predictor is not None
            assert (await built.predictor.predict("Give three tips for staying healthy.")).keys()
            with pytest.raises(DependencyUnavailable) as refused:
                await built.predictor.predict("Summarize the following report. " * 10)
            return refused.value
        finally:
            await built.close()

    error = asyncio.run(run())
    assert error.service == "predictor" and error.code == "INVALID_ARGUMENT"
    assert REGISTRY.get_sample_value("bear_predictor_errors_total", labels) == before + 1


def test_a_start_that_fails_later_closes_the_in_process_services(model_dir: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    closed: list[bool] = []
    close = in_process.InProcess.close

    async def counted_close(self: in_process.InProcess) -> None:
        closed.append(True)
        await close(self)

    def broken_router(*args: object, **kwargs: object) -> None:
        raise RuntimeError("the router could not be built")

    monkeypatch.setattr(in_process.InProcess, "close", counted_close)
    monkeypatch.setattr("bear.router.router.Router", broken_router)
    monkeypatch.setenv("BEAR_PREDICTOR_MODEL_DIR", str(model_dir))
    with pytest.raises(RuntimeError, match="could not be built"):
        asyncio.run(main.build(config("predictor", "estimator"), CollectorRegistry()))
    assert closed == [True]


def test_a_missing_artifact_names_the_variable_the_router_reads() -> None:
    with pytest.raises(ValueError, match=r"^BEAR_ROUTER_IN_PROCESS=predictor: BEAR_PREDICTOR_MODEL_DIR is required: "
                                         r"the predictor artifact"):
        asyncio.run(started(config("predictor"), {"BEAR_PREDICTOR_MODEL_DIR": " "}))


def test_with_both_in_process_the_artifact_is_loaded_once(model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from bear.predictor.artifact import PredictorArtifact

    loads: list[object] = []
    load = PredictorArtifact.load

    def counted(folder: object) -> PredictorArtifact:
        loads.append(folder)
        return load(folder)

    monkeypatch.setattr(PredictorArtifact, "load", staticmethod(counted))

    async def run() -> None:
        built = await started(config("predictor", "estimator"), {"BEAR_PREDICTOR_MODEL_DIR": str(model_dir)})
        await built.close()

    asyncio.run(run())
    assert len(loads) == 1


def test_the_routers_latest_dispatches_go_along_to_the_in_process_estimator_once_each() -> None:
    """The standalone estimator may be one of several replicas, each needing them with every call; the one in the
    router's process has them from the first call they went along with."""
    from bear.router.decision import DispatchRecord

    records = [DispatchRecord(f"d{k}", "a", "m", 1000.0 + k, 100, 50.0, 0.0, 500.0) for k in range(4)]

    async def run() -> list[list[str]]:
        built = await started(config("estimator"), {})
        assert built.estimator is not None
        servicer = built.estimator._service.servicer  # noqa: SLF001
        answer, passed = servicer.answer, []

        async def spied(request):  # noqa: ANN001, ANN202 - an EstimateRequest, its reply
            passed.append([record.request_id for record in request.recent_dispatches])
            return await answer(request)

        servicer.answer = spied
        try:
            for recent in (records[:2], records[:3], records[1:4], records[1:4], []):
                await built.estimator.estimate("q", 100, 50.0, ["a"], 1000.0, recent)
            return passed
        finally:
            await built.close()

    assert asyncio.run(run()) == [["d0", "d1"], ["d2"], ["d3"], [], []]
