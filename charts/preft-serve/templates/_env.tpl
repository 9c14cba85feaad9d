{{/*
The environment the chart itself gives the gateway and the registry, and the registry's
fine-tuning ConfigMap. One source for two uses: the Deployments render it, and
preft-serve.chartSettings reads the names back so that gateway.settings / registry.settings
cannot set any of them a second time.

Each entry is a Kubernetes EnvVar plus one field the rendered pod spec does not get:
  set: the values key to change instead (the refusal message names it), or
  fixed: why the chart's value is the only one that works;
  why (optional): what else the refusal message should say.
*/}}

{{/* The gateway's environment, before its settings and extraEnv. (root context) */}}
{{- define "preft-serve.gatewayEnv" -}}
{{- $g := .Values.gateway -}}
- name: PREFT_GATEWAY_HOST
  value: "0.0.0.0"
  fixed: the container listens on every interface
- name: PREFT_GATEWAY_PORT
  value: "8080"
  fixed: the container port the Service, probes and network policies use
{{ include "preft-serve.redisEnv" (dict "root" . "var" "PREFT_GATEWAY_REDIS_URL" "set" "redis.external.* (or redis.enabled, the bundled Redis)") }}
- name: PREFT_GATEWAY_NAMESPACE
  value: {{ .Values.redis.keyNamespace | quote }}
  set: redis.keyNamespace
- name: PREFT_GATEWAY_DISCOVERY
  value: {{ $g.discovery | quote }}
  set: gateway.discovery
{{- $decode := .Values.disaggregation.enabled }}
{{- if eq $g.discovery "kubernetes" }}
- name: PREFT_GATEWAY_WORKER_SERVICE
  value: {{ include "preft-serve.workerService" . | quote }}
  fixed: the chart's worker Service
{{- if $decode }}
{{- /* The decode pool, found the same way (same namespace and port). */}}
- name: PREFT_GATEWAY_DECODE_WORKER_SERVICE
  value: {{ include "preft-serve.decodeWorkerService" . | quote }}
  set: disaggregation.enabled
{{- end }}
- name: PREFT_GATEWAY_WORKER_K8S_NAMESPACE
  value: {{ .Release.Namespace | quote }}
  fixed: the release's namespace, where the workers run
{{- else }}
- name: PREFT_GATEWAY_WORKER_DNS_NAME
  value: {{ include "preft-serve.workerDnsName" . | quote }}
  set: clusterDomain
{{- if $decode }}
{{- /* The decode pool, found the same way (same port). */}}
- name: PREFT_GATEWAY_DECODE_WORKER_DNS_NAME
  value: {{ include "preft-serve.decodeWorkerDnsName" . | quote }}
  set: disaggregation.enabled
{{- end }}
{{- end }}
- name: PREFT_GATEWAY_WORKER_PORT
  value: {{ .Values.worker.port | quote }}
  set: worker.port
- name: PREFT_GATEWAY_DISCOVERY_INTERVAL_S
  value: {{ $g.discoveryIntervalSeconds | quote }}
  set: gateway.discoveryIntervalSeconds
- name: PREFT_GATEWAY_CAP_ON_WORKER_LOAD
  value: {{ $g.capOnWorkerLoad | quote }}
  set: gateway.capOnWorkerLoad
- name: PREFT_GATEWAY_LOAD_POLL_INTERVAL_S
  value: {{ $g.loadPollIntervalSeconds | quote }}
  set: gateway.loadPollIntervalSeconds
- name: PREFT_GATEWAY_HOT_REPLICAS
  value: {{ $g.hotReplicas | quote }}
  set: gateway.hotReplicas
- name: PREFT_GATEWAY_HOT_HEADROOM
  value: {{ $g.hotHeadroom | quote }}
  set: gateway.hotHeadroom
- name: PREFT_GATEWAY_TENANT_COLD_LOADS
  value: {{ $g.tenantColdLoads | quote }}
  set: gateway.tenantColdLoads
