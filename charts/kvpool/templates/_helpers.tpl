{{- define "kvpool.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "kvpool.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "kvpool.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- /* The namespace of the ModelPools the gateway serves (its config is published there). */ -}}
{{- define "kvpool.poolNamespace" -}}
{{ .Values.gateway.poolNamespace | default .Release.Namespace }}
{{- end -}}

{{- /* "true" when the gateway keeps budgets in Redis (a Secret or a URL), else "". */ -}}
{{- define "kvpool.redisConfigured" -}}
{{- if or .Values.gateway.redis.existingSecret .Values.gateway.redis.url -}}true{{- end -}}
{{- end -}}

{{- /* Labels of the gateway's pods (the Service, PDB and spread constraints select them). */ -}}
{{- define "kvpool.gatewaySelector" -}}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: gateway
{{- end -}}

{{- /* Labels on Prometheus Operator objects: kvpool's plus monitoring.labels. */ -}}
{{- define "kvpool.monitoringLabels" -}}
{{ include "kvpool.labels" . }}
{{- with .Values.monitoring.labels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- /* Value combinations the schema cannot express: fail with the reason. */ -}}
{{- define "kvpool.validate" -}}
{{- $g := .Values.gateway -}}
{{- if $g.redisUrl -}}
{{- fail "gateway.redisUrl is gone (it put the Redis password into the Deployment's args): create a Secret holding the URL and set gateway.redis.existingSecret (and gateway.redis.existingSecretKey, default redis-url), or set gateway.redis.url for a Redis without a password" -}}
{{- end -}}
{{- if and $g.redis.existingSecret $g.redis.url -}}
{{- fail "set one of gateway.redis.existingSecret and gateway.redis.url, not both (the Secret is the place for a URL with a password)" -}}
{{- end -}}
{{- if and $g.enabled $g.autoscaling.enabled (not (include "kvpool.redisConfigured" .)) -}}
{{- fail "gateway.autoscaling needs Redis: without it each replica keeps its own budgets and admits the whole plan. Set gateway.redis.existingSecret (a Secret holding the Redis URL) or gateway.redis.url, or set gateway.autoscaling.enabled=false" -}}
{{- end -}}
{{- if and $g.enabled $g.autoscaling.enabled (lt (int $g.autoscaling.maxReplicas) (int $g.autoscaling.minReplicas)) -}}
{{- fail (printf "gateway.autoscaling.maxReplicas (%v) is below minReplicas (%v): set maxReplicas >= minReplicas" $g.autoscaling.maxReplicas $g.autoscaling.minReplicas) -}}
{{- end -}}
{{- if and $g.enabled $g.autoscaling.enabled (not $g.autoscaling.targetCPUUtilizationPercentage) (not $g.autoscaling.targetInFlightPerReplica) -}}
{{- fail "gateway.autoscaling has no metric: set targetCPUUtilizationPercentage and/or targetInFlightPerReplica" -}}
{{- end -}}
{{- if and $g.enabled (gt (int $g.replicas) 1) (not (include "kvpool.redisConfigured" .)) -}}
{{- fail (printf "gateway.replicas is %v but budgets are kept in memory: each replica would grant every tenant its whole budget. Set gateway.redis.existingSecret (a Secret holding the Redis URL) or gateway.redis.url, or set gateway.replicas=1" $g.replicas) -}}
{{- end -}}
{{- if and $g.ingress.enabled (not $g.ingress.hosts) -}}
{{- fail "gateway.ingress.enabled needs at least one entry in gateway.ingress.hosts (host and paths)" -}}
{{- end -}}
{{- if and $g.httpRoute.enabled (not $g.httpRoute.parentRefs) -}}
{{- fail "gateway.httpRoute.enabled needs gateway.httpRoute.parentRefs: the Gateway API gateway(s) the route attaches to, e.g. [{name: public, namespace: gateway-system}]" -}}
{{- end -}}
{{- if $g.enabled -}}
{{- if le (int $g.terminationGracePeriodSeconds) (add $g.preStopSleepSeconds $g.shutdownTimeoutSeconds | int) -}}
{{- fail (printf "gateway.terminationGracePeriodSeconds (%v) must exceed gateway.preStopSleepSeconds + gateway.shutdownTimeoutSeconds (%v), or the kubelet kills the gateway mid-drain: raise it to at least %v or lower one of the two" $g.terminationGracePeriodSeconds (add $g.preStopSleepSeconds $g.shutdownTimeoutSeconds) (add $g.preStopSleepSeconds $g.shutdownTimeoutSeconds 1)) -}}
{{- end -}}
{{- if and .Values.operator.watchNamespace (ne .Values.operator.watchNamespace (include "kvpool.poolNamespace" .)) -}}
{{- fail (printf "gateway.poolNamespace (%s) must equal operator.watchNamespace (%s): the operator publishes the gateway's config only in the namespace it watches. Set gateway.poolNamespace=%s, or operator.watchNamespace=\"\" to watch every namespace" (include "kvpool.poolNamespace" .) .Values.operator.watchNamespace .Values.operator.watchNamespace) -}}
{{- end -}}
{{- if and .Values.helmTest.model (not (and .Values.helmTest.apiKeySecret.name .Values.helmTest.apiKeySecret.key)) -}}
{{- fail "helmTest.model needs helmTest.apiKeySecret.name and helmTest.apiKeySecret.key: the Secret (in the release namespace) and key of a tenant's API key to call the model with" -}}
{{- end -}}
{{- end -}}
{{- end -}}
