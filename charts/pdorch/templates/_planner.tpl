{{/*
The planner (`pdorch planner`): one pod sizing the prefill and decode Deployments against
config.planner's SLOs from a measured profile. The chart gives it, on its command line (they win over
config.planner): the actuator, its metrics port, where the profile is mounted and, for the kubernetes
actuator, the namespace and the two Deployments it may scale.
*/}}

{{/* "true" when the planner runs with the kubernetes actuator (its ServiceAccount, Role, RoleBinding), else "". */}}
{{- define "pdorch.plannerKubernetes" -}}
{{- if and .Values.planner.enabled (eq .Values.planner.actuator "kubernetes") }}true{{ end }}
{{- end }}

{{/* "true" when the store-memory node runs (storeMemory.enabled; null: with the kubernetes actuator), else "". */}}
{{- define "pdorch.storeMemory" -}}
{{- $on := .Values.storeMemory.enabled }}
{{- if kindIs "invalid" $on }}{{ include "pdorch.plannerKubernetes" . }}{{ else if $on }}true{{ end }}
{{- end }}

{{- define "pdorch.plannerName" -}}
{{- printf "%s-planner" (include "pdorch.fullname" .) }}
{{- end }}

{{/* The Deployments the planner scales: the chart's own. */}}
{{- define "pdorch.plannerTargets" -}}
{{- $full := include "pdorch.fullname" . }}
{{- list (printf "%s-prefill" $full) (printf "%s-decode" $full) | toJson }}
{{- end }}

{{- define "pdorch.plannerProfileConfigMap" -}}
{{- $p := .Values.planner.profile }}
{{- if $p.existingConfigMap }}{{ $p.existingConfigMap }}{{ else }}{{ printf "%s-planner-profile" (include "pdorch.fullname" .) }}{{ end }}
{{- end }}

{{/* `pdorch planner`'s --set flags, as a JSON list; refuses a config.planner key set to something else. */}}
{{- define "pdorch.plannerSets" -}}
{{- $v := .Values.planner }}
{{- $sets := dict "actuator" $v.actuator "metrics_port" (int $v.metricsPort)
  "profile_path" (printf "/etc/pdorch-profile/%s" $v.profile.key) }}
{{- if eq $v.actuator "kubernetes" }}
{{- $targets := include "pdorch.plannerTargets" . | fromJsonArray }}
{{- $_ := set $sets "k8s_namespace" .Release.Namespace }}
{{- $_ := set $sets "k8s_prefill_deployment" (index $targets 0) }}
{{- $_ := set $sets "k8s_decode_deployment" (index $targets 1) }}
{{- end }}
{{- $given := default (dict) .Values.config.planner }}
{{- $out := list }}
{{- range $key := keys $sets | sortAlpha }}
{{- $value := get $sets $key }}
{{- if and (get $given $key) (ne (toString (get $given $key)) (toString $value)) }}  {{/* unset, "" or 0: the chart's */}}
{{- fail (printf "config.planner.%s (%v) differs from what the chart sets (%v): the chart derives it (planner.actuator, planner.metricsPort, planner.profile, the release's names); leave config.planner.%s unset" $key (get $given $key) $value $key) }}
{{- end }}
{{- $out = append $out (printf "planner.%s=%v" $key $value) }}
{{- end }}
{{- toJson $out }}
{{- end }}
