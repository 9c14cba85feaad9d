{{/*
The worker pools. With disaggregation.enabled the chart runs two: the workers ("worker",
worker.*: adapters, role prefill) and the decode workers ("decode-worker", decodeWorker.*:
the base model only, role decode). Both Deployments, headless Services and autoscalers come
from the templates below. A decode pod is a worker pod without adapters: the same image,
model (and model download), GPU, probes, security contexts, drain timing and pod extras; its
size, scaling, placement, service account, vLLM flags (extraArgs) and environment are
decodeWorker's own.
*/}}

{{/* The pool a component's values and labels belong to: (dict "root" $ "pool" "decode"). */}}
{{- define "preft-serve.poolComponent" -}}
{{- if eq .pool "decode" }}decode-worker{{ else }}worker{{ end -}}
{{- end -}}

{{/* The worker's role: unified (default), or prefill and decode with disaggregation. */}}
{{- define "preft-serve.workerRole" -}}
{{- if not .root.Values.disaggregation.enabled -}}
unified
{{- else if eq .pool "decode" -}}
decode
{{- else -}}
prefill
{{- end -}}
{{- end -}}

{{/* The decode workers' headless Service (the gateway's second discovery source). */}}
{{- define "preft-serve.decodeWorkerService" -}}
{{- include "preft-serve.componentName" (dict "root" . "component" "decode-worker") -}}
{{- end -}}

{{- define "preft-serve.decodeWorkerDnsName" -}}
{{- printf "%s.%s.svc.%s" (include "preft-serve.decodeWorkerService" .) .Release.Namespace .Values.clusterDomain -}}
{{- end -}}

