{{/*
Cross-field checks that values.schema.json cannot express. All problems are collected and
reported at once, each with its fix, so one `helm install` run shows everything to change.
*/}}
{{- define "preft-serve.validate" -}}
{{- $v := .Values -}}
{{- $errors := list -}}

{{- if and (not $v.redis.enabled) (not $v.redis.external.host) -}}
{{- $errors = append $errors "redis.external.host is required when redis.enabled=false (or set redis.enabled=true for the bundled Redis)" -}}
{{- end -}}

{{- $drain := add $v.worker.preStopSleepSeconds $v.worker.shutdownTimeoutSeconds -}}
{{- if le (int $v.worker.terminationGracePeriodSeconds) (int $drain) -}}
{{- $errors = append $errors (printf "worker.terminationGracePeriodSeconds (%v) must exceed worker.preStopSleepSeconds + worker.shutdownTimeoutSeconds (%v), or in-flight requests are killed mid-drain" $v.worker.terminationGracePeriodSeconds $drain) -}}
{{- end -}}
{{- if le (int $v.gateway.terminationGracePeriodSeconds) (int $v.gateway.preStopSleepSeconds) -}}
{{- $errors = append $errors "gateway.terminationGracePeriodSeconds must exceed gateway.preStopSleepSeconds" -}}
{{- end -}}
{{- if le (int $v.registry.terminationGracePeriodSeconds) (int $v.registry.preStopSleepSeconds) -}}
{{- $errors = append $errors "registry.terminationGracePeriodSeconds must exceed registry.preStopSleepSeconds" -}}
{{- end -}}

{{- range $component := list "gateway" "worker" -}}
{{- $scaling := (index $v $component).autoscaling -}}
{{- if and $scaling.enabled (gt (int $scaling.minReplicas) (int $scaling.maxReplicas)) -}}
{{- $errors = append $errors (printf "%s.autoscaling.minReplicas (%v) must not exceed maxReplicas (%v)" $component $scaling.minReplicas $scaling.maxReplicas) -}}
{{- end -}}
{{- end -}}

{{- if and (not (kindIs "invalid" $v.worker.prefillReservedSlots)) (ge (int $v.worker.prefillReservedSlots) (int $v.worker.maxLoras)) -}}
{{- $errors = append $errors (printf "worker.prefillReservedSlots (%v) must be below worker.maxLoras (%v), or adapters applied to every token never get a slot and the workers refuse to start; lower it (0 reserves none)" $v.worker.prefillReservedSlots $v.worker.maxLoras) -}}
{{- end -}}

{{- $classic := sub (int $v.worker.maxLoras) (include "preft-serve.prefillReservedSlots" . | int) -}}
{{- if and (not (kindIs "invalid" $v.worker.tenantClassicSlots)) (gt (int $v.worker.tenantClassicSlots) 0) (ge (int $v.worker.tenantClassicSlots) (int $classic)) (gt (int $classic) 1) -}}
{{- $errors = append $errors (printf "worker.tenantClassicSlots (%v) must be below worker.maxLoras - worker.prefillReservedSlots (%v), or one tenant's long answers can hold every slot of adapters applied to every token; lower it (0 turns the per-tenant limit off)" $v.worker.tenantClassicSlots $classic) -}}
{{- end -}}
{{- $share := include "preft-serve.tenantClassicShare" . | int -}}
{{- if and (not (kindIs "invalid" $v.gateway.tenantClassicAdaptersPerWorker)) (gt (int $v.gateway.tenantClassicAdaptersPerWorker) $share) -}}
{{- $errors = append $errors (printf "gateway.tenantClassicAdaptersPerWorker (%v) must not exceed the workers' per-tenant share of classic slots (%v, worker.tenantClassicSlots): the gateway would send a tenant's adapters to workers that hold them back" $v.gateway.tenantClassicAdaptersPerWorker $share) -}}
{{- end -}}

