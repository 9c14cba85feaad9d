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

{{/*
An image reference: registry/repository@digest when a digest is given (it wins over the
tag), else registry/repository:tag. (dict "registry" "docker.io" "repository" "library/redis"
"tag" "7.4.2-alpine" "digest" "")
*/}}
{{- define "preft-serve.imageRef" -}}
{{- $name := .repository -}}
{{- with .registry -}}
{{- $name = printf "%s/%s" (trimSuffix "/" .) $name -}}
{{- end -}}
{{- if .digest -}}
{{- printf "%s@%s" $name .digest -}}
{{- else -}}
{{- printf "%s:%s" $name (toString .tag) -}}
{{- end -}}
{{- end -}}

{{/*
A preft-serve image: global.imageRegistry, else image.registry; the component's digest,
else its tag, else image.tag, else the chart's appVersion.
(dict "root" $ "image" .Values.gateway.image "default" "gateway")
*/}}
{{- define "preft-serve.image" -}}
{{- $values := .root.Values -}}
{{- include "preft-serve.imageRef" (dict
    "registry" (($values.global).imageRegistry | default $values.image.registry)
    "repository" (.image.repository | default .default)
    "tag" (.image.tag | default $values.image.tag | default .root.Chart.AppVersion)
    "digest" .image.digest) -}}
{{- end -}}

{{/* The bundled Redis image (global.imageRegistry replaces redis.image.registry too). */}}
{{- define "preft-serve.redisImage" -}}
{{- $image := .Values.redis.image -}}
{{- include "preft-serve.imageRef" (dict
    "registry" ((.Values.global).imageRegistry | default $image.registry)
    "repository" $image.repository "tag" $image.tag "digest" $image.digest) -}}
{{- end -}}

{{- define "preft-serve.imagePullSecrets" -}}
{{- with .Values.image.pullSecrets -}}
imagePullSecrets:
{{- range . }}
  - name: {{ . }}
{{- end }}
{{- end -}}
{{- end -}}

{{/*
A component's ServiceAccount name: (dict "root" $ "component" "gateway"); "values" names the
values key when it is not the component's name (decode-worker: decodeWorker).
*/}}
{{- define "preft-serve.serviceAccountName" -}}
{{- $sa := index .root.Values (.values | default .component) "serviceAccount" -}}
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
itself never appears in the pod spec. (dict "root" $ "var" "PREFT_GATEWAY_REDIS_URL"); with
"set", the URL's entry carries that note for preft-serve.renderEntries (templates/_env.tpl).
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
{{- with .set }}
  set: {{ . }}
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
{{- $env = append $env (dict "name" (printf "%s%s" $.prefix (upper $name)) "value" (include "preft-serve.settingText" $value)) -}}
{{- end -}}
{{- with $env }}{{ toYaml . }}{{ end -}}
{{- end -}}

{{/*
A setting's value as the text of an environment variable. Numbers from a values file reach
templates as floats, which toString writes with an exponent from 1e6 on (4194304 ->
"4.194304e+06", which the settings refuse): a whole number is written as an integer.
*/}}
{{- define "preft-serve.settingText" -}}
{{- if and (kindIs "float64" .) (eq (float64 (int64 .)) .) -}}
{{- int64 . -}}
{{- else -}}
{{- toString . -}}
{{- end -}}
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

{{/*
A security context from values: `enabled: false` renders nothing, every other key is the
Kubernetes field (fields set to null in the values are gone). For pods and containers:
(include "preft-serve.securityContext" .Values.gateway.podSecurityContext)
*/}}
{{- define "preft-serve.securityContext" -}}
{{- if .enabled -}}
securityContext:
  {{- toYaml (omit . "enabled") | nindent 2 }}
{{- end -}}
{{- end -}}

