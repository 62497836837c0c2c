{{/* What differs between the router, the estimator and the predictor (used by services.yaml). */}}

{{/* The components that run as Deployments of their own, as a JSON list: the router alone with router.inProcess. */}}
{{- define "bear.serviceComponents" -}}
{{- ternary (list "router") (list "router" "estimator" "predictor") .Values.router.inProcess | toJson -}}
{{- end -}}

{{/* The components whose pods load the predictor's artifact, as a JSON list. */}}
{{- define "bear.predictorHosts" -}}
{{- ternary (list "router") (list "predictor") .Values.router.inProcess | toJson -}}
{{- end -}}

{{- define "bear.routerEnv" -}}
{{- if .Values.router.inProcess }}
- name: BEAR_ROUTER_IN_PROCESS
  value: predictor,estimator
{{ include "bear.predictorEnv" . }}
- name: BEAR_MAX_SNAPSHOT_AGE_S
  value: {{ .Values.estimator.maxSnapshotAgeSeconds | toString | quote }}
{{- else }}
- name: BEAR_ESTIMATOR_ADDRESS
  value: {{ printf "%s:%v" (include "bear.componentName" (dict "root" . "component" "estimator")) (int64 .Values.estimator.grpcPort) | quote }}
- name: BEAR_PREDICTOR_ADDRESS
  value: {{ printf "%s:%v" (include "bear.componentName" (dict "root" . "component" "predictor")) (int64 .Values.predictor.grpcPort) | quote }}
- name: BEAR_ROUTER_UPSTREAM_STREAMS
  value: {{ include "bear.upstreamStreams" . | quote }}
{{- end }}
- name: BEAR_DEFAULT_POLICY
  value: {{ .Values.router.defaultPolicy | quote }}
{{ include "bear.discoveryEnv" . }}
{{- end -}}

{{/* Streams the router opens to each of the estimator and the predictor, balanced round-robin over their pods (their
Services are headless): four per pod of the larger of the two, as many pods as either may scale to, at least 4 and at
most 64. gRPC's picker starts from a random pod each time one connects or goes, so one stream per pod would leave
some pods without a router's streams for a while; with four, each gets about its share. */}}
{{- define "bear.upstreamStreams" -}}
{{- $pods := 0 -}}
{{- range $component := list "estimator" "predictor" -}}
{{- $values := index $.Values $component -}}
{{- $pods = max $pods (int64 $values.replicas) -}}
{{- if $values.autoscaling.enabled -}}
{{- $pods = max $pods (int64 $values.autoscaling.maxReplicas) -}}
{{- end -}}
{{- end -}}
{{- min 64 (max 4 (mul 4 $pods)) -}}
{{- end -}}

{{- define "bear.estimatorEnv" -}}
- name: BEAR_MAX_SNAPSHOT_AGE_S
  value: {{ .Values.estimator.maxSnapshotAgeSeconds | toString | quote }}
- name: BEAR_PREDICTOR_ADDRESS
  value: {{ printf "%s:%v" (include "bear.componentName" (dict "root" . "component" "predictor")) (int64 .Values.predictor.grpcPort) | quote }}
{{ include "bear.discoveryEnv" . }}
{{- end -}}

{{- define "bear.predictorEnv" -}}
{{- $artifact := .Values.predictor.artifact -}}
- name: BEAR_PREDICTOR_MODEL_DIR
  value: {{ include "bear.literal" (ternary $artifact.image.path "/var/lib/bear/predictor" (eq $artifact.source "image")) | quote }}
{{- end -}}

{{- define "bear.discoveryEnv" -}}
- name: BEAR_DISCOVERY
  value: kubernetes
- name: BEAR_NAMESPACE
  value: $(POD_NAMESPACE)
- name: BEAR_POOLS_FILE
  value: /etc/bear/pools/pools.yaml
{{- end -}}

{{- define "bear.routerMounts" -}}
{{ include "bear.estimatorMounts" . }}
{{- if .Values.router.inProcess }}
{{ include "bear.predictorMounts" . }}
{{- end }}
{{- end -}}

{{- define "bear.estimatorMounts" -}}
- name: pools
  mountPath: /etc/bear/pools
  readOnly: true
{{- end -}}