{{- if $v.gateway.pdb.enabled -}}
{{- $floor := ternary $v.gateway.autoscaling.minReplicas $v.gateway.replicas $v.gateway.autoscaling.enabled -}}
{{- if ge (int $v.gateway.pdb.minAvailable) (int $floor) -}}
{{- $errors = append $errors (printf "gateway.pdb.minAvailable (%v) must be below the gateway's replica count (%v), or no node can ever be drained; lower it or add replicas" $v.gateway.pdb.minAvailable $floor) -}}
{{- end -}}
{{- end -}}
{{- if ge (float64 (include "preft-serve.quantityBytes" $v.registry.scratchBytes)) (float64 (include "preft-serve.quantityBytes" $v.registry.stagingSizeLimit)) -}}
{{- $errors = append $errors (printf "registry.scratchBytes (%v) must be below registry.stagingSizeLimit (%v): Kubernetes evicts the registry when its scratch volume passes its size; leave ~1Gi for what the count leaves out" $v.registry.scratchBytes $v.registry.stagingSizeLimit) -}}
{{- end -}}
{{- if and $v.registry.pdb.enabled (gt (int $v.registry.replicas) 1) (ge (int $v.registry.pdb.minAvailable) (int $v.registry.replicas)) -}}
{{- $errors = append $errors (printf "registry.pdb.minAvailable (%v) must be below registry.replicas (%v)" $v.registry.pdb.minAvailable $v.registry.replicas) -}}
{{- end -}}

{{- if not (hasPrefix (printf "%s/" (trimSuffix "/" $v.model.mountPath)) $v.model.path) -}}
{{- $errors = append $errors (printf "model.path (%s) must be a directory under model.mountPath (%s)" $v.model.path $v.model.mountPath) -}}
{{- end -}}

{{- with $v.registry.modelConfig -}}
{{- $config := fromJson . -}}
{{- if or (hasKey $config "Error") (not (hasKey $config "model_type")) -}}
{{- $errors = append $errors "registry.modelConfig must be the base model's config.json (a JSON object with model_type), e.g. --set-file registry.modelConfig=/models/base/config.json" -}}
{{- end -}}
{{- end -}}

{{- range $name, $_ := $v.registry.settings -}}
{{- /* MAX_RANK: the old name of MAX_LORA_RANK (which the chart-owned check below refuses). */ -}}
{{- if eq (upper $name) "MAX_RANK" -}}
{{- $errors = append $errors (printf "registry.settings.%s: set worker.maxLoraRank instead; it sets both the workers' --max-lora-rank and the registry's MAX_LORA_RANK, which must agree" $name) -}}
{{- end -}}
{{- end -}}
{{- range $v.registry.extraEnv -}}
{{- if has (toString .name) (list "PREFT_REGISTRY_MAX_RANK" "PREFT_REGISTRY_MAX_LORA_RANK") -}}
{{- $errors = append $errors (printf "registry.extraEnv %s: set worker.maxLoraRank instead; it sets both the workers' --max-lora-rank and the registry's MAX_LORA_RANK, which must agree" .name) -}}
{{- end -}}
{{- end -}}
{{- range $v.worker.extraArgs -}}
{{- if hasPrefix "--max-lora-rank" (toString .) -}}
{{- $errors = append $errors "worker.extraArgs: remove --max-lora-rank and set worker.maxLoraRank; it sets both the workers' flag and the registry's MAX_LORA_RANK, which must agree" -}}
{{- end -}}
{{- end -}}

