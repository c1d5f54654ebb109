{{/*
A prefill or decode worker Deployment: (dict "root" $ "role" "prefill").
Each pod advertises its own IP (downward API) to the store, the transfer engine and etcd;
the gRPC server listens on 0.0.0.0 and registers <pod IP>:<port> under its etcd lease.
*/}}
{{- define "pdorch.workerDeployment" -}}
{{- $root := .root }}
{{- $role := .role }}
{{- $v := index $root.Values $role }}
{{- $cfg := index $root.Values.config $role }}
{{- $res := deepCopy $v.resources }}
{{- $extra := dict }}
{{- if gt (int $v.gpus) 0 }}{{ $_ := set $extra "nvidia.com/gpu" (int $v.gpus) }}{{ end }}
{{- if $v.rdma.enabled }}{{ $_ := set $extra $v.rdma.resourceName (int $v.rdma.count) }}{{ end }}
{{- if $v.hugepages.enabled }}{{ $_ := set $extra (printf "hugepages-%s" $v.hugepages.pageSize) $v.hugepages.size }}{{ end }}
{{- if $extra }}
{{- $_ := set $res "limits" (merge (dict) (default (dict) $res.limits) $extra) }}
{{- $_ := set $res "requests" (merge (dict) (default (dict) $res.requests) $extra) }}
{{- end }}
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ include "pdorch.fullname" $root }}-{{ $role }}
  labels:
    {{- include "pdorch.labels" $root | nindent 4 }}
    app.kubernetes.io/component: {{ $role }}
spec:
  replicas: {{ $v.replicas }}
  selector:
    matchLabels:
      {{- include "pdorch.selector" (dict "root" $root "component" $role) | nindent 6 }}
  template:
    metadata:
      labels:
        {{- include "pdorch.labels" $root | nindent 8 }}
        app.kubernetes.io/component: {{ $role }}
      annotations:
        {{- include "pdorch.configChecksum" $root | nindent 8 }}
        {{- with $v.podAnnotations }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
    spec:
      {{- with $root.Values.imagePullSecrets }}
      imagePullSecrets:
        {{- range . }}
        - name: {{ . }}
        {{- end }}
      {{- end }}
      # A worker's shutdown unregisters from etcd and unmounts its store segment.
      terminationGracePeriodSeconds: 30
      containers:
        - name: {{ $role }}
          image: {{ include "pdorch.image" $root }}
          imagePullPolicy: {{ $root.Values.image.pullPolicy }}
          command: ["python", "-m", "{{ $role }}_node", "--config", "/etc/pdorch/config.yaml"]
          env:
            {{- include "pdorch.podEnv" $root | nindent 12 }}
            {{- include "pdorch.grpcEnv" $root | nindent 12 }}
            {{- with $v.extraEnv }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
          ports:
            - name: grpc
              containerPort: {{ $cfg.port }}
              protocol: TCP
            - name: metrics
              containerPort: {{ $cfg.metrics_port }}
              protocol: TCP
          # The gRPC port opens only after the model is loaded: startup covers the load,
          # liveness starts after it and cannot flap while a model loads.
          startupProbe:
            tcpSocket:
              port: grpc
            periodSeconds: 5
            failureThreshold: {{ div (int $v.startupSeconds) 5 | max 1 }}
          readinessProbe:
            tcpSocket:
              port: grpc
            periodSeconds: 5
            failureThreshold: 2
          livenessProbe:
            httpGet:
              path: /metrics
              port: metrics
            periodSeconds: 10
            timeoutSeconds: 5
            failureThreshold: 6
          resources:
            {{- toYaml $res | nindent 12 }}
          {{- if $v.rdma.enabled }}
          securityContext:
            capabilities:
              # RDMA registers (pins) the KV pool and store segment memory.
              add: ["IPC_LOCK"]
          {{- end }}
          volumeMounts:
            {{- include "pdorch.configMount" $root | nindent 12 }}
            {{- include "pdorch.tlsMount" $root | nindent 12 }}
            - name: shm
              mountPath: /dev/shm
            {{- if $v.hugepages.enabled }}
            - name: hugepages
              mountPath: /dev/hugepages
            {{- end }}
      volumes:
        {{- include "pdorch.configVolume" $root | nindent 8 }}
        {{- include "pdorch.tlsVolume" $root | nindent 8 }}
        - name: shm
          emptyDir:
            medium: Memory
            sizeLimit: {{ $v.shmSize }}
        {{- if $v.hugepages.enabled }}
        - name: hugepages
          emptyDir:
            medium: HugePages-{{ $v.hugepages.pageSize }}
        {{- end }}
      {{- with $v.nodeSelector }}
      nodeSelector:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $v.tolerations }}
      tolerations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $v.affinity }}
      affinity:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $v.topologySpreadConstraints }}
      topologySpreadConstraints:
        {{- toYaml . | nindent 8 }}
      {{- end }}
{{- end }}

{{/* A worker's headless Service (DNS per pod, scrape targets): (dict "root" $ "role" "prefill"). */}}
{{- define "pdorch.workerService" -}}
{{- $root := .root }}
{{- $cfg := index $root.Values.config .role }}
apiVersion: v1
kind: Service
metadata:
  name: {{ include "pdorch.fullname" $root }}-{{ .role }}
  labels:
    {{- include "pdorch.labels" $root | nindent 4 }}
    app.kubernetes.io/component: {{ .role }}
spec:
  clusterIP: None
  selector:
    {{- include "pdorch.selector" (dict "root" $root "component" .role) | nindent 4 }}
  ports:
    - name: grpc
      port: {{ $cfg.port }}
      targetPort: grpc
      protocol: TCP
    - name: metrics
      port: {{ $cfg.metrics_port }}
      targetPort: metrics
      protocol: TCP
{{- end }}
