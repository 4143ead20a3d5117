{{/* Names, labels and the values derived from several keys. */}}

{{- define "baton.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "baton.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* "<fullname>-<component>", e.g. baton-prefill. Call with (dict "root" $ "component" "prefill"). */}}
{{- define "baton.componentName" -}}
{{- printf "%s-%s" (include "baton.fullname" .root | trunc 50 | trimSuffix "-") .component }}
{{- end }}

{{/* What pods are selected by: never changes over a release's life (Deployment selectors are immutable). */}}
{{- define "baton.selectorLabels" -}}
app.kubernetes.io/name: {{ include "baton.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "baton.labels" -}}
{{ include "baton.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/part-of: baton
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The label selector the router's discovery watches for one worker role (--prefill-selector ...). */}}
{{- define "baton.discoverySelector" -}}
app.kubernetes.io/instance={{ .root.Release.Name }},app.kubernetes.io/component={{ .component }}
{{- end }}

{{- define "baton.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "baton.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "baton.image" -}}
{{- $tag := .Values.image.tag }}
{{- if not $tag }}
{{- $tag = ternary (printf "%s-cpu" .Chart.AppVersion) .Chart.AppVersion (eq .Values.image.variant "cpu") }}
{{- end }}
{{- printf "%s:%s" .Values.image.repository $tag }}
{{- end }}

{{- define "baton.modelPath" -}}
{{- printf "%s/%s" (trimSuffix "/" .Values.model.mountPath) .Values.model.name }}
{{- end }}

{{/* The Redis URL every process gets as BATON_REDIS_URL; empty when there is no Redis. */}}
{{- define "baton.redisUrl" -}}
{{- if .Values.redis.enabled }}
{{- printf "redis://%s:%d/0" (include "baton.componentName" (dict "root" . "component" "redis")) (int .Values.redis.port) }}
{{- else if .Values.redis.external.address }}
{{- $address := .Values.redis.external.address }}
{{- ternary $address (printf "redis://%s/0" $address) (contains "://" $address) }}
{{- end }}
{{- end }}

{{/* GPUs per worker pod: the explicit value, else one per rank (tp x pp x pcp x dcp; ep adds no rank). */}}
{{- define "baton.gpus" -}}
{{- if ne .device "cuda" }}0
{{- else if kindIs "invalid" .gpus }}
{{- mul .parallel.tp .parallel.pp .parallel.pcp .parallel.dcp }}
{{- else }}
{{- .gpus }}
{{- end }}
{{- end }}

{{/* Environment shared by every Baton container: who and where it is, and the cache tier. */}}
{{- define "baton.commonEnv" -}}
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: POD_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
{{- with include "baton.redisUrl" . }}
- name: BATON_REDIS_URL
  value: {{ . | quote }}
{{- end }}
{{- end }}

{{/* The three gRPC health probes; call with (dict "probes" .probes "port" "grpc"). */}}
{{- define "baton.grpcProbes" -}}
{{- range $kind := list "startup" "readiness" "liveness" }}
{{ $kind }}Probe:
  {{- if $.internalTls }}
  exec:
    command:
      - python
      - -m
      - common.rpc.health_probe
      - 127.0.0.1:{{ $.port }}
      {{- include "baton.internalTlsFlags" $ | nindent 6 }}
  {{- else }}
  grpc:
    port: {{ $.port }}
  {{- end }}
  {{- toYaml (index $.probes $kind) | nindent 2 }}
{{- end }}
{{- end }}

{{/* The model volume, mounted read-only wherever a Baton process runs. */}}
{{- define "baton.modelVolume" -}}
- name: model
{{- if .Values.model.volume }}
  {{- toYaml .Values.model.volume | nindent 2 }}
{{- else }}
  persistentVolumeClaim:
    claimName: {{ required "model.claimName or model.volume: say where the checkpoint is" .Values.model.claimName }}
    readOnly: true
{{- end }}
{{- end }}

{{/* The node directory of HiCache's shared-memory page files (hicache.sharedMemory.hostPath), as the
tier's pod and the workers' pods mount it. */}}
{{- define "baton.hicacheSharedMemoryVolume" -}}
- name: hicache-shared-memory
  hostPath:
    path: {{ .Values.hicache.sharedMemory.hostPath }}
    type: DirectoryOrCreate
{{- end }}

{{/* Where the workers mount that directory: hicache.sharedMemory.mountPath while HiCache is on and
has one, else empty. */}}
{{- define "baton.hicacheSharedMemoryMountPath" -}}
{{- with .Values.hicache }}
{{- if and .enabled .sharedMemory.hostPath }}{{ .sharedMemory.mountPath }}{{ end }}
{{- end }}
{{- end }}

{{/* Checks across keys that values.schema.json cannot express. */}}
{{- define "baton.validate" -}}
{{- range $component := list "prefill" "decode" }}
{{- $c := index $.Values $component }}
{{- if le (int $c.terminationGracePeriodSeconds) (add $c.preStopSleepSeconds $c.drainSeconds | int) }}
{{- fail (printf "%s.terminationGracePeriodSeconds (%v) must exceed %s.preStopSleepSeconds + %s.drainSeconds (%v + %v): both run inside the grace period" $component $c.terminationGracePeriodSeconds $component $component $c.preStopSleepSeconds $c.drainSeconds) }}
{{- end }}
{{- end }}
{{- with .Values.router }}
{{- if le (int .terminationGracePeriodSeconds) (add .preStopSleepSeconds .drainSeconds | int) }}
{{- fail (printf "router.terminationGracePeriodSeconds (%v) must exceed router.preStopSleepSeconds + router.drainSeconds (%v + %v): both run inside the grace period" .terminationGracePeriodSeconds .preStopSleepSeconds .drainSeconds) }}
{{- end }}
{{- end }}
{{- with include "baton.hicacheSharedMemoryMountPath" $ }}
{{- if has (clean .) (list "/dev/shm" "/etc/baton" (clean $.Values.model.mountPath)) }}
{{- fail (printf "hicache.sharedMemory.mountPath (%s) is a path the workers already mount (/dev/shm, /etc/baton, model.mountPath): give the tier's page files a directory of their own" .) }}
{{- end }}
{{- end }}
{{- if .Values.hicache.enabled }}
{{- range $role := list "prefill" "decode" }}
{{- $engine := (index $.Values $role).engine }}
{{- if or (gt (float64 (default 0 $engine.hostCacheGib)) 0.0) $engine.hostCacheAddress }}
{{- fail (printf "hicache.enabled: the workers use their node's tier; leave %s.engine.hostCacheGib and %s.engine.hostCacheAddress unset" $role $role) }}
{{- end }}
{{- end }}
{{- end }}
{{- if and .Values.redis.enabled .Values.redis.external.address }}
{{- fail "redis: set either redis.enabled (an in-chart Redis) or redis.external.address, not both" }}
{{- end }}
{{- range $role := list "prefill" "decode" }}
{{- $w := index $.Values $role }}
{{- if and (ne $w.device "cuda") (not (kindIs "invalid" $w.gpus)) }}
{{- fail (printf "%s.gpus is set but %s.device is %s: GPUs are requested only for device cuda" $role $role $w.device) }}
{{- end }}
{{- $p := $w.parallel }}
{{- if mod (mul $p.tp $p.dcp) $p.ep }}
{{- fail (printf "%s.parallel.ep (%v) must divide %s.parallel.tp x dcp (%v x %v): expert parallelism spans ranks that hold the same tokens" $role $p.ep $role $p.tp $p.dcp) }}
{{- end }}
{{- if and (eq $w.device "cuda") (not (kindIs "invalid" $w.gpus)) (lt (int $w.gpus) (int (include "baton.gpus" (dict "device" "cuda" "gpus" nil "parallel" $p)))) }}
{{- fail (printf "%s.gpus (%v) is fewer than the %s.parallel ranks (tp x pp x pcp x dcp = %v): each rank needs its own GPU" $role $w.gpus $role (include "baton.gpus" (dict "device" "cuda" "gpus" nil "parallel" $p))) }}
{{- end }}
{{- end }}
{{- end }}

{{/*
A worker's config file (`baton worker --config`, services/worker_config.py): WorkerConfig fields at the
top, EngineConfig fields under engine:, the role's parallel degrees among them. The role's engine values are camelCase here and snake_case there
(maxNumSeqs -> max_num_seqs); a null one is left out, so the worker's default holds. Call with (dict
"root" $ "component" "prefill").
*/}}
{{- define "baton.workerConfig" -}}
{{- $w := index .root.Values .component -}}
{{- $engine := dict "model" (include "baton.modelPath" .root) "device" $w.device "dtype" $w.dtype -}}
{{- range $key, $value := $w.engine }}
{{- if not (kindIs "invalid" $value) }}
{{- $_ := set $engine (snakecase $key) $value }}
{{- end }}
{{- end }}
{{- range $key, $value := $w.parallel }}
{{- $_ := set $engine $key $value }}
{{- end }}
{{- $config := dict "role" .component "host" "0.0.0.0" "port" $w.port "metrics_port" $w.metricsPort -}}
{{- $_ := set $config "transfer_backend" .root.Values.transfer.backend -}}
{{- $_ := set $config "handoff_checksum" (ne .root.Values.transfer.handoffChecksum false) -}}
{{- $_ := set $config "grace_period_s" $w.drainSeconds -}}
{{- with include "baton.redisUrl" .root }}
{{- $_ := set $config "redis_url" . -}}
{{- end }}
{{- $_ := set $config "engine" $engine -}}
{{- toYaml $config -}}
{{- end }}

{{/* The cluster secret's Secret (templates/cluster-secret.yaml), its volume, mount and flag. */}}
{{- define "baton.clusterSecretName" -}}
{{- include "baton.componentName" (dict "root" . "component" "cluster-secret") }}
{{- end }}

{{- define "baton.clusterSecretVolume" -}}
- name: cluster-secret
  secret:
    secretName: {{ include "baton.clusterSecretName" . }}
    # Readable by the container's (non-root) user; the file is in this pod's mount only.
    defaultMode: 0444
{{- end }}

{{- define "baton.clusterSecretMount" -}}
- name: cluster-secret
  mountPath: /var/run/baton/cluster-secret
  readOnly: true
{{- end }}

{{- define "baton.clusterSecretFlag" -}}
- --cluster-secret-file=/var/run/baton/cluster-secret/cluster-secret
{{- end }}

{{/* Internal mutual TLS (internalTls): the Secret's volume, mount and the three flags (used only with
internalTls.enabled). */}}
{{- define "baton.internalTlsVolume" -}}
- name: internal-tls
  secret:
    secretName: {{ .Values.internalTls.secretName }}
    defaultMode: 0444
{{- end }}

{{- define "baton.internalTlsMount" -}}
- name: internal-tls
  mountPath: /var/run/baton/internal-tls
  readOnly: true
{{- end }}

{{- define "baton.internalTlsFlags" -}}
- --internal-tls-cert=/var/run/baton/internal-tls/tls.crt
- --internal-tls-key=/var/run/baton/internal-tls/tls.key
- --internal-tls-ca=/var/run/baton/internal-tls/ca.crt
{{- end }}
