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

{{- define "kvpool.poolNamespace" -}}
{{ .Values.gateway.poolNamespace | default .Release.Namespace }}
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
{{- if $g.enabled -}}
{{- if le (int $g.terminationGracePeriodSeconds) (add $g.preStopSleepSeconds $g.shutdownTimeoutSeconds | int) -}}
{{- fail (printf "gateway.terminationGracePeriodSeconds (%v) must exceed gateway.preStopSleepSeconds + gateway.shutdownTimeoutSeconds (%v): the kubelet would kill the gateway mid-drain" $g.terminationGracePeriodSeconds (add $g.preStopSleepSeconds $g.shutdownTimeoutSeconds)) -}}
{{- end -}}
{{- if and .Values.operator.watchNamespace (ne .Values.operator.watchNamespace (include "kvpool.poolNamespace" .)) -}}
{{- fail (printf "gateway.poolNamespace (%s) must equal operator.watchNamespace (%s): the operator publishes the gateway's config only in the namespace it watches" (include "kvpool.poolNamespace" .) .Values.operator.watchNamespace) -}}
{{- end -}}
{{- if and .Values.helmTest.model (not (and .Values.helmTest.apiKeySecret.name .Values.helmTest.apiKeySecret.key)) -}}
{{- fail "helmTest.model needs helmTest.apiKeySecret.name and .key (a tenant's API key)" -}}
{{- end -}}
{{- end -}}
{{- end -}}
