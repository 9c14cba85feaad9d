{{/*
Names, labels and shared snippets. Every helper is prefixed with the chart name.
*/}}

{{- define "preft-serve.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* <release>-<chart>, or the release name alone when it already contains the chart name. */}}
{{- define "preft-serve.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Name of a component's resources: (dict "root" $ "component" "gateway"). */}}
{{- define "preft-serve.componentName" -}}
{{- printf "%s-%s" (include "preft-serve.fullname" .root | trunc 50 | trimSuffix "-") .component -}}
{{- end -}}

{{- define "preft-serve.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Selector labels: minimal and immutable (Deployment selectors cannot change). */}}
{{- define "preft-serve.selectorLabels" -}}
app.kubernetes.io/name: {{ include "preft-serve.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* Standard labels for a component's resources. */}}
{{- define "preft-serve.labels" -}}
helm.sh/chart: {{ include "preft-serve.chart" .root }}
{{ include "preft-serve.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/part-of: preft-serve
{{- with .root.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* A preft-serve image: (dict "root" $ "image" .Values.gateway.image "default" "gateway"). */}}
{{- define "preft-serve.image" -}}
{{- $repository := .image.repository | default .default -}}
{{- $tag := .image.tag | default .root.Values.image.tag | default .root.Chart.AppVersion -}}
{{- if .root.Values.image.registry -}}
{{- printf "%s/%s:%s" (trimSuffix "/" .root.Values.image.registry) $repository $tag -}}
{{- else -}}
{{- printf "%s:%s" $repository $tag -}}
{{- end -}}
{{- end -}}

{{- define "preft-serve.imagePullSecrets" -}}
{{- with .Values.image.pullSecrets -}}
imagePullSecrets:
{{- range . }}
  - name: {{ . }}
{{- end }}
{{- end -}}
{{- end -}}

{{- define "preft-serve.serviceAccountName" -}}
{{- $sa := index .root.Values .component "serviceAccount" -}}
{{- if $sa.create -}}
{{- $sa.name | default (include "preft-serve.componentName" .) -}}
{{- else -}}
{{- $sa.name | default "default" -}}
{{- end -}}
{{- end -}}

{{/* The workers' headless Service (discovery). */}}
{{- define "preft-serve.workerService" -}}
{{- include "preft-serve.componentName" (dict "root" . "component" "worker") -}}
{{- end -}}

{{- define "preft-serve.workerDnsName" -}}
{{- printf "%s.%s.svc.%s" (include "preft-serve.workerService" .) .Release.Namespace .Values.clusterDomain -}}
{{- end -}}

{{/* Secret holding the registry admin token, and its key. */}}
{{- define "preft-serve.adminTokenSecret" -}}
{{- .Values.registry.adminToken.existingSecret | default (include "preft-serve.componentName" (dict "root" . "component" "registry-admin")) -}}
{{- end -}}

{{- define "preft-serve.adminTokenKey" -}}
{{- if .Values.registry.adminToken.existingSecret -}}{{ .Values.registry.adminToken.key }}{{- else -}}admin-token{{- end -}}
{{- end -}}

{{/* Redis: Secret and key of the password ("" when there is none), and the URL. */}}
{{- define "preft-serve.redisPasswordSecret" -}}
{{- if .Values.redis.enabled -}}
{{- .Values.redis.auth.existingSecret | default (include "preft-serve.componentName" (dict "root" . "component" "redis")) -}}
{{- else -}}
{{- .Values.redis.external.existingSecret -}}
{{- end -}}
{{- end -}}

{{- define "preft-serve.redisPasswordKey" -}}
{{- if .Values.redis.enabled -}}
{{- if .Values.redis.auth.existingSecret -}}{{ .Values.redis.auth.passwordKey }}{{- else -}}redis-password{{- end -}}
{{- else -}}
{{- .Values.redis.external.passwordKey -}}
{{- end -}}
{{- end -}}

{{- define "preft-serve.redisHost" -}}
{{- if .Values.redis.enabled -}}
{{- include "preft-serve.componentName" (dict "root" . "component" "redis") -}}
{{- else -}}
{{- .Values.redis.external.host -}}
{{- end -}}
{{- end -}}

{{/*
Environment for a Redis client: REDIS_PASSWORD from its Secret, then the URL under the
given variable name, which refers to the password as $(REDIS_PASSWORD) so the password
itself never appears in the pod spec. (dict "root" $ "var" "PREFT_GATEWAY_REDIS_URL")
*/}}
{{- define "preft-serve.redisEnv" -}}
{{- $root := .root -}}
{{- $secret := include "preft-serve.redisPasswordSecret" $root -}}
{{- $scheme := "redis" -}}
{{- $port := 6379 -}}
{{- $db := 0 -}}
{{- if not $root.Values.redis.enabled -}}
{{- $scheme = ternary "rediss" "redis" $root.Values.redis.external.tls -}}
{{- $port = $root.Values.redis.external.port -}}
{{- $db = $root.Values.redis.external.db -}}
{{- end -}}
{{- $host := include "preft-serve.redisHost" $root -}}
{{- if $secret -}}
- name: REDIS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ $secret }}
      key: {{ include "preft-serve.redisPasswordKey" $root }}
- name: {{ .var }}
  value: {{ printf "%s://:$(REDIS_PASSWORD)@%s:%v/%v" $scheme $host $port $db | quote }}
{{- else -}}
- name: {{ .var }}
  value: {{ printf "%s://%s:%v/%v" $scheme $host $port $db | quote }}
{{- end }}
{{- end -}}

{{/* S3 credentials from objectStore.existingSecret (none: IRSA / instance role). */}}
{{- define "preft-serve.s3CredentialsEnv" -}}
{{- with .Values.objectStore.existingSecret -}}
- name: AWS_ACCESS_KEY_ID
  valueFrom:
    secretKeyRef:
      name: {{ . }}
      key: {{ $.Values.objectStore.accessKeyIdKey }}
- name: AWS_SECRET_ACCESS_KEY
  valueFrom:
    secretKeyRef:
      name: {{ . }}
      key: {{ $.Values.objectStore.secretAccessKeyKey }}
{{- end }}
{{- end -}}

{{/* NAME: value settings rendered as <prefix>NAME environment variables. */}}
{{- define "preft-serve.settingsEnv" -}}
{{- $env := list -}}
{{- range $name, $value := .settings -}}
{{- $env = append $env (dict "name" (printf "%s%s" $.prefix (upper $name)) "value" (toString $value)) -}}
{{- end -}}
{{- with $env }}{{ toYaml . }}{{ end -}}
{{- end -}}

{{/*
Pod annotations: prometheus.io/* for plain Prometheus scraping plus the component's
podAnnotations and any extra ones; renders nothing when there are none.
(dict "root" $ "port" 8080 "extra" .Values.gateway.podAnnotations)
*/}}
{{- define "preft-serve.podAnnotations" -}}
{{- $annotations := dict -}}
{{- if .root.Values.metrics.scrapeAnnotations -}}
{{- $_ := set $annotations "prometheus.io/scrape" "true" -}}
{{- $_ := set $annotations "prometheus.io/port" (toString .port) -}}
{{- $_ := set $annotations "prometheus.io/path" "/metrics" -}}
{{- end -}}
{{- $annotations = merge $annotations (.extra | default dict) -}}
{{- with $annotations -}}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end -}}
{{- end -}}

{{/* A preStop hook that sleeps (so endpoint removal propagates before SIGTERM). */}}
{{- define "preft-serve.preStop" -}}
lifecycle:
  preStop:
    exec:
      command: ["sleep", "{{ . }}"]
{{- end -}}

{{/* Restricted-profile container security context (the images run as uid 10001). */}}
{{- define "preft-serve.containerSecurityContext" -}}
securityContext:
  allowPrivilegeEscalation: false
  readOnlyRootFilesystem: {{ . }}
  runAsNonRoot: true
  capabilities:
    drop: ["ALL"]
  seccompProfile:
    type: RuntimeDefault
{{- end -}}

{{- define "preft-serve.podSecurityContext" -}}
securityContext:
  runAsNonRoot: true
  runAsUser: 10001
  runAsGroup: 10001
  fsGroup: 10001
  seccompProfile:
    type: RuntimeDefault
{{- end -}}
