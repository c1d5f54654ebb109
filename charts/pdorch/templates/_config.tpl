{{/*
The pdorch config every component mounts, and the checksums that roll a component's pods when what
it reads changes (and only then).
*/}}

{{/*
The pdorch config: values' `config`, then what only the chart knows (listen hosts, master and
etcd addresses, discovery, where a model volume is mounted). Secrets never go in here: pods read
them from env (the Secret).
*/}}
{{- define "pdorch.config" -}}
{{- $cfg := deepCopy .Values.config }}
{{- $derived := dict
  "prefill" (dict "host" "0.0.0.0" "tp_size" (int (default 1 .Values.prefill.tpSize)))
  "decode" (dict "host" "0.0.0.0" "tp_size" (int (default 1 .Values.decode.tpSize)))
  "router" (dict "host" "0.0.0.0" "api_key" "" "admin_key" "" "previous_api_key" "")
  "grpc" (dict "token" "" "previous_token" "")
  "discovery" (dict "mode" "etcd" "etcd_endpoints" (include "pdorch.etcdEndpoints" . | fromJsonArray)) }}
{{- if include "pdorch.masterHA" . }}
{{- $etcd := printf "etcd://%s" (include "pdorch.etcdEndpoints" . | fromJsonArray | join ";etcd://") }}
{{- $_ := set $derived "store" (dict
  "master_address" $etcd "metadata_server" $etcd
  "master_rpc_port" (int .Values.master.rpcPort) "master_metrics_port" (int .Values.master.metricsPort)) }}
{{- else if .Values.master.enabled }}
{{- $master := include "pdorch.masterHost" . }}
{{- $_ := set $derived "store" (dict
  "master_address" (printf "%s:%d" $master (int .Values.master.rpcPort))
  "metadata_server" (printf "http://%s:%d/metadata" $master (int .Values.master.metadataPort))
  "master_metrics_port" (int .Values.master.metricsPort)) }}
{{- end }}
{{- if ne .Values.modelVolume.type "image" }}
{{- $_ := set $derived "model" (dict "source" (include "pdorch.modelDir" .) "cache_dir" "/var/cache/pdorch/models") }}
{{- end }}
{{- if .Values.grpcTls.enabled }}
{{- $_ := set $derived.grpc "tls" true }}
{{- $_ := set $derived.grpc "tls_cert" "/etc/pdorch-tls/tls.crt" }}
{{- $_ := set $derived.grpc "tls_key" "/etc/pdorch-tls/tls.key" }}
{{- $_ := set $derived.grpc "tls_ca" "/etc/pdorch-tls/ca.crt" }}
{{- $_ := set $derived.grpc "tls_server_name" .Values.grpcTls.serverName }}
{{- end }}
{{- range $role := list "prefill" "decode" }}
{{- $set := int (dig $role "tp_size" 0 $cfg) }}
{{- $tp := int (default 1 (index $.Values $role).tpSize) }}
{{- if and $set (ne $set $tp) }}
{{- fail (printf "config.%s.tp_size (%d) differs from %s.tpSize (%d): set %s.tpSize only (it also sizes the pod's GPUs)" $role $set $role $tp $role) }}
{{- end }}
{{- end }}
{{- $cfg = mustMergeOverwrite $cfg $derived }}
{{- if include "pdorch.storeMemory" . }}
{{- /* NOTE: set after the merge: a merge does not overwrite with a zero */}}
{{- $store := default (dict) $cfg.store }}
{{- $_ := set $store "global_segment_size_mb" 0 }}
{{- $_ := set $cfg "store" $store }}
{{- end }}
{{- if and (or .Values.prefill.rdma.enabled .Values.decode.rdma.enabled) (ne (dig "store" "protocol" "tcp" $cfg) "rdma") }}
{{- fail "prefill/decode.rdma.enabled needs config.store.protocol: rdma (and config.store.device_name)" }}
{{- end }}
{{- toYaml $cfg }}
{{- end }}

