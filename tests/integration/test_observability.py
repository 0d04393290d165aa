"""Every PromQL expression of the dashboard and of the alerts, run against a real Prometheus.

Given the real parts (the Kubernetes API emulator, ``kvpool operator``, a vLLM CPU engine
serving the tiny model, ``kvpool gateway`` with budgets in a real Redis) and a real
Prometheus scraping the engine (with the labels a cluster's relabeling gives its pods), the
gateway (on its own metrics port, as the chart deploys it) and the operator, and given the
events the alerts are about - a canary rollout (an engine arg changes), requests admitted
in two tiers (streamed chats in the tier with a ``ttftP95Target``), a tenant over its
budget (429), an operator status write refused by the API, a broken admission ConfigMap
the gateway rejects, Redis killed (one tier falls back to the local allowance, the
fail-closed one answers 503), prompts counted by the byte fallback (the pool declares no
tokenizer) and finally the engine killed mid-request (502; the gateway ejects it) - every
expression must return data. An alert's expression is evaluated without its threshold
(the "signal" side of the comparison; ``absent(x)`` is evaluated as ``x``): a healthy
system answers nothing to ``x > threshold`` by design, but must have ``x``. Every label
an expression filters, groups or joins on must exist on one of its metrics.

This catches a typo in a metric or label name, a label the scrape does not carry, a
counter that is never created, or a join that matches nothing. The same run also executes
the chart's ``helm test`` Pod script against the gateway.

The canary (local mode: ``kvpool.dev/canary-static-endpoints``) is the same vLLM process
as stable, scraped a second time with the canary Deployment's pod labels (its revision and
track), as a cluster's relabeling would scrape a canary pod: the operator's KV gate then
measures a canary of the same size, passes, and the rollout gate values have data.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import helm_python
import kmock
import pytest
import yaml
from e2e.cluster_view import (
    api_key,
    build_local_manifests,
    build_scrape_targets,
    fetch_admission_config,
    fetch_engine_template_labels,
    load_manifests,
    measured,
    pool_when,
    published_config,
    write_manifests,
)
from e2e.components import NAMESPACE, POOL, kvpool_command, start_engines

from kvpool.api.admission_config import CONFIGMAP_KEY, CONFIGMAP_NAME, AdmissionConfig
from tests.operator_process import OperatorProcess, run_operator
from tests.support.engine import VllmEngine
from tests.support.kube import KubeApi, KubeApiError
from tests.support.ports import free_port
from tests.support.processes import ManagedProcess
from tests.support.prometheus import PrometheusFactory, PrometheusServer, ScrapeTarget
from tests.support.promql import metric_names
from tests.support.redis_server import RedisFactory, RedisServer
from tests.support.waiting import StopWaitingError, wait_until

EMPTY = AdmissionConfig(namespace=NAMESPACE)  # stands in until the ConfigMap exists

pytestmark = [pytest.mark.engine, pytest.mark.prometheus, pytest.mark.redis]

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "charts" / "kvpool" / "files" / "alerts.yaml"
DASHBOARD = ROOT / "charts" / "kvpool" / "files" / "dashboards" / "kvpool.json"
CHAT_SECRET, BATCH_SECRET = "tenant-chat-app", "tenant-bulk-summarizer"  # e2e/manifests
TIGHT_KEY = "tight-tenant-key"

POOL_PATH = f"/apis/kvpool.dev/v1alpha1/namespaces/{NAMESPACE}/modelpools/{POOL}"
CANARY_STATIC_ENDPOINTS = "kvpool.dev/canary-static-endpoints"  # docs/0006 (local mode)

# Expressions that need the engine to have failed a request: evaluated after it is killed.
AFTER_ENGINE_FAILURE = {
    "KvpoolGatewayServerErrors",
    "KvpoolEngineErrors",
    "Engine errors by kind#A",
    "Replicas ejected by the gateway#B",  # kvpool_gateway_ejections_total
    "Engine polls that failed#A",
}


# --- expressions -----------------------------------------------------------------------------


def _top_level_comparison(expr: str) -> tuple[str, str] | None:
    """Split ``expr`` at its comparison operator outside (), {}, [] and strings."""
    depth, quote, i = 0, "", 0
    while i < len(expr):
        ch = expr[i]
        if quote:
            quote = "" if ch == quote and expr[i - 1] != "\\" else quote
        elif ch in "\"'":
            quote = ch
        elif ch in "({[":
            depth += 1
        elif ch in ")}]":
            depth -= 1
        elif depth == 0:
            for op in ("==", "!=", ">=", "<=", ">", "<"):
                if expr.startswith(op, i):
                    return expr[:i], expr[i + len(op) :]
        i += 1
    return None


def signals(expr: str) -> list[str]:
    """The non-constant sides of an alert's comparison (``absent(x)`` becomes ``x``)."""
    split = _top_level_comparison(expr)
    sides = [expr] if split is None else list(split)
    result = []
    for raw in sides:
        side = re.sub(r"^\s*(bool\s+)?((on|ignoring)\s*\([^)]*\)\s*)?", "", raw).strip()
        side = re.sub(r"^(group_left|group_right)\s*(\([^)]*\))?\s*", "", side).strip()
        if re.fullmatch(r"[-+]?[0-9.]+(e[-+]?\d+)?", side):
            continue
        absent = re.fullmatch(r"absent\((.*)\)", side, flags=re.DOTALL)
        result.append(absent.group(1) if absent else side)
    return result