{{/*
A probe: the custom one when given (a whole Kubernetes Probe), else the chart's check with
the timing from values, else nothing when `enabled: false`.
(dict "name" "livenessProbe" "probe" $g.livenessProbe "custom" $g.customLivenessProbe
      "check" (dict "httpGet" (dict "path" "/healthz" "port" "http")))
*/}}
{{- define "preft-serve.probe" -}}
{{- if .custom -}}
{{ .name }}:
  {{- toYaml .custom | nindent 2 }}
{{- else if .probe.enabled -}}
{{ .name }}:
  {{- toYaml (merge (omit .probe "enabled") .check) | nindent 2 }}
{{- end -}}
{{- end -}}

{{/*
The startup, readiness and liveness probes of a component, each from its values and its
check: (dict "values" .Values.gateway "checks" (dict "startup" $healthz "readiness" $readyz
"liveness" $healthz))
*/}}
{{- define "preft-serve.probes" -}}
{{- $values := .values -}}
{{- $checks := .checks -}}
{{- range $probe := list "startup" "readiness" "liveness" -}}
{{- $name := printf "%sProbe" $probe -}}
{{- $custom := index $values (printf "custom%sProbe" (title $probe)) -}}
{{- with include "preft-serve.probe" (dict "name" $name "probe" (index $values $name) "custom" $custom "check" (index $checks $probe)) }}
{{ . }}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
Pod-level extras every component shares: priorityClassName, runtimeClassName.
*/}}
{{- define "preft-serve.podExtras" -}}
{{- with .priorityClassName }}
priorityClassName: {{ . | quote }}
{{- end }}
{{- with .runtimeClassName }}
runtimeClassName: {{ . | quote }}
{{- end }}
{{- end -}}

{{/*
The model download init container (model.download): files/fetch-model.py in the pod's own
image, writing into the `model` volume at model.mountPath. Workers fetch the whole model,
the registry config.json alone.
(dict "root" $ "image" <image> "securityContext" .Values.worker.containerSecurityContext
      "configOnly" false)
*/}}
{{- define "preft-serve.modelDownloadContainer" -}}
{{- $root := .root -}}
{{- $d := $root.Values.model.download -}}
{{- $os := $root.Values.objectStore -}}
{{- $s3 := hasPrefix "s3://" $d.from -}}
- name: model-download
  image: {{ .image }}
  imagePullPolicy: {{ $root.Values.image.pullPolicy }}
  command:
    - python3
    - -c
    - |
      {{- $root.Files.Get "files/fetch-model.py" | nindent 6 }}
  args:
    - {{ $d.from | quote }}
    - {{ $root.Values.model.path | quote }}
    {{- if .configOnly }}
    - --config-only
    {{- end }}
    {{- if $s3 }}
    {{- with $d.s3.endpointUrl | default $os.endpointUrl }}
    - --s3-endpoint-url={{ . }}
    {{- end }}
    {{- with $d.s3.region | default $os.region }}
    - --s3-region={{ . }}
    {{- end }}
    {{- else if $d.sha256 }}
    - --sha256={{ $d.sha256 }}
    {{- end }}
  {{- if $s3 }}
  {{- if $d.s3.existingSecret }}
  env:
    - name: AWS_ACCESS_KEY_ID
      valueFrom:
        secretKeyRef:
          name: {{ $d.s3.existingSecret }}
          key: {{ $d.s3.accessKeyIdKey }}
    - name: AWS_SECRET_ACCESS_KEY
      valueFrom:
        secretKeyRef:
          name: {{ $d.s3.existingSecret }}
          key: {{ $d.s3.secretAccessKeyKey }}
  {{- else }}
  {{- with include "preft-serve.s3CredentialsEnv" $root }}
  env:
    {{- . | nindent 4 }}
  {{- end }}
  {{- end }}
  {{- end }}
  resources:
    {{- toYaml $d.resources | nindent 4 }}
  {{- with include "preft-serve.securityContext" .securityContext }}
  {{- . | nindent 2 }}
  {{- end }}
  volumeMounts:
    - name: model
      mountPath: {{ $root.Values.model.mountPath }}
{{- end -}}