{{/*
What a component reads of the config, as JSON: (dict "root" $ "component" "router").

    master   store.enabled, store.metadata_server, store.master_* (its flags and ports), store.ssd_path
             (set, it turns the master's offload on)
    prefill  model, prefill, discovery, grpc, observability, store but mooncake_master's own flags and the
             node's segment
    decode   model, decode, discovery, grpc, observability, store but mooncake_master's own flags and the
             node's segment
    router   model, router, discovery, grpc, observability, store.enabled and where the store is (POST
             /flush_cache?store=true), decode.offload_generated_kv (mid-stream failover's `auto`)
    planner  all of it (it reads the router's and the workers' metrics and sizes both roles)
    store-memory  store: where the master and metadata are, protocol, device_name, memory_node_segment_mb
NOTE: a key a component starts reading must be added here, or changing it will not roll that
component (tests/unit/test_chart_rollouts.py renders each key's change).
*/}}
{{- define "pdorch.configFor" -}}
{{- $cfg := include "pdorch.config" .root | fromYaml }}
{{- $store := default (dict) $cfg.store }}
{{- $masterFlags := list "master_eviction_high_watermark" "master_eviction_ratio" "master_kv_lease_ttl_ms" "master_client_ttl_s" "master_enable_offload" "master_rpc_port" }}
{{- $out := dict }}
{{- if eq .component "master" }}
{{- $s := dict }}
{{- range $k, $v := $store }}
{{- if or (hasPrefix "master_" $k) (has $k (list "enabled" "metadata_server" "ssd_path")) }}{{ $_ := set $s $k $v }}{{ end }}
{{- end }}
{{- $_ := set $out "store" $s }}
{{- else if eq .component "planner" }}
{{- $out = $cfg }}
{{- else if eq .component "store-memory" }}
{{- $_ := set $out "store" (pick $store "enabled" "master_address" "metadata_server" "protocol" "device_name"
  "memory_node_segment_mb") }}
{{- else if eq .component "router" }}
{{- $out = pick $cfg "model" "router" "discovery" "grpc" "observability" }}
{{- $_ := set $out "store" (pick $store "enabled" "master_address" "metadata_server" "protocol" "device_name") }}
{{- $_ := set $out "decode" (pick (default (dict) $cfg.decode) "offload_generated_kv") }}
{{- else }}
{{- $out = pick $cfg "model" .component "discovery" "grpc" "observability" }}
{{- $s := dict }}
{{- range $k, $v := $store }}{{ if not (has $k (append $masterFlags "memory_node_segment_mb")) }}{{ $_ := set $s $k $v }}{{ end }}{{ end }}
{{- $_ := set $out "store" $s }}
{{- end }}
{{- toJson $out }}
{{- end }}

{{/* Secret key -> value, of the chart's Secret or (at install/upgrade, where `lookup` sees the cluster) of auth.existingSecret. */}}
{{- define "pdorch.secretData" -}}
{{- if .Values.auth.existingSecret }}
{{- $found := lookup "v1" "Secret" .Release.Namespace .Values.auth.existingSecret }}
{{- toJson (default (dict) (get (default (dict) $found) "data")) }}
{{- else }}
{{- $a := .Values.auth }}
{{- toJson (dict "api-key" $a.apiKey "admin-key" $a.adminKey "api-key-previous" $a.previousApiKey
  "grpc-token" $a.grpcToken "grpc-token-previous" $a.grpcPreviousToken) }}
{{- end }}
{{- end }}

{{/*
Pod annotations that roll a component's pods when what it reads changes: its config sections
(pdorch.configFor) and the Secret keys it uses. (dict "root" $ "component" "router")
*/}}
{{- define "pdorch.checksums" -}}
{{- $keys := dict "router" (list "api-key" "admin-key" "api-key-previous" "grpc-token" "grpc-token-previous")
  "prefill" (list "grpc-token" "grpc-token-previous") "decode" (list "grpc-token" "grpc-token-previous") }}
{{- $data := include "pdorch.secretData" .root | fromJson }}
checksum/config: {{ include "pdorch.configFor" . | sha256sum }}
{{- with get $keys .component }}
{{- $used := dict }}
{{- range . }}{{ $_ := set $used . (get $data .) }}{{ end }}
checksum/secret: {{ $used | toJson | sha256sum }}
{{- end }}
{{- end }}