def labels_used(expr: str) -> set[str]:
    """Label names an expression filters, groups or joins on."""
    labels: set[str] = set()
    for group in re.findall(
        r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^()]*)\)", expr
    ):
        labels |= {part.strip() for part in group.split(",") if part.strip()}
    for matchers in re.findall(r"\{([^{}]*)\}", expr):
        labels |= set(re.findall(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)", matchers))
    return labels


def dashboard_queries() -> dict[str, str]:
    """'<panel title>#<refId>' -> expression with the template variables filled in."""
    dashboard = json.loads(DASHBOARD.read_text())
    queries = {}
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            expr = (
                target["expr"]
                .replace("$__rate_interval", "1m")
                .replace("$namespace", NAMESPACE)
                .replace("$pool", POOL)
            )
            queries[f"{panel['title']}#{target['refId']}"] = expr
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            text = variable["query"]["query"].replace("$namespace", NAMESPACE)
            queries[f"variable {variable['name']}"] = text.removeprefix("label_values(").rsplit(
                ",", 1
            )[0]
    return queries


def alert_signals() -> dict[str, list[str]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return {r["alert"]: signals(r["expr"]) for g in groups for r in g["rules"]}


def all_checks() -> dict[str, list[str]]:
    checks = {name: [expr] for name, expr in dashboard_queries().items()}
    checks.update(alert_signals())
    return checks


def test_the_engine_failure_checks_name_existing_alerts_and_panels() -> None:
    assert set(all_checks()) >= AFTER_ENGINE_FAILURE


def test_signals_drop_thresholds_and_unwrap_absent() -> None:
    assert signals('max by (pool) (x{a="b"}) == 1') == ['max by (pool) (x{a="b"})']
    assert signals("absent(up_count) == 1") == ["up_count"]
    assert signals("a > on (pool, tier)\n max by (pool, tier) (b)") == [
        "a",
        "max by (pool, tier) (b)",
    ]
    assert signals('sum(rate(c{code=~"5..", code!="503"}[5m])) / sum(d) > 0.05') == [
        'sum(rate(c{code=~"5..", code!="503"}[5m])) / sum(d)'
    ]
    assert labels_used('sum by (code) (c{code=~"5.."}) / ignoring (code) group_left sum(d)') == {
        "code"
    }


# --- the real parts --------------------------------------------------------------------------


def _tight_tenant() -> list[dict[str, Any]]:
    """A batch tenant with a budget of 100 tokens a minute: a 200-token request gets 429."""
    return [
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {
                "name": "tenant-tight",
                "namespace": NAMESPACE,
                "labels": {"kvpool.dev/api-key": "true"},  # the operator reads only these
            },
            "type": "Opaque",
            "stringData": {"api-key": TIGHT_KEY},
        },
        {
            "apiVersion": "kvpool.dev/v1alpha1",
            "kind": "TenantBudget",
            "metadata": {
                "name": "tight",
                "namespace": NAMESPACE,
                "labels": {"kvpool.dev/workload": "batch"},
            },
            "spec": {
                "tenant": "tight",
                "apiKeySecretRef": {"name": "tenant-tight", "key": "api-key"},
                "tierPolicyRef": {"name": "demo"},
                "tiers": ["batch"],
                "limits": [{"window": "1m", "tokens": 100}],
                "overBudget": "Reject",
            },
        },
    ]


def post(url: str, key: str, body: dict[str, Any], timeout: float = 60) -> tuple[int, str]:
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def chat(gateway: str, key: str, max_tokens: int = 8, **extra: Any) -> tuple[int, str]:
    body = {"model": POOL, "messages": [{"role": "user", "content": "hello"}]}
    return post(f"{gateway}/v1/chat/completions", key, body | {"max_tokens": max_tokens} | extra)


def completion(gateway: str, key: str, max_tokens: int = 8) -> tuple[int, str]:
    body = {"model": POOL, "prompt": "summarise this", "max_tokens": max_tokens}
    return post(f"{gateway}/v1/completions", key, body)


def fetch(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return str(resp.read().decode())


@contextlib.contextmanager
def gateway_process(kube: KubeApi, redis: RedisServer, workdir: Path) -> Iterator[tuple[str, str]]:
    """``kvpool gateway`` on the operator's ConfigMap; tier batch fails closed without Redis.

    Yields the API URL and the ``host:port`` of its metrics listener (``/metrics`` is served
    there only, as in the chart's Deployment; Prometheus scrapes that port).
    """
    port, metrics_port = free_port(), free_port()
    argv = kvpool_command(
        "gateway",
        "--configmap",
        NAMESPACE,
        "--kube-server",
        kube.url,
        "--redis",
        redis.url,
        "--listen",
        f"127.0.0.1:{port}",
        "--metrics-listen",
        f"127.0.0.1:{metrics_port}",
        "--fail-closed-tier",
        "batch",
        # The default 5 ms per Redis call trips on a loaded 2-core machine (batch would fail
        # closed while Redis is up); the Redis-down step below stops Redis for real.
        "--redis-timeout",
        "0.5",
        "--reload-interval",
        "0.5",
        "--no-access-log",
    )
    process = ManagedProcess(argv, log_path=workdir / "gateway.log", env=dict(os.environ), cwd=ROOT)
    try:
        process.start()
        yield f"http://127.0.0.1:{port}", f"127.0.0.1:{metrics_port}"
    finally:
        process.stop(timeout=10)


def helm_test_script() -> str:
    values = {"helmTest": {"model": POOL, "apiKeySecret": {"name": CHAT_SECRET, "key": "k"}}}
    rendered = helm_python.Chart.load(ROOT / "charts" / "kvpool").render(
        values, name="kvpool", namespace="kvpool-system"
    )
    pod = yaml.safe_load(rendered["kvpool/templates/tests/gateway-request.yaml"])
    script: str = pod["spec"]["containers"][0]["args"][0]
    return script


def fetch_template_labels(kube: KubeApi, deployment: str) -> dict[str, str]:
    """Pod-template labels of one Deployment ({} while it does not exist)."""
    path = f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/{deployment}"
    try:
        labels: dict[str, str] = kube.client.get(path)["spec"]["template"]["metadata"]["labels"]
    except KubeApiError as err:
        if err.status == 404:  # not created yet
            return {}
        raise
    return labels


def rollout_status(kube: KubeApi) -> dict[str, Any]:
    rollout: dict[str, Any] = (kube.client.get(POOL_PATH).get("status") or {}).get("rollout") or {}
    return rollout


def start_canary(kube: KubeApi, docs: list[dict[str, Any]], engine: VllmEngine) -> dict[str, str]:
    """A new revision of the pool (one more engine arg) whose canary is ``engine`` itself.

    Returns the canary Deployment's pod-template labels (its revision and track), which
    the canary's scrape target carries.
    """
    (pool,) = [d for d in docs if d["kind"] == "ModelPool"]
    args = [*pool["spec"]["engine"]["args"], "--seed=7"]
    kube.client.patch(
        POOL_PATH,
        {
            "metadata": {"annotations": {CANARY_STATIC_ENDPOINTS: f"canary-0={engine.base_url}"}},
            "spec": {"engine": {"args": args}},
        },
    )
    return wait_until(lambda: fetch_template_labels(kube, f"{POOL}-canary"), 30, "the canary")


def canary_scrape_target(address: str, template_labels: dict[str, str]) -> ScrapeTarget:
    """The canary's engine with the labels relabeling gives a canary pod's series."""
    (target,) = build_scrape_targets([address], template_labels)
    return ScrapeTarget(target.address, {**target.labels, "pod": "canary-0"})


def config_parses(kube: KubeApi) -> bool:
    try:
        return fetch_admission_config(kube) is not None
    except ValueError:  # pydantic's ValidationError: still the broken one
        return False


def json_patch_while(holding: threading.Event) -> Callable[[Any], bool]:
    """An API-emulator criterion: JSON patches (the operator's drift restoration) while
    ``holding`` is set."""

    def matches(request: Any) -> bool:
        headers = {k.lower(): v for k, v in request.headers.items()}
        return holding.is_set() and headers.get("content-type") == "application/json-patch+json"

    return matches


def run_helm_test(script: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", script],
        env={"PATH": os.environ["PATH"], **env},
        capture_output=True,
        text=True,
        check=False,
        timeout=90,
    )


def missing_data(prom: PrometheusServer, name: str, exprs: list[str]) -> list[str]:
    """Problems of one check: expressions without data, labels on none of their metrics."""
    problems = []
    for expr in exprs:
        try:
            prom.wait_for(expr, bool, timeout=20)
        except TimeoutError:
            problems.append(f"{name}: no data for {expr!r}")
            continue
        names = "|".join(sorted(metric_names(expr)))
        for label in sorted(labels_used(expr)):
            if not prom.query(f'count({{__name__=~"{names}", {label}!=""}})'):
                problems.append(f"{name}: no series of {names} has label {label!r}")
    return problems


def send_long_chats(
    gateway: str, key: str, count: int
) -> tuple[list[threading.Thread], list[tuple[int, str]]]:
    """``count`` long generations through the gateway, each on its own thread; the list
    fills with each one's (status, body), or (0, error) when the connection failed."""
    answers: list[tuple[int, str]] = []

    def send() -> None:
        try:
            answers.append(chat(gateway, key, max_tokens=480, ignore_eos=True, min_tokens=480))
        except OSError as exc:  # the client's own timeout or a refused connection
            answers.append((0, repr(exc)))

    threads = [threading.Thread(target=send) for _ in range(count)]
    for thread in threads:
        thread.start()
    return threads, answers


def kill_engine_mid_request(
    engine: VllmEngine, gateway: str, key: str, gateway_log: Path
) -> list[int]:
    """Three long generations through the gateway; the engine is killed while it runs them.

    A round the gateway answers 503 as a whole (say, both routes to the engine ejected for a
    health probe that a loaded machine answered late) is sent again once the gateway
    answers a short chat again; a round answered in full before a scrape of the engine saw
    it running (the tiny model generates 480 tokens in about a second, and a loaded
    machine answered the scrapes later than that once, in CI) is sent again too. Until
    the deadline: then the test fails with the answers and the gateway's log.
    """
    running = re.compile(r"^vllm:num_requests_running\{[^}]*\} [1-9]", flags=re.MULTILINE)
    deadline = time.monotonic() + 90
    while True:
        threads, answers = send_long_chats(gateway, key, 3)

        def engine_running(answers: list[tuple[int, str]] = answers) -> bool:
            if len(answers) == 3:
                raise StopWaitingError(f"every request answered before the engine ran: {answers}")
            return running.search(fetch(f"{engine.base_url}/metrics")) is not None

        try:
            wait_until(
                engine_running,
                max(1.0, deadline - time.monotonic()),
                "requests running on the engine",
                interval=0.01,
            )
        except StopWaitingError:
            if all(status == 503 for status, _ in answers) and time.monotonic() < deadline:
                wait_until(
                    lambda: chat(gateway, key, max_tokens=1)[0] == 200,
                    max(1.0, deadline - time.monotonic()),
                    "the gateway routing to the engine again after a round answered 503",
                    interval=0.5,
                )
                continue
            if all(status == 200 for status, _ in answers) and time.monotonic() < deadline:
                continue  # served before a scrape saw it running: no kill mid-request yet
            tail = gateway_log.read_text()[-4000:]
            raise AssertionError(f"no request reached the engine: {answers}\n{tail}") from None
        finally:
            if len(answers) < len(threads):  # some are in flight: kill the engine under them
                engine.process.kill()  # SIGKILL: on SIGTERM vLLM would finish them first
            for thread in threads:
                thread.join(timeout=60)
        return [status for status, _ in answers]


def assert_helm_test_passes(gateway: str, key: str) -> None:
    """The chart's helm-test script passes against the gateway, and fails on a bad key."""
    script = helm_test_script()
    passed = run_helm_test(script, {"GATEWAY_URL": gateway, "MODEL": POOL, "API_KEY": key})
    assert passed.returncode == 0, passed.stdout + passed.stderr
    assert " 200 " in passed.stdout
    assert run_helm_test(script, {"GATEWAY_URL": gateway}).returncode == 0  # readyz + 401
    wrong = run_helm_test(script, {"GATEWAY_URL": gateway, "MODEL": POOL, "API_KEY": "nope"})
    assert wrong.returncode == 1 and " 401 " in wrong.stdout


def refuse_one_publish(kube: KubeApi, operator: OperatorProcess, budget: str) -> None:
    """The API server refuses (403) the operator's next ConfigMap write, made for a budget
    change: the error is counted and the operator publishes again after it."""
    configmap_patches = kube.emulator["patch", kmock.resource("", "v1", "configmaps")]
    done = len(configmap_patches)  # kmock counts matching requests from the start
    configmap_patches[done : done + 1] << 403
    kube.client.patch(budget, {"spec": {"limits": [{"window": "1m", "tokens": 101}]}})
    wait_until(
        lambda: 'kvpool_operator_errors_total{stage="publish"}' in operator.metrics(),
        30,
        "the publish error counted",
    )
    wait_until(
        lambda: any(
            t.tenant == "tight" and [w.tokens for w in t.limits] == [101]
            for t in (fetch_admission_config(kube) or EMPTY).tenants
        ),
        30,
        "the operator publishing again after the error",
    )


def break_the_config_until_the_gateway_rejects_it(
    kube: KubeApi, gateway_metrics: str, budget: str
) -> None:
    """The admission ConfigMap is broken (the gateway rejects it, keeps the old one). The
    operator restores fields edited outside kvpool (a JSON patch) within a second, before
    the gateway's next poll (every 2 s) could see them: the API server refuses those
    restoring patches until the gateway has rejected the broken config; the next publish
    (a budget change) then restores it."""
    holding = threading.Event()
    holding.set()
    restoring = kube.emulator[
        "patch", kmock.resource("", "v1", "configmaps"), json_patch_while(holding)
    ]
    restoring << 403
    path = f"/api/v1/namespaces/{NAMESPACE}/configmaps/{CONFIGMAP_NAME}"
    kube.client.patch(path, {"data": {CONFIGMAP_KEY: "{not json"}})  # a merge patch
    wait_until(
        lambda: (
            'config_reloads_total{result="rejected"}' in fetch(f"http://{gateway_metrics}/metrics")
        ),
        30,
        "the gateway rejecting the broken config",
    )
    holding.clear()  # the next publish (a budget change) restores it
    kube.client.patch(budget, {"spec": {"limits": [{"window": "1m", "tokens": 102}]}})
    wait_until(lambda: config_parses(kube), 30, "the operator restoring the config")


def test_every_dashboard_and_alert_expression_returns_data(
    kube_api: KubeApi,
    tiny_model: Path,
    tmp_path: Path,
    prometheus_server: PrometheusFactory,
    redis_server: RedisFactory,
) -> None:
    checks = all_checks()
    with contextlib.ExitStack() as stack:
        kube = kube_api
        redis = redis_server()
        prom = prometheus_server()
        operator = stack.enter_context(
            run_operator(kube, tmp_path, prometheus_url=prom.url, interval="1s")
        )

        # Given the demo's policy, tenants and pool (no tokenizer: the byte fallback), a tight
        # tenant, one engine, the gateway, and Prometheus scraping all three
        engine_port = free_port()
        docs = build_local_manifests(load_manifests(), tiny_model, [engine_port])
        for doc in docs:
            if doc["kind"] == "ModelPool":
                doc["spec"]["model"].pop("tokenizerPath", None)
        manifests = write_manifests(docs + _tight_tenant(), tmp_path / "manifests.yaml")
        kube.kubectl("apply", "--validate=false", "-f", str(manifests))
        (engine,) = start_engines(stack, tiny_model, [engine_port], tmp_path)
        pod_labels = wait_until(lambda: fetch_engine_template_labels(kube), 30, "engine labels")
        gateway, gateway_metrics = stack.enter_context(gateway_process(kube, redis, tmp_path))
        targets = {
            "vllm": build_scrape_targets([engine.target], pod_labels),
            "kvpool-operator": [f"127.0.0.1:{operator.metrics_port}"],
            "kvpool-gateway": [gateway_metrics],  # the metrics port, not the API port
        }
        prom.set_targets(targets)
        wait_until(lambda: pool_when(kube, lambda p: measured(p, 1)), 90, "measured capacity")
        wait_until(lambda: published_config(kube, 1), 60, "the measured config")
        chat_key, batch_key = api_key(docs, CHAT_SECRET), api_key(docs, BATCH_SECRET)
        wait_until(lambda: chat(gateway, chat_key)[0] == 200, 60, "the gateway serving the pool")

        # When an engine arg of the pool changes: a canary of the new revision starts (the
        # same engine, scraped again with the canary's labels) and passes the KV gate
        canary_labels = start_canary(kube, docs, engine)
        targets["vllm-canary"] = [canary_scrape_target(engine.target, canary_labels)]
        prom.set_targets(targets)
        wait_until(
            lambda: rollout_status(kube).get("stage") == "Analyzing", 60, "the KV gate passed"
        )
        kv_gate = next(g for g in rollout_status(kube)["gates"] if g["gate"] == "kvCapacity")
        assert kv_gate["verdict"] == "Successful" and kv_gate["stable"] == kv_gate["canary"]

        # And tenants send requests in two tiers (streamed chats in the tier with a
        # ttftP95Target: the TTFT limiter decides every 10 samples), and one is over its budget
        for _ in range(12):
            status, text = chat(gateway, chat_key, stream=True)
            assert status == 200 and "data: [DONE]" in text, text
        for _ in range(2):
            status, text = completion(gateway, batch_key)
            assert status == 200, text
        status, text = completion(gateway, TIGHT_KEY, max_tokens=200)  # budget: 100 a minute
        assert status == 429, text

        # And the chart's helm-test script passes against this gateway (and fails on a bad key)
        assert_helm_test_passes(gateway, chat_key)

        # And the API server refuses (403: RBAC) the operator's next write of the admission
        # ConfigMap, which a budget change makes it publish: counted, then published again
        budget = f"/apis/kvpool.dev/v1alpha1/namespaces/{NAMESPACE}/tenantbudgets/tight"
        refuse_one_publish(kube, operator, budget)

        # And the admission ConfigMap is broken: the gateway rejects it (keeping the old
        # one), then the operator restores it
        break_the_config_until_the_gateway_rejects_it(kube, gateway_metrics, budget)

        # And Redis dies: interactive falls back to the local allowance, batch fails closed
        redis.stop()
        status, text = chat(gateway, chat_key)
        assert status == 200, text
        status, text = completion(gateway, batch_key)
        assert status == 503 and "budget_unavailable" in text, text

        # Then every expression (but those waiting for the engine to fail) returns data
        later = {name: exprs for name, exprs in checks.items() if name in AFTER_ENGINE_FAILURE}
        now = {n: e for n, e in checks.items() if n not in later}
        problems = [p for name, exprs in now.items() for p in missing_data(prom, name, exprs)]

        # When the engine dies in the middle of a generation
        answers = kill_engine_mid_request(engine, gateway, chat_key, tmp_path / "gateway.log")
        if 502 not in answers:
            problems.append(f"the requests the engine died in answered {answers}, expected 502")

        # Then the engine-failure expressions return data too
        problems += [p for name, exprs in later.items() for p in missing_data(prom, name, exprs)]
        assert problems == []
