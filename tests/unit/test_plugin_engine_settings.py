"""What the plugin tells the replay of a scheduler's settings (bear.snapshotter.recorder.engine_settings), on a
stand-in with vLLM 0.32's attribute names (the real scheduler: tests/integration/test_vllm_snapshot_plugin.py)."""

from __future__ import annotations

from types import SimpleNamespace

from bear.snapshotter.recorder import engine_settings


def scheduler(**fields: object) -> SimpleNamespace:
    config = SimpleNamespace(long_prefill_token_threshold=0, watermark=0.01, enable_chunked_prefill=True,
                             async_scheduling=True)
    defaults = dict(scheduler_config=config, max_num_scheduled_tokens=2048, max_num_running_reqs=256, block_size=16,
                    kv_cache_manager=SimpleNamespace(block_pool=SimpleNamespace(num_gpu_blocks=1001),
                                                     enable_caching=True),
                    max_model_len=4096, scheduler_reserve_full_isl=True,
                    vllm_config=SimpleNamespace(model_config=SimpleNamespace(served_model_name=["Qwen3-8B"])))
    return SimpleNamespace(**{**defaults, **fields})


def test_the_admission_limit_is_max_num_active_seqs_where_it_is_set() -> None:
    """vLLM admits a waiting request while fewer than max_num_active_reqs run; max_num_running_reqs is the runner's
    slot count."""
    assert engine_settings(scheduler(), is_async=False).max_num_seqs == 256
    assert engine_settings(scheduler(max_num_active_reqs=128), is_async=False).max_num_seqs == 128


def test_the_rest_of_the_settings() -> None:
    settings = engine_settings(scheduler(), is_async=True)
    assert (settings.max_num_batched_tokens, settings.block_size, settings.num_gpu_blocks, settings.max_model_len,
            settings.async_scheduling, settings.model, settings.enable_prefix_caching) == (
        2048, 16, 1000, 4096, True, "Qwen3-8B", True)
    no_caching = scheduler(kv_cache_manager=SimpleNamespace(block_pool=SimpleNamespace(num_gpu_blocks=1001),
                                                            enable_caching=False))  # --no-enable-prefix-caching
    assert engine_settings(no_caching, is_async=True).enable_prefix_caching is False


def test_async_scheduling_is_what_the_engine_does_not_what_the_class_is() -> None:
    """vLLM's CPU build turns async scheduling off whatever the flags: an AsyncScheduler stepped one step at a time
    schedules as the synchronous one does, and the replay must model it so."""
    stepped = scheduler(scheduler_config=SimpleNamespace(long_prefill_token_threshold=0, watermark=0.01,
                                                         enable_chunked_prefill=True, async_scheduling=False))
    assert engine_settings(stepped, is_async=True).async_scheduling is False
    assert engine_settings(scheduler(), is_async=True).async_scheduling is True
    assert engine_settings(scheduler(), is_async=False).async_scheduling is False
