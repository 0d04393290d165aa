#!/usr/bin/env bash
# kvpool end-to-end on a real (kind) cluster: build, install, apply, wait, call, assert,
# tear down. What it checks and what it needs: e2e/kind/README.md.
#
# Usage: e2e/kind/run.sh
# Environment:
#   KIND_CLUSTER=kvpool-e2e   cluster name (created, and deleted at the end)
#   KEEP_CLUSTER=1            leave the cluster up (for debugging)
#   REUSE_CLUSTER=1           use an existing cluster of that name instead of creating one
#   LOCAL_PORT=18080          local port for the gateway port-forward
#   POOL_TIMEOUT=15m          how long to wait for the ModelPool to be Ready
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
here="$repo/e2e/kind"
cluster="${KIND_CLUSTER:-kvpool-e2e}"
local_port="${LOCAL_PORT:-18080}"
pool_timeout="${POOL_TIMEOUT:-15m}"
pool_ns="llm"                  # the namespace of examples/*.yaml
system_ns="kvpool-system"      # the Helm release's namespace (operator)
kvpool_image="kvpool:e2e"
engine_image="kvpool-tiny-engine:e2e"
chat_key="replace-me-chat-product-key"  # examples/tenants.yaml, tenant chat-product
test_secret="helm-test-key"             # a copy of that key for `helm test` (release namespace)
release="kvpool"                        # Helm release; its objects are named kvpool-*

workdir="$(mktemp -d -t kvpool-kind-e2e.XXXXXX)"
port_forward_pid=""
metrics_forward_pid=""
created_cluster=0

log() { printf '\n==> %s\n' "$*"; }
fail() { printf 'FAIL: %s\n' "$*" >&2; exit 1; }