{{- /* The prefill/decode pools: the chart passes the pool flags; the decode pool must exist. */ -}}
{{- $poolFlags := list "--role" "--kv-host" "--kv-port" "--kv-lease-s" -}}
{{- if $v.disaggregation.enabled -}}
{{- $poolFlags = append $poolFlags "--kv-transfer-config" -}}
{{- end -}}
{{- range $key := list "worker" "decodeWorker" -}}
{{- range (index $v $key).extraArgs -}}
{{- $arg := toString . -}}
{{- range $flag := $poolFlags -}}
{{- if or (eq $arg $flag) (hasPrefix (printf "%s=" $flag) $arg) -}}
{{- $errors = append $errors (printf "%s.extraArgs: remove %s; set disaggregation.enabled (and disaggregation.kvPort, disaggregation.kvLeaseSeconds) instead: the chart gives each pool its --role and the NIXL flags, and the launcher its --kv-transfer-config" $key $flag) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if $v.disaggregation.enabled -}}
{{- $dw := $v.decodeWorker -}}
{{- range $dw.extraArgs -}}
{{- $arg := toString . -}}
{{- range $flag := list "--enable-prefix-caching" "--enable-lora" -}}
{{- if or (eq $arg $flag) (hasPrefix (printf "%s=" $flag) $arg) -}}
{{- $errors = append $errors (printf "decodeWorker.extraArgs: remove %s; a decode worker runs the base model on prompt KV computed with an adapter, which must never be reused (the launcher turns prefix caching off) and needs no LoRA" $flag) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if and (not $dw.autoscaling.enabled) (lt (int $dw.replicas) 1) -}}
{{- $errors = append $errors (printf "decodeWorker.replicas (%v) must be at least 1 when disaggregation.enabled=true: the decode workers finish every PreFT and base-model request; add replicas, turn on decodeWorker.autoscaling, or set disaggregation.enabled=false" $dw.replicas) -}}
{{- end -}}
{{- if and $dw.autoscaling.enabled (gt (int $dw.autoscaling.minReplicas) (int $dw.autoscaling.maxReplicas)) -}}
{{- $errors = append $errors (printf "decodeWorker.autoscaling.minReplicas (%v) must not exceed maxReplicas (%v)" $dw.autoscaling.minReplicas $dw.autoscaling.maxReplicas) -}}
{{- end -}}
{{- if eq (int $v.disaggregation.kvPort) (int $v.worker.port) -}}
{{- $errors = append $errors (printf "disaggregation.kvPort (%v) must differ from worker.port (%v): NIXL's side channel and vLLM's API are two listeners in the same pod" $v.disaggregation.kvPort $v.worker.port) -}}
{{- end -}}
{{- end -}}

{{- if and $v.tracing.enabled (not $v.tracing.otlpEndpoint) -}}
{{- $errors = append $errors "tracing.otlpEndpoint is required when tracing.enabled=true: the OTLP collector's URL, e.g. http://otel-collector.monitoring:4317 (grpc)" -}}
{{- end -}}
{{- /* The chart's own environment (templates/_env.tpl) is set once, from its own values;
settings render in plain text into the pod spec, so no secret goes there either. */ -}}
{{- range $component := list "gateway" "registry" -}}
{{- $owned := include "preft-serve.chartSettings" (dict "root" $ "component" $component) | fromYaml -}}
{{- $env := printf "PREFT_%s_" (upper $component) -}}
{{- range $name, $_ := (index $v $component).settings -}}
{{- $key := upper $name -}}
{{- $secret := regexMatch "(^|_)(TOKEN|PASSWORD|PASSWD|KEY)$|(^|_)SECRET|CREDENTIAL" $key -}}
{{- if hasKey $owned $key -}}
{{- $errors = append $errors (printf "%s.settings.%s: %s%s" $component $name (index $owned $key) (ternary " (and never put a secret in settings: they are written into the pod spec in plain text)" "" $secret)) -}}
{{- else if $secret -}}
{{- $errors = append $errors (printf "%s.settings.%s: settings are written into the pod spec in plain text; put the value in a Secret and add it with %s.extraEnv (name %s%s, valueFrom.secretKeyRef)" $component $name $component $env $key) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- if and (eq $v.worker.device "gpu") (lt (int $v.worker.gpu.count) 1) -}}
{{- $errors = append $errors "worker.gpu.count must be at least 1 when worker.device=gpu (or set worker.device=cpu)" -}}
{{- end -}}

{{- $sources := list -}}
{{- range $source, $spec := $v.model.volume -}}
{{- if not (kindIs "invalid" $spec) -}}
{{- $sources = append $sources $source -}}
{{- end -}}
{{- end -}}
{{- if ne (len $sources) 1 -}}
{{- $errors = append $errors (printf "model.volume must be one volume source, not %d (%s): Helm merges maps, so set the default's persistentVolumeClaim to null when you use another source" (len $sources) (join ", " $sources)) -}}
{{- end -}}

