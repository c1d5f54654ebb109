{{/*
What every pod of the chart shares: identity (a ServiceAccount without a token), security context,
scheduling, and where the model comes from.
*/}}

{{/*
Pod-level fields: (dict "root" $ "pool" .Values.router "component" "router"); with "serviceAccount" NAME
the pod runs as that account with its API token (the planner's kubernetes actuator, the only caller).
Topology spread constraints without a labelSelector get the component's own (with the release, so
two releases in one namespace do not count each other's pods); affinity is rendered with `tpl`,
so values may name the release ({{ .Release.Name }}).
*/}}
{{- define "pdorch.podCommon" -}}
{{- $root := .root }}
{{- $v := .pool }}
{{- if .serviceAccount }}
serviceAccountName: {{ .serviceAccount }}
automountServiceAccountToken: true
{{- else }}
serviceAccountName: {{ include "pdorch.serviceAccountName" $root }}
# NOTE: only the planner's kubernetes actuator calls the Kubernetes API: no token in the other pods.
automountServiceAccountToken: false
{{- end }}
{{- with $root.Values.podSecurityContext }}
securityContext:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $root.Values.imagePullSecrets }}
imagePullSecrets:
  {{- range . }}
  - name: {{ . }}
  {{- end }}
{{- end }}
terminationGracePeriodSeconds: {{ $v.terminationGracePeriodSeconds }}
{{- with $v.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with $v.runtimeClassName }}
runtimeClassName: {{ . }}
{{- end }}
{{- with $v.schedulerName }}
schedulerName: {{ . }}
{{- end }}
{{- with $v.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $v.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $v.affinity }}
affinity:
  {{- tpl (toYaml .) $root | nindent 2 }}
{{- end }}
{{- with $v.topologySpreadConstraints }}
topologySpreadConstraints:
  {{- range . }}
  {{- $c := deepCopy . }}
  {{- if not (hasKey $c "labelSelector") }}
  {{- $_ := set $c "labelSelector" (dict "matchLabels" (include "pdorch.selector" (dict "root" $root "component" $.component) | fromYaml)) }}
  {{- end }}
  - {{- toYaml $c | nindent 4 }}
  {{- end }}
{{- end }}
{{- end }}

{{/* A container's securityContext: (dict "root" $ "ipcLock" true) adds IPC_LOCK (RDMA pins memory). */}}
{{- define "pdorch.containerSecurity" -}}
{{- $sc := deepCopy .root.Values.securityContext }}
{{- if .ipcLock }}
{{- $caps := deepCopy (default (dict) $sc.capabilities) }}
{{- $_ := set $caps "add" (append (default (list) $caps.add) "IPC_LOCK" | uniq) }}
{{- $_ := set $sc "capabilities" $caps }}
{{- end }}
{{- toYaml $sc }}
{{- end }}

{{/* The pool's extra env sources, volumes, mounts and init containers (values, as given). */}}
{{- define "pdorch.envFrom" -}}
{{- with .envFrom }}
envFrom:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* ------------------------------------------------------------------------------ the model */}}

{{/* The HF model directory inside the pod (config.model.source when modelVolume.type is not image). */}}
{{- define "pdorch.modelDir" -}}
{{- $m := .Values.modelVolume }}
{{- if $m.subPath }}{{ printf "%s/%s" (trimSuffix "/" $m.mountPath) (trimPrefix "/" $m.subPath) }}{{ else }}{{ $m.mountPath }}{{ end }}
{{- end }}

{{/* Volumes for the model: the model itself and the writable cache `pdorch model prepare` fills (links and small files). */}}
{{- define "pdorch.modelVolumes" -}}
{{- $m := .Values.modelVolume }}
{{- if eq $m.type "pvc" }}
- name: model
  persistentVolumeClaim:
    claimName: {{ required "modelVolume.pvc.claimName: the PersistentVolumeClaim holding the model" $m.pvc.claimName }}
    readOnly: true
{{- else if eq $m.type "hostPath" }}
- name: model
  hostPath:
    path: {{ required "modelVolume.hostPath.path: the model directory on the node" $m.hostPath.path }}
    type: {{ $m.hostPath.type }}
{{- else if eq $m.type "initContainer" }}
- name: model
  emptyDir:
    sizeLimit: {{ $m.initContainer.sizeLimit }}
{{- end }}
{{- if ne $m.type "image" }}
- name: model-cache
  emptyDir:
    sizeLimit: 1Gi
{{- end }}
{{- end }}

{{- define "pdorch.modelMounts" -}}
{{- $m := .Values.modelVolume }}
{{- if ne $m.type "image" }}
- name: model
  mountPath: {{ $m.mountPath }}
  readOnly: {{ ne $m.type "initContainer" }}
- name: model-cache
  mountPath: /var/cache/pdorch/models
{{- end }}
{{- end }}

{{/*
The init container that fills the model volume (modelVolume.type initContainer), before the pod's
own: (dict "root" $ "part" "weights") for workers, "tokenizer" for the router (it reads only the
tokenizer files and config.json). MODEL_DIR is where the HF directory must end up.
*/}}
{{- define "pdorch.modelInitContainer" -}}
{{- $root := .root }}
{{- $m := $root.Values.modelVolume }}
{{- if eq $m.type "initContainer" }}
{{- $i := $m.initContainer }}
- name: model
  image: {{ required "modelVolume.initContainer.image: the image that downloads or copies the model" $i.image }}
  imagePullPolicy: {{ $root.Values.image.pullPolicy }}
  {{- with $i.command }}
  command:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $i.args }}
  args:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  env:
    - name: MODEL_DIR
      value: {{ include "pdorch.modelDir" $root }}
    - name: PDORCH_MODEL_PART
      value: {{ .part }}
    - name: HOME
      value: /tmp
    {{- with $i.env }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- with $i.envFrom }}
  envFrom:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $i.resources }}
  resources:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  securityContext:
    {{- include "pdorch.containerSecurity" (dict "root" $root) | nindent 4 }}
  volumeMounts:
    - name: model
      mountPath: {{ $m.mountPath }}
    - name: tmp
      mountPath: /tmp
{{- end }}
{{- end }}