- name: PREFT_GATEWAY_TENANT_CLASSIC_ADAPTERS_PER_WORKER
  value: {{ ternary (include "preft-serve.tenantClassicShare" .) $g.tenantClassicAdaptersPerWorker (kindIs "invalid" $g.tenantClassicAdaptersPerWorker) | quote }}
  set: gateway.tenantClassicAdaptersPerWorker
- name: PREFT_GATEWAY_BASE_MODEL_NAME
  value: {{ .Values.model.name | quote }}
  set: model.name
- name: PREFT_GATEWAY_WORKER_BASE_MODEL
  value: {{ .Values.model.name | quote }}
  set: model.name
{{- /* The workers parse tool calls only with a parser; /v1/responses refuses tools without one. */}}
- name: PREFT_GATEWAY_TOOL_CALLING
  value: {{ not (empty .Values.worker.toolCallParser) | quote }}
  set: worker.toolCallParser
- name: PREFT_GATEWAY_TENANT_RPS
  value: {{ $g.rateLimits.tenantRps | quote }}
  set: gateway.rateLimits.tenantRps
- name: PREFT_GATEWAY_TENANT_BURST
  value: {{ $g.rateLimits.tenantBurst | quote }}
  set: gateway.rateLimits.tenantBurst
- name: PREFT_GATEWAY_USER_RPS
  value: {{ $g.rateLimits.userRps | quote }}
  set: gateway.rateLimits.userRps
- name: PREFT_GATEWAY_USER_BURST
  value: {{ $g.rateLimits.userBurst | quote }}
  set: gateway.rateLimits.userBurst
{{- /* /v1/files and /v1/fine_tuning go to the registry: one OpenAI base URL for all. */}}
- name: PREFT_GATEWAY_REGISTRY_URL
  value: {{ printf "http://%s.%s.svc:%v" (include "preft-serve.componentName" (dict "root" . "component" "registry")) .Release.Namespace .Values.registry.service.port | quote }}
  set: registry.service.port
{{- if $g.operatorView }}
{{- /* The operator routes check their bearer against the registry's admin token. */}}
- name: PREFT_GATEWAY_ADMIN_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ include "preft-serve.adminTokenSecret" . }}
      key: {{ include "preft-serve.adminTokenKey" . }}
  set: gateway.operatorView
{{- end }}
{{- $registryUpload := .Values.registry.settings.MAX_UPLOAD_BYTES }}
{{- if and $registryUpload (not (hasKey $g.settings "MAX_UPLOAD_BYTES")) }}
{{- /* Uploads are streamed to the registry under the registry's own limit, unless the
gateway's settings give it another (so it is the chart's only while they do not). */}}
- name: PREFT_GATEWAY_MAX_UPLOAD_BYTES
  value: {{ include "preft-serve.settingText" $registryUpload | quote }}
  set: registry.settings.MAX_UPLOAD_BYTES
{{- end }}
- name: PREFT_GATEWAY_LOG_JSON
  value: {{ .Values.logging.json | quote }}
  set: logging.json
{{- with .Values.tracing }}
{{- if .enabled }}
- name: PREFT_GATEWAY_TRACING_ENABLED
  value: "true"
  set: tracing.enabled
- name: PREFT_GATEWAY_OTLP_ENDPOINT
  value: {{ .otlpEndpoint | quote }}
  set: tracing.otlpEndpoint
- name: PREFT_GATEWAY_OTLP_PROTOCOL
  value: {{ .protocol | quote }}
  set: tracing.protocol
- name: PREFT_GATEWAY_TRACING_SAMPLE_RATIO
  value: {{ .sampleRatio | quote }}
  set: tracing.sampleRatio
{{- end }}
{{- end }}
{{- end -}}

{{/* The registry's environment, before its settings and extraEnv. (root context) */}}
{{- define "preft-serve.registryEnv" -}}
{{- $r := .Values.registry -}}
{{- $os := .Values.objectStore -}}
- name: PREFT_REGISTRY_HOST
  value: "0.0.0.0"
  fixed: the container listens on every interface
- name: PREFT_REGISTRY_PORT
  value: "8081"
  fixed: the container port the Service, probes and network policies use