preflight() {
  local missing=()
  command -v docker >/dev/null 2>&1 || missing+=("docker (https://docs.docker.com/engine/install/)")
  command -v kind >/dev/null 2>&1 || missing+=("kind (https://kind.sigs.k8s.io/docs/user/quick-start/)")
  command -v helm >/dev/null 2>&1 || missing+=("helm (https://helm.sh/docs/intro/install/)")
  command -v kubectl >/dev/null 2>&1 || missing+=("kubectl (https://kubernetes.io/docs/tasks/tools/)")
  command -v curl >/dev/null 2>&1 || missing+=("curl")
  if ((${#missing[@]} > 0)); then
    printf 'e2e/kind/run.sh needs these tools on PATH:\n' >&2
    printf '  - %s\n' "${missing[@]}" >&2
    exit 2
  fi
  if ! docker info >/dev/null 2>&1; then
    printf 'e2e/kind/run.sh: docker is installed but no Docker engine answers (docker info failed).\n' >&2
    printf 'Start the Docker daemon (kind runs its nodes as containers), then run this again.\n' >&2
    exit 2
  fi
}

cleanup() {
  local status=$?
  local pid
  for pid in "$port_forward_pid" "$metrics_forward_pid"; do
    if [[ -n "$pid" ]]; then
      kill "$pid" 2>/dev/null || true
      wait "$pid" 2>/dev/null || true
    fi
  done
  if ((status != 0)) && ((created_cluster == 1 || ${REUSE_CLUSTER:-0} == 1)); then
    log "diagnostics (exit status $status)"
    kubectl get kvpool,pods,deploy,cm -A -o wide 2>&1 | tail -n 60 || true
    kubectl -n "$system_ns" logs deploy/kvpool-operator --tail=80 2>&1 || true
    kubectl -n "$system_ns" logs deploy/kvpool-gateway --tail=40 2>&1 || true
    kubectl -n "$pool_ns" describe modelpool tiny 2>&1 | tail -n 40 || true
  fi
  if ((created_cluster == 1)) && [[ "${KEEP_CLUSTER:-0}" != 1 ]]; then
    log "deleting kind cluster $cluster"
    kind delete cluster --name "$cluster" || true
  fi
  rm -rf "$workdir"
  exit "$status"
}

create_cluster() {
  if [[ "${REUSE_CLUSTER:-0}" == 1 ]]; then
    log "reusing kind cluster $cluster"
    kubectl config use-context "kind-$cluster" >/dev/null
    return
  fi
  log "creating kind cluster $cluster"
  kind create cluster --name "$cluster" --wait 180s
  created_cluster=1
}

build_images() {
  # `make image` (the repo's Dockerfile; .dockerignore keeps .venv and .cache out of the
  # context) and `make engine-image` (vLLM CPU + tiny model, from a small context).
  log "building $kvpool_image (repo Dockerfile) and $engine_image (vLLM CPU + tiny model)"
  make -C "$repo" image IMAGE="${kvpool_image%%:*}" IMAGE_TAG="${kvpool_image##*:}"
  make -C "$repo" engine-image ENGINE_IMAGE="$engine_image"
  log "loading the images into the kind nodes"
  kind load docker-image "$kvpool_image" "$engine_image" --name "$cluster"
}

install_prometheus() {
  log "installing Prometheus (kubernetes_sd with the relabeling kvpool expects)"
  kubectl apply -f "$here/prometheus.yaml"
  kubectl -n monitoring rollout status deploy/prometheus --timeout=5m
}

apply_examples() {
  log "installing the CRDs and applying the examples' policy and tenants plus the tiny pool"
  kubectl apply -f "$repo/charts/kvpool/crds/"
  kubectl wait --for=condition=Established --timeout=60s \
    crd/modelpools.kvpool.dev crd/tierpolicies.kvpool.dev crd/tenantbudgets.kvpool.dev
  kubectl create namespace "$pool_ns" --dry-run=client -o yaml | kubectl apply -f -
  kubectl apply -f "$repo/examples/tierpolicy.yaml" -f "$repo/examples/tenants.yaml" \
    -f "$here/modelpool-tiny.yaml"
}

install_chart() {
  log "installing the Helm chart charts/kvpool (operator + gateway)"
  # helm test's Pod runs in the release namespace: it reads the tenant's key from there
  kubectl create namespace "$system_ns" --dry-run=client -o yaml | kubectl apply -f -
  kubectl -n "$system_ns" create secret generic "$test_secret" --from-literal=api-key="$chat_key" \
    --dry-run=client -o yaml | kubectl apply -f -
  helm upgrade --install "$release" "$repo/charts/kvpool" \
    --namespace "$system_ns" --create-namespace \
    --set image.repository=kvpool --set image.tag=e2e --set image.pullPolicy=Never \
    --set operator.replicas=1 \
    --set operator.measureInterval=5s \
    --set operator.prometheusUrl=http://prometheus.monitoring.svc:9090 \
    --set gateway.replicas=1 \
    --set gateway.poolNamespace="$pool_ns" \
    --set helmTest.model=tiny \
    --set helmTest.apiKeySecret.name="$test_secret" \
    --set helmTest.apiKeySecret.key=api-key
  kubectl -n "$system_ns" rollout status deploy/kvpool-operator --timeout=5m
}

wait_for_pool() {
  log "waiting up to $pool_timeout for ModelPool $pool_ns/tiny to be Ready on measured capacity"
  kubectl -n "$pool_ns" wait --for=condition=Ready modelpool/tiny --timeout="$pool_timeout"
  local source tokens
  source="$(kubectl -n "$pool_ns" get modelpool tiny -o jsonpath='{.status.capacity.source}')"
  tokens="$(kubectl -n "$pool_ns" get modelpool tiny -o jsonpath='{.status.capacity.kvTokensPerReplica}')"
  [[ "$source" == "Measured" ]] || fail "capacity source is '$source', expected Measured"
  # 2 MiB of KV cache at 1 KiB a token: at most 2048 tokens, whatever the engine reserves.
  if ! [[ "$tokens" =~ ^[0-9]+$ ]] || ((tokens < 1 || tokens > 2048)); then
    fail "measured '$tokens' KV tokens per replica, expected 1..2048 (2 MiB / 1 KiB)"
  fi
  kubectl get kvpool -A
  kubectl -n "$pool_ns" get configmap kvpool-admission >/dev/null \
    || fail "the operator published no kvpool-admission ConfigMap"
  kubectl -n "$system_ns" rollout status deploy/kvpool-gateway --timeout=10m
}

helm_test() {
  log "helm test: the chart's test Pod sends a chat completion through the gateway Service"
  helm test "$release" --namespace "$system_ns" --logs --timeout 5m \
    || fail "helm test failed (the chart's request through the gateway Service)"
}

call_gateway() {
  log "port-forwarding the gateway to 127.0.0.1:$local_port and sending a request"
  # The Services' ports by name (whatever their numbers): kubectl forwards to the targetPort.
  # The API Service has the API port only; metrics have their own Service.
  local metrics_port=$((local_port + 1))
  kubectl -n "$system_ns" port-forward svc/kvpool-gateway "$local_port:http" \
    >"$workdir/port-forward.log" 2>&1 &
  port_forward_pid=$!
  kubectl -n "$system_ns" port-forward svc/kvpool-gateway-metrics "$metrics_port:metrics" \
    >"$workdir/port-forward-metrics.log" 2>&1 &
  metrics_forward_pid=$!
  local base="http://127.0.0.1:$local_port" attempt
  for attempt in $(seq 1 60); do
    if curl -fsS "$base/readyz" >/dev/null 2>&1; then break; fi
    ((attempt == 60)) && fail "gateway not ready through the port-forward: $(cat "$workdir/port-forward.log")"
    sleep 2
  done
  local status
  status="$(curl -sS -o "$workdir/answer.json" -w '%{http_code}' "$base/v1/chat/completions" \
    -H "Authorization: Bearer $chat_key" -H 'Content-Type: application/json' \
    -d '{"model": "tiny", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8}')"
  [[ "$status" == 200 ]] || fail "chat completion answered HTTP $status: $(cat "$workdir/answer.json")"
  grep -q '"choices"' "$workdir/answer.json" || fail "no choices in the answer: $(cat "$workdir/answer.json")"
  status="$(curl -sS -o /dev/null -w '%{http_code}' "$base/v1/chat/completions" \
    -H 'Authorization: Bearer not-a-tenant' -H 'Content-Type: application/json' \
    -d '{"model": "tiny", "messages": [{"role": "user", "content": "hello"}]}')"
  [[ "$status" == 401 ]] || fail "an unknown API key got HTTP $status, expected 401"
  curl -fsS "http://127.0.0.1:$metrics_port/metrics" >"$workdir/metrics.txt"
  grep -q 'kvpool_gateway_queue_seconds_count{pool="tiny",tier="interactive"}' "$workdir/metrics.txt" \
    || fail "the gateway's queue-time histogram has no interactive series for pool tiny"
  log "PASS: ModelPool Ready on measured capacity; the gateway admitted an interactive request"
}

main() {
  preflight
  trap cleanup EXIT
  create_cluster
  build_images
  install_prometheus
  apply_examples
  install_chart
  wait_for_pool
  helm_test
  call_gateway
}

main "$@"
