{{/*
A prefill or decode worker Deployment: (dict "root" $ "role" "prefill").
Each pod advertises its own IP (downward API) to the store, the transfer engine and etcd;
the gRPC server listens on 0.0.0.0 and registers <pod IP>:<port> under its etcd lease.
On SIGTERM it leaves etcd, drains (config.<role>.drain_timeout_s; a decode worker then hands the
streams left to the others), writes back the L1 pages the store lacks (config.<role>.drain_writeback_s)
and exits: terminationGracePeriodSeconds must cover that (pdorch/worker/drain.py, drain_budget_s).
*/}}
{{- define "pdorch.workerDeployment" -}}
{{- $root := .root }}
{{- $role := .role }}
{{- $v := index $root.Values $role }}
{{- $cfg := index (include "pdorch.config" $root | fromYaml) $role }}
{{- $drain := dig "drain_timeout_s" (ternary 30.0 10.0 (eq $role "decode")) $cfg }}
{{- $writeback := dig "drain_writeback_s" (ternary 5.0 10.0 (eq $role "decode")) $cfg }}
{{- $need := add (int (ceil $drain)) (int (ceil $writeback)) (ternary 20 5 (eq $role "decode")) }}
{{- if lt (int $v.terminationGracePeriodSeconds) $need }}
{{- fail (printf "%s.terminationGracePeriodSeconds (%d) must cover config.%s.drain_timeout_s (%v) plus config.%s.drain_writeback_s (%v) plus the hand-off and shutdown: at least %d" $role (int $v.terminationGracePeriodSeconds) $role $drain $role $writeback $need) }}
{{- end }}
{{- $res := deepCopy $v.resources }}
{{- $extra := dict }}
{{- if gt (int $v.gpus) 0 }}{{ $_ := set $extra "nvidia.com/gpu" (mul (int $v.gpus) (int (default 1 $v.tpSize))) }}{{ end }}
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
  {{- if and $root.Values.planner.enabled (eq $root.Values.planner.actuator "kubernetes") }}
  # The planner owns the replicas (it patches deployments/scale): rendering them here would reset its
  # choice on every `helm upgrade`. The Deployment starts at 1 and the planner sizes it from there.
  {{- else }}
  replicas: {{ $v.replicas }}
  {{- end }}
  strategy:
    {{- toYaml $v.strategy | nindent 4 }}
  selector:
    matchLabels:
      {{- include "pdorch.selector" (dict "root" $root "component" $role) | nindent 6 }}
  template:
    metadata:
      labels:
        {{- include "pdorch.labels" $root | nindent 8 }}
        app.kubernetes.io/component: {{ $role }}
      annotations:
        {{- include "pdorch.checksums" (dict "root" $root "component" $role) | nindent 8 }}
        {{- with $v.podAnnotations }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
    spec:
      {{- include "pdorch.podCommon" (dict "root" $root "pool" $v "component" $role) | nindent 6 }}
      {{- if or $v.initContainers (eq $root.Values.modelVolume.type "initContainer") }}
      initContainers:
        {{- include "pdorch.modelInitContainer" (dict "root" $root "part" "weights") | nindent 8 }}
        {{- with $v.initContainers }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      {{- end }}
      containers:
        - name: {{ $role }}
          image: {{ include "pdorch.image" $root }}
          imagePullPolicy: {{ $root.Values.image.pullPolicy }}
          command: ["python", "-m", "{{ $role }}_node", "--config", "/etc/pdorch/config.yaml"]
          env:
            {{- include "pdorch.podEnv" $root | nindent 12 }}
            {{- include "pdorch.grpcEnv" $root | nindent 12 }}
            {{- if not (dig "model" "torch_threads" 0 $root.Values.config) }}
            # torch threads = the CPUs the pod requested (rounded up), not the node's cores
            - name: PDORCH_MODEL_TORCH_THREADS
              valueFrom:
                resourceFieldRef:
                  containerName: {{ $role }}
                  resource: requests.cpu
                  divisor: "1"
            {{- end }}
            {{- if $v.hugepages.enabled }}
            # Mooncake allocates the store segment from huge pages only when told to
            - name: MC_STORE_USE_HUGEPAGE
              value: "1"
            - name: MC_STORE_HUGEPAGE_SIZE
              value: {{ ternary "1GB" "2MB" (eq $v.hugepages.pageSize "1Gi") }}
            {{- end }}
            {{- with $v.extraEnv }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
          {{- include "pdorch.envFrom" $v | nindent 10 }}
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
          securityContext:
            {{- include "pdorch.containerSecurity" (dict "root" $root "ipcLock" $v.rdma.enabled) | nindent 12 }}
          volumeMounts:
            {{- include "pdorch.configMount" $root | nindent 12 }}
            {{- include "pdorch.tlsMount" $root | nindent 12 }}
            {{- include "pdorch.modelMounts" $root | nindent 12 }}
            - name: shm
              mountPath: /dev/shm
            {{- if $v.hugepages.enabled }}
            - name: hugepages
              mountPath: /dev/hugepages
            {{- end }}
            {{- include "pdorch.ssdMount" (dict "root" $root "role" $role) | nindent 12 }}
            {{- with $v.extraVolumeMounts }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
      volumes:
        {{- include "pdorch.configVolume" $root | nindent 8 }}
        {{- include "pdorch.tlsVolume" $root | nindent 8 }}
        {{- include "pdorch.modelVolumes" $root | nindent 8 }}
        - name: shm
          emptyDir:
            medium: Memory
            sizeLimit: {{ $v.shmSize }}
        {{- if $v.hugepages.enabled }}
        - name: hugepages
          emptyDir:
            medium: HugePages-{{ $v.hugepages.pageSize }}
        {{- end }}
        {{- include "pdorch.ssdVolume" (dict "root" $root "role" $role) | nindent 8 }}
        {{- with $v.extraVolumes }}
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

{{/* A PodDisruptionBudget: (dict "root" $ "component" "prefill" "budget" (dict "maxUnavailable" 1)). */}}
{{- define "pdorch.pdb" -}}
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: {{ include "pdorch.fullname" .root }}-{{ .component }}
  labels:
    {{- include "pdorch.labels" .root | nindent 4 }}
    app.kubernetes.io/component: {{ .component }}
spec:
  {{- toYaml .budget | nindent 2 }}
  selector:
    matchLabels:
      {{- include "pdorch.selector" (dict "root" .root "component" .component) | nindent 6 }}
{{- end }}
