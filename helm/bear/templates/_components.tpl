{{/* What differs between the router, the estimator and the predictor (used by services.yaml). */}}

{{- define "bear.routerEnv" -}}
- name: BEAR_ESTIMATOR_ADDRESS
  value: {{ printf "%s:%v" (include "bear.componentName" (dict "root" . "component" "estimator")) .Values.estimator.grpcPort | quote }}
- name: BEAR_PREDICTOR_ADDRESS
  value: {{ printf "%s:%v" (include "bear.componentName" (dict "root" . "component" "predictor")) .Values.predictor.grpcPort | quote }}
- name: BEAR_DEFAULT_POLICY
  value: {{ .Values.router.defaultPolicy | quote }}
{{ include "bear.discoveryEnv" . }}
{{- end -}}

{{- define "bear.estimatorEnv" -}}
- name: BEAR_MAX_SNAPSHOT_AGE_S
  value: {{ .Values.estimator.maxSnapshotAgeSeconds | toString | quote }}
- name: BEAR_PREDICTOR_ADDRESS
  value: {{ printf "%s:%v" (include "bear.componentName" (dict "root" . "component" "predictor")) .Values.predictor.grpcPort | quote }}
{{ include "bear.discoveryEnv" . }}
{{- end -}}

{{- define "bear.predictorEnv" -}}
{{- $artifact := .Values.predictor.artifact -}}
- name: BEAR_PREDICTOR_MODEL_DIR
  value: {{ ternary $artifact.image.path "/var/lib/bear/predictor" (eq $artifact.source "image") | quote }}
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
- name: pools
  mountPath: /etc/bear/pools
  readOnly: true
{{- end -}}

{{- define "bear.estimatorMounts" -}}
{{ include "bear.routerMounts" . }}
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
- name: pools
  configMap:
    name: {{ include "bear.componentName" (dict "root" . "component" "pools") }}
{{- end -}}

{{- define "bear.estimatorVolumes" -}}
{{ include "bear.routerVolumes" . }}
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
