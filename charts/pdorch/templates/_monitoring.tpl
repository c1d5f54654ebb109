{{/* Monitoring: one ServiceMonitor per component, and the scrape jobs the alerts expect. */}}

{{/* The Service Prometheus scrapes a component through (the job label of its targets). */}}
{{- define "pdorch.metricsService" -}}
{{- $full := include "pdorch.fullname" .root }}
{{- if eq .component "router" }}{{ printf "%s-router-metrics" $full }}{{ else }}{{ printf "%s-%s" $full .component }}{{ end }}
{{- end }}

{{/* The components with a /metrics port Prometheus scrapes, as a JSON list. */}}
{{- define "pdorch.scrapedComponents" -}}
{{- $out := list "prefill" "decode" }}
{{- if .Values.config.router.metrics_port }}{{ $out = prepend $out "router" }}{{ end }}
{{- if .Values.master.enabled }}{{ $out = append $out "master" }}{{ end }}
{{- if .Values.planner.enabled }}{{ $out = append $out "planner" }}{{ end }}
{{- toJson $out }}
{{- end }}

{{/* (dict "root" $ "component" "prefill") */}}
{{- define "pdorch.serviceMonitor" -}}
{{- $m := .root.Values.monitoring.serviceMonitor }}
apiVersion: monitoring.coreos.com/v1
kind: ServiceMonitor
metadata:
  name: {{ include "pdorch.fullname" .root }}-{{ .component }}
  labels:
    {{- include "pdorch.labels" .root | nindent 4 }}
    app.kubernetes.io/component: {{ .component }}
    {{- with $m.labels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
spec:
  selector:
    matchLabels:
      {{- include "pdorch.selector" (dict "root" .root "component" .component) | nindent 6 }}
  namespaceSelector:
    matchNames: [{{ .root.Release.Namespace | quote }}]
  endpoints:
    - port: metrics
      path: /metrics
      interval: {{ $m.interval }}
{{- end }}
