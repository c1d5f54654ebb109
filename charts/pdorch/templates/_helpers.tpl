{{/* Names, labels and the pdorch config every component mounts. */}}

{{- define "pdorch.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "pdorch.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else if contains (include "pdorch.name" .) .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name (include "pdorch.name" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{/* Labels of every object; "pdorch.selector" with a component adds app.kubernetes.io/component. */}}
{{- define "pdorch.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "pdorch.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* (dict "root" $ "component" "router") */}}
{{- define "pdorch.selector" -}}
app.kubernetes.io/name: {{ include "pdorch.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "pdorch.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{- define "pdorch.secretName" -}}
{{- default (printf "%s-keys" (include "pdorch.fullname" .)) .Values.auth.existingSecret }}
{{- end }}

{{- define "pdorch.masterHost" -}}
{{- printf "%s-master" (include "pdorch.fullname" .) }}
{{- end }}

{{/* etcd client endpoints host:port, as a list. */}}
{{- define "pdorch.etcdEndpoints" -}}
{{- if .Values.etcd.enabled }}
{{- list (printf "%s-etcd:%d" (include "pdorch.fullname" .) (int .Values.etcd.clientPort)) | toJson }}
{{- else }}
{{- required "etcd.externalEndpoints: give at least one host:port when etcd.enabled is false" .Values.etcd.externalEndpoints | toJson }}
{{- end }}
{{- end }}

{{/*
The pdorch config: values' `config`, then what only the chart knows (listen hosts, master and
etcd addresses, discovery). Secrets never go in here: the router reads them from env.
*/}}
{{- define "pdorch.config" -}}
{{- $cfg := deepCopy .Values.config }}
{{- $derived := dict
  "prefill" (dict "host" "0.0.0.0")
  "decode" (dict "host" "0.0.0.0")
  "router" (dict "host" "0.0.0.0" "api_key" "" "admin_key" "")
  "grpc" (dict "token" "")
  "discovery" (dict "mode" "etcd" "etcd_endpoints" (include "pdorch.etcdEndpoints" . | fromJsonArray)) }}
{{- if .Values.master.enabled }}
{{- $master := include "pdorch.masterHost" . }}
{{- $_ := set $derived "store" (dict
  "master_address" (printf "%s:%d" $master (int .Values.master.rpcPort))
  "metadata_server" (printf "http://%s:%d/metadata" $master (int .Values.master.metadataPort))
  "master_metrics_port" (int .Values.master.metricsPort)) }}
{{- end }}
{{- if .Values.grpcTls.enabled }}
{{- $_ := set $derived.grpc "tls" true }}
{{- $_ := set $derived.grpc "tls_cert" "/etc/pdorch-tls/tls.crt" }}
{{- $_ := set $derived.grpc "tls_key" "/etc/pdorch-tls/tls.key" }}
{{- $_ := set $derived.grpc "tls_ca" "/etc/pdorch-tls/ca.crt" }}
{{- $_ := set $derived.grpc "tls_server_name" .Values.grpcTls.serverName }}
{{- end }}
{{- $cfg = mustMergeOverwrite $cfg $derived }}
{{- if and (or .Values.prefill.rdma.enabled .Values.decode.rdma.enabled) (ne (dig "store" "protocol" "tcp" $cfg) "rdma") }}
{{- fail "prefill/decode.rdma.enabled needs config.store.protocol: rdma (and config.store.device_name)" }}
{{- end }}
{{- toYaml $cfg }}
{{- end }}

{{/* Env of every pdorch container: the pod IP it advertises to the store, transfer engine and etcd. */}}
{{- define "pdorch.podEnv" -}}
- name: POD_IP
  valueFrom:
    fieldRef:
      fieldPath: status.podIP
- name: PDORCH_STORE_LOCAL_HOSTNAME
  valueFrom:
    fieldRef:
      fieldPath: status.podIP
{{- end }}

{{/* Pod annotations that roll the pods when the config changes. */}}
{{- define "pdorch.configChecksum" -}}
checksum/config: {{ include "pdorch.config" . | sha256sum }}
{{- end }}

{{- define "pdorch.configVolume" -}}
- name: config
  configMap:
    name: {{ include "pdorch.fullname" . }}-config
{{- end }}

{{- define "pdorch.configMount" -}}
- name: config
  mountPath: /etc/pdorch
  readOnly: true
{{- end }}

{{/* NetworkPolicy peer: any pod of this release. */}}
{{- define "pdorch.releasePeer" -}}
- podSelector:
    matchLabels:
      app.kubernetes.io/name: {{ include "pdorch.name" . }}
      app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Router and workers: the worker gRPC token from the Secret, and the TLS files when enabled. */}}
{{- define "pdorch.grpcEnv" -}}
- name: PDORCH_GRPC_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ include "pdorch.secretName" . }}
      key: grpc-token
{{- end }}

{{- define "pdorch.tlsMount" -}}
{{- if .Values.grpcTls.enabled }}
- name: grpc-tls
  mountPath: /etc/pdorch-tls
  readOnly: true
{{- end }}
{{- end }}

{{- define "pdorch.tlsVolume" -}}
{{- if .Values.grpcTls.enabled }}
- name: grpc-tls
  secret:
    secretName: {{ required "grpcTls.secretName: the Secret with tls.crt, tls.key and ca.crt" .Values.grpcTls.secretName }}
{{- end }}
{{- end }}