- name: PREFT_REGISTRY_ADMIN_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ include "preft-serve.adminTokenSecret" . }}
      key: {{ include "preft-serve.adminTokenKey" . }}
  set: registry.adminToken.existingSecret
{{ include "preft-serve.redisEnv" (dict "root" . "var" "PREFT_REGISTRY_REDIS_URL" "set" "redis.external.* (or redis.enabled, the bundled Redis)") }}
- name: PREFT_REGISTRY_NAMESPACE
  value: {{ .Values.redis.keyNamespace | quote }}
  set: redis.keyNamespace
- name: PREFT_REGISTRY_OBJECT_STORE__URL
  value: {{ $os.url | quote }}
  set: objectStore.url
{{- with $os.endpointUrl }}
- name: PREFT_REGISTRY_OBJECT_STORE__S3_ENDPOINT_URL
  value: {{ . | quote }}
  set: objectStore.endpointUrl
{{- end }}
{{- with $os.region }}
- name: PREFT_REGISTRY_OBJECT_STORE__S3_REGION
  value: {{ . | quote }}
  set: objectStore.region
{{- end }}
{{- with include "preft-serve.s3CredentialsEnv" . }}
{{ . }}
{{- end }}
- name: PREFT_REGISTRY_BASE_MODEL
  value: {{ ternary "/etc/preft/base-model/config.json" .Values.model.path (not (empty $r.modelConfig)) | quote }}
  set: model.path (or registry.modelConfig)
- name: PREFT_REGISTRY_BASE_MODEL_NAME
  value: {{ .Values.model.name | quote }}
  set: model.name
- name: PREFT_REGISTRY_STAGING_DIR
  value: /var/lib/preft/staging
  fixed: the staging volume's mount path; registry.stagingSizeLimit sizes it
{{- /* Starlette spools upload bodies to the temp dir: on the sized staging volume too. */}}
- name: TMPDIR
  value: /var/lib/preft/staging
- name: PREFT_REGISTRY_SCRATCH_BYTES
  value: {{ $r.scratchBytes | quote }}
  set: registry.scratchBytes
{{- /* The workers' --max-lora-rank: uploads the workers cannot serve are refused. */}}
- name: PREFT_REGISTRY_MAX_LORA_RANK
  value: {{ .Values.worker.maxLoraRank | quote }}
  set: worker.maxLoraRank
  why: it sets the workers' --max-lora-rank too, which must agree
{{- /* int64: YAML numbers reach templates as floats (10737418240 -> 1.073741824e+10). */}}
- name: PREFT_REGISTRY_TENANT_MAX_ADAPTERS
  value: {{ int64 $r.quotas.maxAdaptersPerTenant | quote }}
  set: registry.quotas.maxAdaptersPerTenant
- name: PREFT_REGISTRY_TENANT_MAX_STORED_BYTES
  value: {{ int64 $r.quotas.maxStoredBytesPerTenant | quote }}
  set: registry.quotas.maxStoredBytesPerTenant
- name: PREFT_REGISTRY_LOG_JSON
  value: {{ .Values.logging.json | quote }}
  set: logging.json
{{- end -}}

{{/* The registry's last entry, after its extraEnv, which cannot turn fine-tuning on either. */}}
{{- define "preft-serve.registryFinetuneEnv" -}}
{{- /* Fine-tuning: off unless trainer.enabled (the registry image has no torch). */}}
- name: PREFT_REGISTRY_FINETUNE__ENABLED
  value: {{ .Values.trainer.enabled | quote }}
  set: trainer.enabled
{{- end -}}