{{/*
A worker pool's Deployment. (dict "root" $ "pool" "worker") or (dict "root" $ "pool" "decode")
*/}}
{{- define "preft-serve.workerDeployment" -}}
{{- $root := .root -}}
{{- $decode := eq .pool "decode" -}}
{{- $component := include "preft-serve.poolComponent" . -}}
{{- $ctx := dict "root" $root "component" $component "values" (ternary "decodeWorker" "worker" $decode) -}}
{{- $role := include "preft-serve.workerRole" . -}}
{{- $w := $root.Values.worker -}}
{{- /* What each pool sets for itself: size, scaling, placement and extras. */ -}}
{{- $p := ternary $root.Values.decodeWorker $w $decode -}}
{{- $d := $root.Values.disaggregation -}}
{{- $os := $root.Values.objectStore -}}
{{- $gpu := eq $w.device "gpu" -}}
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ include "preft-serve.componentName" $ctx }}
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "preft-serve.labels" $ctx | nindent 4 }}
spec:
  {{- if not $p.autoscaling.enabled }}
  replicas: {{ $p.replicas }}
  {{- end }}
  revisionHistoryLimit: 5
  strategy:
    {{- toYaml $w.strategy | nindent 4 }}
  selector:
    matchLabels:
      {{- include "preft-serve.selectorLabels" $ctx | nindent 6 }}
  template:
    metadata:
      labels:
        {{- include "preft-serve.labels" $ctx | nindent 8 }}
        {{- with $p.podLabels }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      {{- $annotations := deepCopy ($p.podAnnotations | default dict) }}
      {{- /* The adapter workers read the Redis password (prefetchNewVersions). */}}
      {{- if and (not $decode) $w.prefetchNewVersions }}
      {{- with include "preft-serve.configChecksum" (dict "root" $root "secrets" (list (include "preft-serve.redisPasswordSecret" $root))) }}
      {{- $_ := set $annotations "checksum/config" . }}
      {{- end }}
      {{- end }}
      {{- with include "preft-serve.podAnnotations" (dict "root" $root "port" $w.port "extra" $annotations) }}
      {{- . | nindent 6 }}
      {{- end }}
    spec:
      serviceAccountName: {{ include "preft-serve.serviceAccountName" $ctx }}
      {{- with include "preft-serve.imagePullSecrets" $root }}
      {{- . | nindent 6 }}
      {{- end }}
      {{- with include "preft-serve.securityContext" $w.podSecurityContext }}
      {{- . | nindent 6 }}
      {{- end }}
      {{- include "preft-serve.podExtras" $w | nindent 6 }}
      # preStop sleep (the gateway drops the pod from its worker list), then SIGTERM:
      # vLLM stops taking requests and drains in-flight ones for --shutdown-timeout.
      terminationGracePeriodSeconds: {{ $w.terminationGracePeriodSeconds }}
      {{- $image := include "preft-serve.image" (dict "root" $root "image" $w.image "default" (printf "worker-%s" $w.device)) }}
      {{- if or $root.Values.model.download.enabled $w.initContainers }}
      initContainers:
        {{- if $root.Values.model.download.enabled }}
        {{- include "preft-serve.modelDownloadContainer" (dict "root" $root "image" $image "securityContext" $w.containerSecurityContext "configOnly" false) | nindent 8 }}
        {{- end }}
        {{- with $w.initContainers }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      {{- end }}
      containers:
        - name: {{ $component }}
          image: {{ $image }}
          imagePullPolicy: {{ $root.Values.image.pullPolicy }}
          command: ["python3", "-m", "preft_serve.worker.serve"]
          args:
            - --model={{ $root.Values.model.path }}
            - --served-model-name={{ $root.Values.model.name }}
            - --device={{ $w.device }}
            - --host=0.0.0.0
            - --port={{ $w.port }}
            {{- if ne $role "unified" }}
            - --role={{ $role }}
            # NIXL's side channel, on the pod IP (the other pool connects to it).
            - --kv-host=$(POD_IP)
            - --kv-port={{ $d.kvPort }}
            {{- end }}
            {{- if eq $role "prefill" }}
            - --kv-lease-s={{ $d.kvLeaseSeconds }}
            {{- end }}
            {{- if not $decode }}
            - --max-loras={{ $w.maxLoras }}
            - --max-cpu-loras={{ $w.maxCpuLoras }}
            - --max-lora-rank={{ $w.maxLoraRank }}
            - --object-store={{ $os.url }}
            {{- with $os.endpointUrl }}
            - --s3-endpoint-url={{ . }}
            {{- end }}
            - --adapter-cache-dir=/var/cache/preft/adapters
            - --adapter-cache-gib={{ $w.adapterCache.sizeGiB }}
            {{- end }}
            {{- if not $gpu }}
            - --kv-cache-gib={{ $w.cpuKvCacheGiB }}
            {{- end }}
            - --shutdown-timeout={{ $w.shutdownTimeoutSeconds }}
            {{- /* Requests with tools are served whole by a worker; the decode hop never parses. */}}
            {{- with and (not $decode) $w.toolCallParser }}
            - --enable-auto-tool-choice
            - --tool-call-parser={{ . }}
            {{- end }}
            {{- if $root.Values.logging.json }}
            - --log-json
            {{- end }}
            {{- if $root.Values.tracing.enabled }}
            - --otlp-traces-endpoint={{ $root.Values.tracing.otlpEndpoint }}
            - --otlp-traces-protocol={{ $root.Values.tracing.protocol }}
            {{- end }}
            {{- range $p.extraArgs }}
            - {{ . | quote }}
            {{- end }}
          ports:
            - name: http
              containerPort: {{ $w.port }}
              protocol: TCP
            {{- if ne $role "unified" }}
            - name: nixl
              containerPort: {{ $d.kvPort }}
              protocol: TCP
            {{- end }}
          env:
            # The model comes from model.volume; never reach for a model hub.
            - name: HF_HUB_OFFLINE
              value: "1"
            - name: VLLM_NO_USAGE_STATS
              value: "1"
            - name: DO_NOT_TRACK
              value: "1"
            {{- if ne $role "unified" }}
            - name: POD_IP
              valueFrom:
                fieldRef:
                  fieldPath: status.podIP
            {{- end }}
            {{- if not $decode }}
            {{- if not (kindIs "invalid" $w.prefillReservedSlots) }}
            - name: PREFT_WORKER_PREFILL_RESERVED_SLOTS
              value: {{ $w.prefillReservedSlots | quote }}
            {{- end }}
            {{- if not (kindIs "invalid" $w.tenantClassicSlots) }}
            - name: PREFT_WORKER_TENANT_CLASSIC_SLOTS
              value: {{ $w.tenantClassicSlots | quote }}
            {{- end }}
            {{- if $w.prefetchNewVersions }}
            # Same as --registry-redis-url, kept out of the command line (it holds the password).
            {{- include "preft-serve.redisEnv" (dict "root" $root "var" "PREFT_WORKER_REGISTRY_REDIS_URL") | nindent 12 }}
            - name: PREFT_WORKER_REGISTRY_NAMESPACE
              value: {{ $root.Values.redis.keyNamespace | quote }}
            {{- end }}
            {{- with $os.region }}
            - name: PREFT_WORKER_S3_REGION
              value: {{ . | quote }}
            {{- end }}
            {{- with include "preft-serve.s3CredentialsEnv" $root }}
            {{- . | nindent 12 }}
            {{- end }}
            {{- end }}
            {{- with $p.extraEnv }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
          {{- with $p.extraEnvFrom }}
          envFrom:
            {{- toYaml . | nindent 12 }}
          {{- end }}
          {{- /* vLLM's /health answers 200 once the engine is up and 503 if it died. */}}
          {{- $health := dict "httpGet" (dict "path" "/health" "port" "http") }}
          {{- include "preft-serve.probes" (dict "values" $w "checks" (dict "startup" $health "readiness" $health "liveness" $health)) | nindent 10 }}
          {{- include "preft-serve.preStop" $w.preStopSleepSeconds | nindent 10 }}
          resources:
            {{- $resources := deepCopy ($p.resources | default dict) }}
            {{- if $gpu }}
            {{- $limits := merge (dict $w.gpu.resourceName (int $w.gpu.count)) ($resources.limits | default dict) }}
            {{- $_ := set $resources "limits" $limits }}
            {{- end }}
            {{- toYaml $resources | nindent 12 }}
          {{- /* Read-only root: vLLM, torch, Triton and Hugging Face write their caches under
          $HOME (~/.cache, ~/.triton, ~/.config) and /tmp, which are emptyDirs below. */}}
          {{- with include "preft-serve.securityContext" $w.containerSecurityContext }}
          {{- . | nindent 10 }}
          {{- end }}
          volumeMounts:
            - name: model
              mountPath: {{ $root.Values.model.mountPath }}
              readOnly: true
            {{- if not $decode }}
            - name: adapter-cache
              mountPath: /var/cache/preft/adapters
            {{- end }}
            - name: shm
              mountPath: /dev/shm
            - name: tmp
              mountPath: /tmp
            # The images' HOME (uid 10001's home directory in both worker images).
            - name: home
              mountPath: /home/app
            {{- with $w.extraVolumeMounts }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
      volumes:
        - name: model
          {{- toYaml $root.Values.model.volume | nindent 10 }}
        {{- if not $decode }}
        - name: adapter-cache
          {{- if $w.adapterCache.volume }}
          {{- toYaml $w.adapterCache.volume | nindent 10 }}
          {{- else }}
          emptyDir:
            sizeLimit: {{ add (int (ceil $w.adapterCache.sizeGiB)) 4 }}Gi
          {{- end }}
        {{- end }}
        - name: shm
          emptyDir:
            medium: Memory
            sizeLimit: {{ $w.shmSizeLimit }}
        - name: tmp
          emptyDir: {}
        - name: home
          emptyDir: {}
        {{- with $w.extraVolumes }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      {{- with $p.nodeSelector }}
      nodeSelector:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- $tolerations := concat ($p.tolerations | default list) (ternary ($w.gpu.tolerations | default list) list $gpu) }}
      {{- with $tolerations }}
      tolerations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $p.affinity }}
      affinity:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $p.topologySpreadConstraints }}
      topologySpreadConstraints:
        {{- range . }}
        - {{- toYaml (merge (dict "labelSelector" (dict "matchLabels" (include "preft-serve.selectorLabels" $ctx | fromYaml))) .) | nindent 10 }}
        {{- end }}
      {{- end }}
{{- end -}}

