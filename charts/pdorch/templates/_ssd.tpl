{{/*
The SSD tier's volume of a worker pool (docs/operations.md, "The SSD tier on Kubernetes"). With
config.store.ssd_path set, <role>.ssdVolume is mounted there (an emptyDir when its type is empty) and
each worker writes under <ssd_path>/<worker id>; without it, no volume. A mount of the pool's own
(extraVolumeMounts) at ssd_path takes the chart's place, e.g. a generic ephemeral volume.
A relative or `..` ssd_path never gets here: the schema refuses it (config.store.ssd_path).
*/}}

{{/* The SSD tier's directory in the pods ("" = the tier is off): (dict "root" $ "role" "prefill"). */}}
{{- define "pdorch.ssdPath" -}}
{{- $store := default (dict) (include "pdorch.config" .root | fromYaml).store }}
{{- $path := default "" $store.ssd_path }}
{{- $own := false }}
{{- range (index .root.Values .role).extraVolumeMounts }}{{ if eq (trimSuffix "/" .mountPath) (trimSuffix "/" $path) }}{{ $own = true }}{{ end }}{{ end }}
{{- if not $own }}{{ $path }}{{ end }}
{{- end }}

{{/* The SSD volume, a list item of the pod's volumes (or nothing): (dict "root" $ "role" "prefill"). */}}
{{- define "pdorch.ssdVolume" -}}
{{- $role := .role }}
{{- $v := (index .root.Values $role).ssdVolume }}
{{- $store := default (dict) (include "pdorch.config" .root | fromYaml).store }}
{{- if and $v.type (not $store.ssd_path) }}
{{- fail (printf "%s.ssdVolume.type is %s but config.store.ssd_path is empty: set config.store.ssd_path (an absolute path, where the volume is mounted) or remove %s.ssdVolume.type" $role $v.type $role) }}
{{- end }}
{{- if include "pdorch.ssdPath" . }}
{{- $type := default "emptyDir" $v.type }}
- name: ssd
{{- if eq $type "emptyDir" }}
  {{- include "pdorch.ssdSizeChecks" . }}
  {{- $fields := dict }}
  {{- with $v.emptyDir.sizeLimit }}{{ $_ := set $fields "sizeLimit" . }}{{ end }}
  {{- with $v.emptyDir.medium }}{{ $_ := set $fields "medium" . }}{{ end }}
  emptyDir: {{ toJson $fields }}
{{- else if eq $type "hostPath" }}
  hostPath:
    path: {{ required (printf "%s.ssdVolume.hostPath.path: the SSD tier's directory on the node" $role) $v.hostPath.path }}
    type: {{ $v.hostPath.type }}
{{- else }}
  persistentVolumeClaim:
    claimName: {{ required (printf "%s.ssdVolume.pvc.claimName: an existing PersistentVolumeClaim for the SSD tier" $role) $v.pvc.claimName }}
{{- end }}
{{- end }}
{{- end }}

{{/* The SSD volume's mount in the worker container (or nothing): (dict "root" $ "role" "prefill"). */}}
{{- define "pdorch.ssdMount" -}}
{{- with include "pdorch.ssdPath" . }}
- name: ssd
  mountPath: {{ . }}
{{- end }}
{{- end }}

{{/*
An emptyDir's sizeLimit against what it must hold and where it must fit (renders nothing). NOTE: the
kubelet evicts the pod when the directory outgrows sizeLimit, and Mooncake 0.3.13 does not keep its
files under store.ssd_capacity_gb (docs/workers.md), so a smaller sizeLimit evicts the pod; on the
node's disk the emptyDir counts in the pod's ephemeral-storage limit, which evicts it first.
*/}}
{{- define "pdorch.ssdSizeChecks" -}}
{{- $role := .role }}
{{- $pool := index .root.Values $role }}
{{- $e := $pool.ssdVolume.emptyDir }}
{{- $store := default (dict) (include "pdorch.config" .root | fromYaml).store }}
{{- if $e.sizeLimit }}
{{- $key := printf "%s.ssdVolume.emptyDir.sizeLimit" $role }}
{{- $size := include "pdorch.quantityBytes" (dict "value" $e.sizeLimit "key" $key) | float64 }}
{{- $gib := float64 (default 0 $store.ssd_capacity_gb) }}
{{- if lt $size (mulf $gib 1073741824.0) }}
{{- fail (printf "%s (%v) is smaller than config.store.ssd_capacity_gb (%v GiB): the kubelet would evict the pod before the tier is full (Mooncake 0.3.13 does not hold the files to the capacity); raise %s or lower config.store.ssd_capacity_gb" $key $e.sizeLimit $gib $key) }}
{{- end }}
{{- $limit := dig "limits" "ephemeral-storage" "" (default (dict) $pool.resources) }}
{{- if and $limit (ne $e.medium "Memory") }}
{{- $limitKey := printf "%s.resources.limits.ephemeral-storage" $role }}
{{- if gt $size (include "pdorch.quantityBytes" (dict "value" $limit "key" $limitKey) | float64) }}
{{- fail (printf "%s (%v) is larger than %s (%v): the emptyDir counts in the pod's ephemeral storage, so the kubelet would evict the pod first; raise %s" $key $e.sizeLimit $limitKey $limit $limitKey) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/*
A Kubernetes quantity ("64Gi", "500M", or a number of bytes) in bytes, as a float: (dict "value" q "key" "its values key").
Exponent forms (1e9) are not read: the schema refuses them for sizeLimit, and a limit written so is named.
*/}}
{{- define "pdorch.quantityBytes" -}}
{{- if not (kindIs "string" .value) }}
{{- float64 .value }}
{{- else }}
{{- $q := .value }}
{{- $num := regexFind "^[0-9]+(\\.[0-9]+)?" $q }}
{{- $suffix := trimPrefix $num $q }}
{{- $scale := dict "" 1.0 "k" 1000.0 "M" 1000000.0 "G" 1000000000.0 "T" 1000000000000.0
  "P" 1000000000000000.0 "E" 1000000000000000000.0 "Ki" 1024.0 "Mi" 1048576.0 "Gi" 1073741824.0
  "Ti" 1099511627776.0 "Pi" 1125899906842624.0 "Ei" 1152921504606846976.0 }}
{{- if or (not $num) (not (hasKey $scale $suffix)) }}
{{- fail (printf "%s: %q is not a quantity the chart can compare (digits, then one of Ki Mi Gi Ti Pi Ei k M G T P E, or none)" .key $q) }}
{{- end }}
{{- mulf (float64 $num) (get $scale $suffix) }}
{{- end }}
{{- end }}