{{/*
The registry's fine-tuning settings (PREFT_REGISTRY_FINETUNE__*): how it builds each trainer
Job (services/preft_serve/registry/finetune/runners/k8s_manifest.py). The trainer ConfigMap's
data, loaded with envFrom; entries as in the environments above. (root context)
*/}}
{{- define "preft-serve.trainerConfig" -}}
{{- $t := .Values.trainer -}}
{{- $os := .Values.objectStore -}}
{{- $default := ternary "trainer-gpu" "trainer" (eq $t.device "gpu") -}}
{{- $resources := deepCopy ($t.resources | default dict) -}}
{{- if eq $t.device "gpu" -}}
{{- $gpu := dict "nvidia.com/gpu" (toString $t.gpuCount) -}}
{{- $_ := set $resources "requests" (merge (deepCopy ($resources.requests | default dict)) $gpu) -}}
{{- $_ := set $resources "limits" (merge (deepCopy ($resources.limits | default dict)) $gpu) -}}
{{- end -}}
{{- $labels := dict "app.kubernetes.io/instance" .Release.Name "app.kubernetes.io/part-of" "preft-serve" -}}
{{- $k8s := "PREFT_REGISTRY_FINETUNE__KUBERNETES__" -}}
- name: PREFT_REGISTRY_FINETUNE__BACKEND
  value: kubernetes
  fixed: trainer Jobs on this cluster
- name: PREFT_REGISTRY_FINETUNE__TENANT_MAX_RUNNING
  value: {{ $t.limits.maxRunningPerTenant | quote }}
  set: trainer.limits.maxRunningPerTenant
- name: PREFT_REGISTRY_FINETUNE__TENANT_MAX_QUEUED
  value: {{ $t.limits.maxQueuedPerTenant | quote }}
  set: trainer.limits.maxQueuedPerTenant
- name: PREFT_REGISTRY_FINETUNE__MAX_FILE_BYTES
  value: {{ int64 $t.limits.maxFileBytes | quote }}
  set: trainer.limits.maxFileBytes
- name: PREFT_REGISTRY_FINETUNE__MAX_STEPS
  value: {{ int64 $t.limits.maxSteps | quote }}
  set: trainer.limits.maxSteps
- name: PREFT_REGISTRY_FINETUNE__TRAINER_DISK_BYTES
  value: {{ int64 $t.limits.scratchBytes | quote }}
  set: trainer.limits.scratchBytes
- name: PREFT_REGISTRY_FINETUNE__JOB_TIMEOUT_S
  value: {{ int64 $t.jobTimeoutSeconds | quote }}
  set: trainer.jobTimeoutSeconds
- name: {{ $k8s }}NAMESPACE
  value: {{ .Release.Namespace | quote }}
  fixed: the release's namespace, where the registry's RBAC lets it create Jobs
- name: {{ $k8s }}IMAGE
  value: {{ include "preft-serve.image" (dict "root" . "image" $t.image "default" $default) | quote }}
  set: trainer.image
- name: {{ $k8s }}IMAGE_PULL_POLICY
  value: {{ .Values.image.pullPolicy | quote }}
  set: image.pullPolicy
- name: {{ $k8s }}IMAGE_PULL_SECRETS
  value: {{ .Values.image.pullSecrets | default list | toJson | quote }}
  set: image.pullSecrets
{{- /* The registry's own account: the same object-store identity (IRSA); the trainer pods do not mount its token. */}}
- name: {{ $k8s }}SERVICE_ACCOUNT
  value: {{ include "preft-serve.serviceAccountName" (dict "root" . "component" "registry") | quote }}
  set: registry.serviceAccount
- name: {{ $k8s }}RESOURCES
  value: {{ $resources | toJson | quote }}
  set: trainer.resources
- name: {{ $k8s }}NODE_SELECTOR
  value: {{ $t.nodeSelector | default dict | toJson | quote }}
  set: trainer.nodeSelector
- name: {{ $k8s }}TOLERATIONS
  value: {{ $t.tolerations | default list | toJson | quote }}
  set: trainer.tolerations
- name: {{ $k8s }}LABELS
  value: {{ $labels | toJson | quote }}
  fixed: the labels the chart's network policies and RBAC select trainer pods by
- name: {{ $k8s }}MODEL_VOLUME
  value: {{ .Values.model.volume | toJson | quote }}
  set: model.volume
- name: {{ $k8s }}MODEL_MOUNT_PATH
  value: {{ .Values.model.mountPath | quote }}
  set: model.mountPath
- name: {{ $k8s }}MODEL_PATH
  value: {{ .Values.model.path | quote }}
  set: model.path
