"""Real parts for integration tests and benchmarks: tiny model, vLLM engine, Prometheus, Redis.

Each module starts one kind of real server in its own process group, on a free loopback
port, logging to a file, and stops it for sure (context managers); tests/conftest.py wraps
them in fixtures. They import no pytest, so benchmarks and the local demo can use them too:

- tiny_model: ``tiny_model_dir()`` / ``tokenizer_json()``, generated once, cached in .cache/.
- engine: ``VllmEngine(EngineConfig(...), log_path)``; ``parse_cache_config_info()``.
- prometheus: ``PrometheusServer(work_dir, targets)`` with ``set_targets()`` and ``wait_for()``.
- redis_server: ``RedisServer(work_dir)`` with ``kill()`` / ``start()`` on the same port.
- ports: ``free_port()``; processes: ``ManagedProcess`` (process-group stop, RSS).
- gateway: ``FakeEngine`` (in-process upstream), ``GatewayProcess`` (``kvpool gateway``).
- waiting: ``wait_until()`` / ``wait_until_async()`` (poll for evidence, fail with what was
  awaited) and ``ManualClock`` (time a test moves by hand) - instead of fixed sleeps.
- timing: ``stall_loop()`` / ``loop_turns()``: the time a test spends on purpose (a stalled
  event loop, turns of the loop), named so that no bare sleep is left to read as a guess.
"""
