{{/* Names, labels, images, and the pieces every container shares. The config: _config.tpl. */}}

{{- define "pdorch.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
NOTE: 42 characters, not 63: objects append up to 14 ("-etcd-headless", "-router-metrics") and a
StatefulSet's name must leave 11 for its pods' controller-revision-hash label (63 in all).
*/}}
{{- define "pdorch.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 42 | trimSuffix "-" }}
{{- else if contains (include "pdorch.name" .) .Release.Name }}
{{- .Release.Name | trunc 42 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name (include "pdorch.name" .) | trunc 42 | trimSuffix "-" }}
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

{{/* The workers' image (torch, the model). */}}
{{- define "pdorch.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* Router, master and etcd: the torch-free build when image.slimTag is set, else the workers' image. */}}
{{- define "pdorch.slimImage" -}}
{{- if .Values.image.slimTag }}
{{- printf "%s:%s" .Values.image.repository .Values.image.slimTag }}
{{- else }}
{{- include "pdorch.image" . }}
{{- end }}
{{- end }}

{{- define "pdorch.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "pdorch.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "pdorch.secretName" -}}
{{- default (printf "%s-keys" (include "pdorch.fullname" .)) .Values.auth.existingSecret }}
{{- end }}

{{/*
"true" when the chart runs mooncake_masters in HA mode (master.replicas 2+), else "". Refuses a
replica count below 1 and HA without an etcd to elect the leader in, naming the keys.
*/}}
{{- define "pdorch.masterHA" -}}
{{- $n := int .Values.master.replicas }}
{{- if lt $n 1 }}{{ fail (printf "master.replicas: expected 1 (one master) or 2+ (HA masters), got %d" $n) }}{{ end }}
{{- if and .Values.master.enabled (ge $n 2) }}
{{- if not (or .Values.etcd.enabled .Values.etcd.externalEndpoints) }}
{{- fail "master.replicas >= 2 (HA masters) elect their leader in etcd: set etcd.enabled or etcd.externalEndpoints" }}
{{- end }}
{{- print "true" }}
{{- end }}
{{- end }}

{{- define "pdorch.masterHost" -}}
{{- printf "%s-master" (include "pdorch.fullname" .) }}
{{- end }}

{{/*
The chart's etcd members: etcd.replicas, or with 0 (the default) 3 when HA masters keep their leader
and oplog in it (master.replicas 2+), else 1. HA masters on a 1-member etcd are refused unless
etcd.allowSingleMember: one etcd pod lost would stop every election and the oplog with it.
*/}}
{{- define "pdorch.etcdReplicas" -}}
{{- $n := int .Values.etcd.replicas }}
{{- $ha := include "pdorch.masterHA" . }}
{{- if eq $n 0 }}{{ $n = ternary 3 1 (eq $ha "true") }}{{ end }}
{{- if and (eq $ha "true") .Values.etcd.enabled (eq $n 1) (not .Values.etcd.allowSingleMember) }}
{{- fail (printf "master.replicas: %d (HA masters) with etcd.replicas: 1: the masters' election and oplog would stop with that one etcd pod; set etcd.replicas: 3 (or 0, the default: 3 with HA masters), or etcd.allowSingleMember: true to accept it" (int .Values.master.replicas)) }}
{{- end }}
{{- $n }}
{{- end }}

{{/* "true" when the etcd members keep their data on a PersistentVolumeClaim: etcd.persistence.enabled,
or when it is empty (the default), with more than one member (a member must find its data dir again to
rejoin). */}}
{{- define "pdorch.etcdPersistent" -}}
{{- $set := .Values.etcd.persistence.enabled }}
{{- if kindIs "invalid" $set }}{{ $set = gt (int (include "pdorch.etcdReplicas" .)) 1 }}{{ end }}
{{- if $set }}{{ print "true" }}{{ end }}
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
Env of every pdorch container: the pod IP it advertises to the store, transfer engine and etcd;
HOME on the writable /tmp (the root filesystem is read-only).
*/}}
{{- define "pdorch.podEnv" -}}
- name: POD_IP
  valueFrom:
    fieldRef:
      fieldPath: status.podIP
- name: PDORCH_STORE_LOCAL_HOSTNAME
  valueFrom:
    fieldRef:
      fieldPath: status.podIP
- name: HOME
  value: /tmp
{{- end }}

{{- define "pdorch.configVolume" -}}
- name: config
  configMap:
    name: {{ include "pdorch.fullname" . }}-config
- name: tmp
  emptyDir:
    sizeLimit: 1Gi
{{- end }}

{{/* The ConfigMap, and /tmp: the only places a container without a volume of its own writes. */}}
{{- define "pdorch.configMount" -}}
- name: config
  mountPath: /etc/pdorch
  readOnly: true
- name: tmp
  mountPath: /tmp
{{- end }}

{{/* NetworkPolicy peer: any pod of this release. */}}
{{- define "pdorch.releasePeer" -}}
- podSelector:
    matchLabels:
      app.kubernetes.io/name: {{ include "pdorch.name" . }}
      app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/*
Router and workers: the worker gRPC token from the Secret (and the previous one during a rotation;
optional, so an existingSecret without the key works), and the TLS files when enabled.
*/}}
{{- define "pdorch.grpcEnv" -}}
- name: PDORCH_GRPC_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ include "pdorch.secretName" . }}
      key: grpc-token
- name: PDORCH_GRPC_PREVIOUS_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ include "pdorch.secretName" . }}
      key: grpc-token-previous
      optional: true
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