{{/*
A worker pool's headless Service: the gateway routes to individual workers, found through its
EndpointSlices (discovery=kubernetes) or its per-pod A records (discovery=dns). Only ready
pods are listed, so a worker leaves rotation as soon as it starts draining.
(dict "root" $ "pool" "worker"|"decode")
*/}}
{{- define "preft-serve.workerServiceManifest" -}}
{{- $ctx := dict "root" .root "component" (include "preft-serve.poolComponent" .) -}}
apiVersion: v1
kind: Service
metadata:
  name: {{ include "preft-serve.componentName" $ctx }}
  namespace: {{ .root.Release.Namespace }}
  labels:
    {{- include "preft-serve.labels" $ctx | nindent 4 }}
spec:
  clusterIP: None
  publishNotReadyAddresses: false
  selector:
    {{- include "preft-serve.selectorLabels" $ctx | nindent 4 }}
  ports:
    - name: http
      port: {{ .root.Values.worker.port }}
      targetPort: http
      protocol: TCP
{{- end -}}

{{/*
A worker pool's HorizontalPodAutoscaler on per-pod custom metrics served by
prometheus-adapter (docs/deploy.md shows the adapter rule), each a (dict "name" "target")
AverageValue; the HPA follows whichever asks for the most replicas.
(dict "root" $ "pool" "worker"|"decode" "autoscaling" $a "metrics" (list (dict ...)))
*/}}
{{- define "preft-serve.workerHpa" -}}
{{- $ctx := dict "root" .root "component" (include "preft-serve.poolComponent" .) -}}
{{- $a := .autoscaling -}}
apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata:
  name: {{ include "preft-serve.componentName" $ctx }}
  namespace: {{ .root.Release.Namespace }}
  labels:
    {{- include "preft-serve.labels" $ctx | nindent 4 }}
spec:
  scaleTargetRef:
    apiVersion: apps/v1
    kind: Deployment
    name: {{ include "preft-serve.componentName" $ctx }}
  minReplicas: {{ $a.minReplicas }}
  maxReplicas: {{ $a.maxReplicas }}
  metrics:
    {{- range .metrics }}
    - type: Pods
      pods:
        metric:
          name: {{ .name }}
        target:
          type: AverageValue
          averageValue: {{ .target | quote }}
    {{- end }}
  behavior:
    scaleUp:
      stabilizationWindowSeconds: 60
      policies:
        - {type: Pods, value: 2, periodSeconds: 120}
    scaleDown:
      stabilizationWindowSeconds: {{ $a.scaleDownStabilizationSeconds }}
      policies:
        - {type: Pods, value: 1, periodSeconds: 300}
{{- end -}}