{{- with $v.model.download -}}
{{- if and .enabled (not .from) -}}
{{- $errors = append $errors "model.download.from is required when model.download.enabled=true: s3://bucket/prefix of the model directory, or an http(s):// URL of a tar archive of it" -}}
{{- end -}}
{{- if and .enabled (dig "persistentVolumeClaim" "readOnly" false $v.model.volume) -}}
{{- $errors = append $errors "model.volume.persistentVolumeClaim.readOnly must be false when model.download.enabled=true: the download init container writes the model there (the worker container still mounts it read-only)" -}}
{{- end -}}
{{- if and .enabled $v.trainer.enabled (not $v.model.volume.persistentVolumeClaim) -}}
{{- $errors = append $errors "trainer.enabled with model.download.enabled needs model.volume to be a shared persistentVolumeClaim (ReadWriteMany): trainer Jobs mount model.volume as it is and do not download the model, so a per-pod volume (emptyDir, ephemeral) would be empty there" -}}
{{- end -}}
{{- if and .sha256 (hasPrefix "s3://" .from) -}}
{{- $errors = append $errors "model.download.sha256 checks archives fetched from http(s) URLs; it does not apply to an s3:// source (remove it)" -}}
{{- end -}}
{{- end -}}

{{- if not $v.secrets.generate -}}
{{- if not $v.registry.adminToken.existingSecret -}}
{{- $errors = append $errors "registry.adminToken.existingSecret is required when secrets.generate=false: create the Secret (kubectl create secret generic preft-admin --from-literal=admin-token=$(openssl rand -hex 24)) and name it, with registry.adminToken.key=admin-token" -}}
{{- end -}}
{{- if and $v.redis.enabled (not $v.redis.auth.existingSecret) -}}
{{- $errors = append $errors "redis.auth.existingSecret is required when secrets.generate=false and redis.enabled=true: create the Secret (kubectl create secret generic preft-redis --from-literal=redis-password=$(openssl rand -hex 24)) and name it" -}}
{{- end -}}
{{- end -}}

{{- if $errors -}}
{{- fail (printf "\n\nInvalid values for the preft-serve chart:\n  - %s\n" (join "\n  - " $errors)) -}}
{{- end -}}
{{- end -}}

{{/*
A Kubernetes quantity ("6Gi", "7G", "512Mi", "1073741824") as a number of bytes (a float).
*/}}
{{- define "preft-serve.quantityBytes" -}}
{{- $quantity := toString . -}}
{{- $number := regexFind "^[0-9]+(\\.[0-9]+)?" $quantity -}}
{{- $units := dict "" 1.0 "k" 1e3 "M" 1e6 "G" 1e9 "T" 1e12 "P" 1e15 "E" 1e18 "Ki" 1024.0 "Mi" 1048576.0 "Gi" 1073741824.0 "Ti" 1099511627776.0 "Pi" 1125899906842624.0 "Ei" 1152921504606846976.0 -}}
{{- mulf (float64 $number) (get $units (trimPrefix $number $quantity)) -}}
{{- end -}}

{{/*
The workers' per-tenant share of the slots classic adapters may take, as
preft_serve.worker.decode_slots.tenant_slots computes it: worker.tenantClassicSlots (0: all
of them), or half of them, at least 1. (root context)
*/}}
{{- define "preft-serve.tenantClassicShare" -}}
{{- $w := .Values.worker -}}
{{- $classic := max 1 (sub (int $w.maxLoras) (include "preft-serve.prefillReservedSlots" . | int)) -}}
{{- if kindIs "invalid" $w.tenantClassicSlots -}}
{{- max 1 (div $classic 2) -}}
{{- else if gt (int $w.tenantClassicSlots) 0 -}}
{{- min (int $w.tenantClassicSlots) $classic -}}
{{- else -}}
{{- $classic -}}
{{- end -}}
{{- end -}}

{{/*
The slots the workers keep from classic adapters, as decode_slots.reserved_slots computes
it: worker.prefillReservedSlots, or a quarter of worker.maxLoras, at least 1 where it is 2 or
more. (root context)
*/}}
{{- define "preft-serve.prefillReservedSlots" -}}
{{- $w := .Values.worker -}}
{{- if not (kindIs "invalid" $w.prefillReservedSlots) -}}
{{- $w.prefillReservedSlots -}}
{{- else if ge (int $w.maxLoras) 2 -}}
{{- max 1 (div (int $w.maxLoras) 4) -}}
{{- else -}}
0
{{- end -}}
{{- end -}}