- name: {{ $k8s }}TTL_SECONDS_AFTER_FINISHED
  value: {{ int64 $t.ttlSecondsAfterFinished | quote }}
  set: trainer.ttlSecondsAfterFinished
{{- with $os.existingSecret }}
- name: {{ $k8s }}S3_CREDENTIALS_SECRET
  value: {{ . | quote }}
  set: objectStore.existingSecret
- name: {{ $k8s }}S3_ACCESS_KEY_ID_KEY
  value: {{ $os.accessKeyIdKey | quote }}
  set: objectStore.accessKeyIdKey
- name: {{ $k8s }}S3_SECRET_ACCESS_KEY_KEY
  value: {{ $os.secretAccessKeyKey | quote }}
  set: objectStore.secretAccessKeyKey
{{- end }}
{{- end -}}

{{/*
Chart entries as rendered into a pod spec: the EnvVars without the set/fixed/why notes, or
(data true) a ConfigMap's data. (dict "entries" (include "preft-serve.gatewayEnv" $))
*/}}
{{- define "preft-serve.renderEntries" -}}
{{- $env := list -}}
{{- $data := dict -}}
{{- range fromYamlArray .entries -}}
{{- $env = append $env (omit . "set" "fixed" "why") -}}
{{- $_ := set $data .name .value -}}
{{- end -}}
{{- toYaml (ternary $data $env (.data | default false)) -}}
{{- end -}}

{{/*
The settings names the chart owns for a component ("gateway" or "registry"), as a YAML map
NAME -> what to do instead. Read from the entries above, rendered for the values given and
again with every optional part on (tracing, the decode pool, both discovery kinds, the
object store's endpoint and region, the trainer), so a name the chart sets only sometimes is
refused always. (dict "root" $ "component" "gateway")
*/}}
{{- define "preft-serve.chartSettings" -}}
{{- $root := .root -}}
{{- $prefix := printf "PREFT_%s_" (upper .component) -}}
{{- $allOn := dict "tracing" (dict "enabled" true "otlpEndpoint" "http://collector:4317")
    "disaggregation" (dict "enabled" true)
    "objectStore" (dict "endpointUrl" "http://s3" "region" "region" "existingSecret" "s3")
    "trainer" (dict "enabled" true) -}}
{{- $variants := list (dict) (merge (dict "gateway" (dict "discovery" "kubernetes")) $allOn)
    (merge (dict "gateway" (dict "discovery" "dns")) $allOn) -}}
{{- $owned := dict -}}
{{- range $override := $variants -}}
{{- $values := mergeOverwrite (deepCopy $root.Values) (deepCopy $override) -}}
{{- $variant := dict "Values" $values "Release" $root.Release "Chart" $root.Chart
    "Capabilities" $root.Capabilities "Files" $root.Files "Template" $root.Template -}}
{{- $entries := list -}}
{{- if eq $.component "gateway" -}}
{{- $entries = fromYamlArray (include "preft-serve.gatewayEnv" $variant) -}}
{{- else -}}
{{- $entries = concat (fromYamlArray (include "preft-serve.registryEnv" $variant))
    (fromYamlArray (include "preft-serve.registryFinetuneEnv" $variant))
    (fromYamlArray (include "preft-serve.trainerConfig" $variant)) -}}
{{- end -}}
{{- range $entries -}}
{{- if hasPrefix $prefix .name -}}
{{- $env := .name -}}
{{- $todo := printf "remove it: the chart sets %s itself" $env -}}
{{- with .fixed -}}
{{- $todo = printf "remove it: the chart sets %s itself (%s)" $env . -}}
{{- end -}}
{{- with .set -}}
{{- $todo = printf "set %s instead: the chart sets %s from it" . $env -}}
{{- end -}}
{{- with .why -}}
{{- $todo = printf "%s; %s" $todo . -}}
{{- end -}}
{{- $_ := set $owned (trimPrefix $prefix $env) $todo -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if eq .component "gateway" -}}
{{- /* Static discovery is not the chart's, but a decode worker list would still add a pool. */ -}}
{{- $_ := set $owned "DECODE_WORKER_URLS" "set disaggregation.enabled instead: the chart finds the decode workers through their Service" -}}
{{- end -}}
{{- toYaml $owned -}}
{{- end -}}
