{{/* Names, labels, images and the environment every BEAR container shares. */}}

{{- define "bear.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "bear.fullname" -}}
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

{{/* A component's resource name: (dict "root" $ "component" "router") */}}
{{- define "bear.componentName" -}}
{{- printf "%s-%s" (include "bear.fullname" .root) .component | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* A pool's resource name: (dict "root" $ "pool" $pool) */}}
{{- define "bear.poolName" -}}
{{- printf "%s-engine-%s" (include "bear.fullname" .root) .pool.name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "bear.selectorLabels" -}}
app.kubernetes.io/name: {{ include "bear.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* Labels of every object: (dict "root" $ "component" "router") */}}
{{- define "bear.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "bear.selectorLabels" . }}
app.kubernetes.io/part-of: bear
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
{{- end -}}

{{/* The labels that select a pool's pods (also written into the pools file for discovery). */}}
{{- define "bear.poolSelectorLabels" -}}
{{ include "bear.selectorLabels" (dict "root" .root "component" "engine") }}
bear.dev/pool: {{ .pool.name }}
{{- end -}}

{{- define "bear.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "bear.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* "repository:tag" with the tag defaulting to the appVersion: (dict "root" $ "image" $image) */}}
{{- define "bear.imageRef" -}}
{{- printf "%s:%s" .image.repository (default .root.Chart.AppVersion (toString (default "" .image.tag))) -}}
{{- end -}}

{{/* The name BEAR and clients know a pool's model by. */}}
{{- define "bear.servedModelName" -}}
{{- default (last (splitList "/" .model)) .servedModelName -}}
{{- end -}}

{{- define "bear.redisUrl" -}}
{{- if .Values.redis.enabled -}}
{{- printf "redis://%s:6379/0" (include "bear.componentName" (dict "root" . "component" "redis")) -}}
{{- else -}}
{{- required "redis.url is required when redis.enabled is false" .Values.redis.url -}}
{{- end -}}
{{- end -}}

{{/* The pod's identity from the downward API; later variables may use $(POD_NAME) and $(POD_IP). */}}
{{- define "bear.podEnv" -}}
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: POD_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
- name: POD_IP
  valueFrom:
    fieldRef:
      fieldPath: status.podIP
- name: NODE_NAME
  valueFrom:
    fieldRef:
      fieldPath: spec.nodeName
{{- end -}}

{{/* Redis settings of every BEAR container (bear.common.redis_config). */}}
{{- define "bear.redisEnv" -}}
{{- $redis := .Values.redis -}}
- name: BEAR_REDIS_URL
  value: {{ include "bear.redisUrl" . | quote }}
- name: BEAR_REDIS_TIMEOUT_S
  value: {{ $redis.timeoutSeconds | quote }}
{{- if $redis.existingSecret }}
- name: BEAR_REDIS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ $redis.existingSecret }}
      key: {{ $redis.existingSecretPasswordKey }}
{{- end }}
{{- if $redis.tls.enabled }}
- name: BEAR_REDIS_TLS
  value: "true"
{{- if $redis.tls.existingSecret }}
- name: BEAR_REDIS_TLS_CA_FILE
  value: {{ printf "/etc/bear/redis-tls/%s" $redis.tls.caKey | quote }}
{{- if $redis.tls.certKey }}
- name: BEAR_REDIS_TLS_CERT_FILE
  value: {{ printf "/etc/bear/redis-tls/%s" $redis.tls.certKey | quote }}
- name: BEAR_REDIS_TLS_KEY_FILE
  value: {{ printf "/etc/bear/redis-tls/%s" (required "redis.tls.keyKey is required with redis.tls.certKey" $redis.tls.keyKey) | quote }}
{{- end }}
{{- end }}
{{- end }}
{{- end -}}

{{/* OpenTelemetry settings (the standard OTEL_* variables): (dict "root" $ "service" "bear-router") */}}
{{- define "bear.otelEnv" -}}
{{- $otel := .root.Values.otel -}}
- name: OTEL_SERVICE_NAME
  value: {{ .service | quote }}
{{- if $otel.endpoint }}
- name: OTEL_EXPORTER_OTLP_ENDPOINT
  value: {{ $otel.endpoint | quote }}
- name: OTEL_EXPORTER_OTLP_PROTOCOL
  value: {{ $otel.protocol | quote }}
- name: OTEL_TRACES_SAMPLER
  value: {{ $otel.sampler | quote }}
- name: OTEL_TRACES_SAMPLER_ARG
  value: {{ $otel.samplerArg | quote }}
- name: OTEL_RESOURCE_ATTRIBUTES
  value: {{ printf "k8s.namespace.name=$(POD_NAMESPACE),k8s.pod.name=$(POD_NAME),k8s.node.name=$(NODE_NAME),service.version=%s%s" .root.Chart.AppVersion (ternary (printf ",%s" $otel.resourceAttributes) "" (ne $otel.resourceAttributes "")) | quote }}
{{- else }}
- name: OTEL_SDK_DISABLED
  value: "true"
{{- end }}
{{- end -}}

{{/* Writable places of a BEAR container whose root filesystem is read-only. */}}
{{- define "bear.homeEnv" -}}
- name: HOME
  value: /tmp
- name: XDG_CACHE_HOME
  value: /tmp/.cache
{{- end -}}

{{- define "bear.redisTlsVolume" -}}
{{- if and .Values.redis.tls.enabled .Values.redis.tls.existingSecret -}}
- name: redis-tls
  secret:
    secretName: {{ .Values.redis.tls.existingSecret }}
{{- end -}}
{{- end -}}

{{- define "bear.redisTlsMount" -}}
{{- if and .Values.redis.tls.enabled .Values.redis.tls.existingSecret -}}
- name: redis-tls
  mountPath: /etc/bear/redis-tls
  readOnly: true
{{- end -}}
{{- end -}}

{{/* Pod annotations: the Prometheus scrape hints and the component's own. (dict "root" $ "port" 9464 "extra" $map) */}}
{{- define "bear.podAnnotations" -}}
{{- $annotations := deepCopy (default (dict) .extra) -}}
{{- if .root.Values.metrics.scrapeAnnotations -}}
{{- $_ := set $annotations "prometheus.io/scrape" "true" -}}
{{- $_ := set $annotations "prometheus.io/port" (toString .port) -}}
{{- $_ := set $annotations "prometheus.io/path" "/metrics" -}}
{{- end -}}
{{- with $annotations -}}
{{- toYaml . -}}
{{- end -}}
{{- end -}}

{{/* Checks that templates cannot leave to the schema. */}}
{{- define "bear.validate" -}}
{{- if and .Values.redis.enabled .Values.redis.tls.enabled -}}
{{- fail "redis.tls applies to an external Redis: set redis.enabled=false and redis.url" -}}
{{- end -}}
{{- $names := list -}}
{{- range .Values.pools -}}
{{- if has .name $names -}}
{{- fail (printf "pools: the name %q is used twice" .name) -}}
{{- end -}}
{{- $names = append $names .name -}}
{{- if and (gt (int .gpusPerReplica) 0) (gt (int (default 1 .tensorParallelSize)) (int .gpusPerReplica)) -}}
{{- fail (printf "pools[%s]: tensorParallelSize (%v) exceeds gpusPerReplica (%v)" .name .tensorParallelSize .gpusPerReplica) -}}
{{- end -}}
{{- end -}}
{{- end -}}
