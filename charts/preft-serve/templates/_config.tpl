{{/*
The configuration the chart renders for pods to read: its ConfigMaps and generated Secrets.
A pod reads them when it starts (env, envFrom), so each pod template carries a
checksum/config annotation over what it reads, and `helm upgrade` rolls exactly the pods
whose configuration changed.
*/}}

{{/*
The Secrets the chart generates (secrets.generate) when no existing Secret is named, as a
YAML list of name, key, component and base64 value. A value is read back from the cluster
with `lookup` (so it never changes under running pods), else random; it is computed once per
render and kept in .Values, so templates/secrets.yaml and every pod's checksum see the same
value (a second randAlphaNum would give the pods a checksum of another password, and roll
them on the next upgrade for nothing). (root context)
*/}}
{{- define "preft-serve.generatedSecrets" -}}
{{- if not (hasKey .Values "__generatedSecrets") -}}
{{- $generated := list -}}
{{- if .Values.secrets.generate -}}
{{- if not .Values.registry.adminToken.existingSecret -}}
{{- $generated = append $generated (dict "name" (include "preft-serve.adminTokenSecret" .) "key" "admin-token" "length" 48 "component" "registry") -}}
{{- end -}}
{{- if and .Values.redis.enabled (not .Values.redis.auth.existingSecret) -}}
{{- $generated = append $generated (dict "name" (include "preft-serve.redisPasswordSecret" .) "key" "redis-password" "length" 32 "component" "redis") -}}
{{- end -}}
{{- end -}}
{{- range $generated -}}
{{- $existing := lookup "v1" "Secret" $.Release.Namespace .name -}}
{{- $value := randAlphaNum (int .length) | b64enc -}}
{{- if and $existing $existing.data (hasKey $existing.data .key) -}}
{{- $value = index $existing.data .key -}}
{{- end -}}
{{- $_ := set . "value" $value -}}
{{- end -}}
{{- $_ := set .Values "__generatedSecrets" $generated -}}
{{- end -}}
{{- toYaml (index .Values "__generatedSecrets") -}}
{{- end -}}

{{/*
A pod template's checksum/config annotation value: sha256 of the chart ConfigMaps (their
template files) and generated Secrets (by name; a Secret the chart does not generate is
skipped) that the pod reads; "" when it reads none.
(dict "root" $ "configMaps" (list "trainer-configmap.yaml") "secrets" (list <name>))
*/}}
{{- define "preft-serve.configChecksum" -}}
{{- $root := .root -}}
{{- $parts := list -}}
{{- range .configMaps -}}
{{- with include (print $root.Template.BasePath "/" .) $root -}}
{{- $parts = append $parts . -}}
{{- end -}}
{{- end -}}
{{- $names := .secrets | default list -}}
{{- range fromYamlArray (include "preft-serve.generatedSecrets" $root) -}}
{{- if has .name $names -}}
{{- $parts = append $parts (printf "secret %s %s=%s" .name .key .value) -}}
{{- end -}}
{{- end -}}
{{- with $parts -}}
{{- join "\n---\n" . | sha256sum -}}
{{- end -}}
{{- end -}}