{{- define "bear.predictorMounts" -}}
{{- $artifact := .Values.predictor.artifact -}}
{{- if ne $artifact.source "image" -}}
- name: predictor-artifact
  mountPath: /var/lib/bear/predictor
  readOnly: true
  {{- if and (eq $artifact.source "persistentVolumeClaim") $artifact.persistentVolumeClaim.subPath }}
  subPath: {{ $artifact.persistentVolumeClaim.subPath | quote }}
  {{- end }}
{{- end -}}
{{- end -}}

{{- define "bear.routerVolumes" -}}
{{ include "bear.estimatorVolumes" . }}
{{- if .Values.router.inProcess }}
{{ include "bear.predictorVolumes" . }}
{{- end }}
{{- end -}}

{{- define "bear.estimatorVolumes" -}}
- name: pools
  configMap:
    name: {{ include "bear.componentName" (dict "root" . "component" "pools") }}
{{- end -}}

{{- define "bear.predictorVolumes" -}}
{{- $artifact := .Values.predictor.artifact -}}
{{- if eq $artifact.source "configMap" -}}
- name: predictor-artifact
  configMap:
    name: {{ default (include "bear.componentName" (dict "root" . "component" "predictor-artifact")) $artifact.configMap.name | quote }}
{{- else if eq $artifact.source "persistentVolumeClaim" -}}
- name: predictor-artifact
  persistentVolumeClaim:
    claimName: {{ required "predictor.artifact.persistentVolumeClaim.claimName is required with source persistentVolumeClaim" $artifact.persistentVolumeClaim.claimName | quote }}
    readOnly: true
{{- end -}}
{{- end -}}

{{/* The environment the chart gives vLLM (bear.env adds vllm.env). */}}
{{- define "bear.vllmEnv" -}}
- name: BEAR_SNAPSHOT_REGION
  value: {{ .Values.vllm.snapshotter.region | quote }}
- name: HOME
  value: /tmp
- name: USER  # for libraries that ask for a user name (any uid works, with or without a passwd entry)
  value: bear
- name: HF_HOME
  value: /cache/huggingface
- name: VLLM_CACHE_ROOT
  value: /cache/vllm
- name: XDG_CACHE_HOME
  value: /cache/xdg
- name: TRITON_CACHE_DIR
  value: /cache/triton
{{- end -}}

{{/* The environment the chart gives a pool's snapshotter sidecar (bear.env adds vllm.snapshotter.env); its ports
come from its flags alone (--grpc-port, --metrics-port), which win over the environment:
(dict "root" $ "pool" $pool "model" served model name) */}}
{{- define "bear.sidecarEnv" -}}
{{- $root := .root -}}
{{- $snapshotter := $root.Values.vllm.snapshotter -}}
{{ include "bear.podEnv" $root }}
- name: BEAR_SNAPSHOT_REGION
  value: {{ $snapshotter.region | quote }}
- name: BEAR_INSTANCE_ID
  value: $(POD_NAME)
- name: BEAR_POOL
  value: {{ .pool.name | quote }}
- name: BEAR_MODEL
  value: {{ include "bear.literal" .model | quote }}
- name: BEAR_INSTANCE_ENDPOINT
  value: {{ printf "http://%s:%v" (include "bear.podIPInAddress" $root) (int64 $root.Values.vllm.port) | quote }}
# Registered once vLLM answers /health, withdrawn within about a second when it stops.
- name: BEAR_ENGINE_HEALTH_URL
  value: {{ printf "http://localhost:%v/health" (int64 $root.Values.vllm.port) | quote }}
{{- /* No prices: the router and the estimator take them from the pools file (a change rolls them, not the GPU pods,
whose restart reloads the weights); the sidecar's registration would only repeat them. */}}
- name: BEAR_SNAPSHOTTER_ENDPOINT
  value: {{ printf "%s:%v" (include "bear.podIPInAddress" $root) (int64 $snapshotter.grpcPort) | quote }}
- name: BEAR_SNAPSHOTTER_POLL_INTERVAL_MS
  value: {{ $snapshotter.pollIntervalMs | quote }}
{{ include "bear.redisEnv" $root }}
{{ include "bear.homeEnv" $root }}
{{- end -}}
