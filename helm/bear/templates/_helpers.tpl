{{/* Names, labels, images and the environment every BEAR container shares. */}}

{{- define "bear.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* A name of at most `max` characters (63 for most objects) that stays unique: a longer one keeps its beginning
and its `suffix` (what tells the objects of a release apart: "-router", "-engine-<pool>") and puts a hash of the
whole between them, so two long names with the same first characters still differ and still say what they are. A
short name is kept as it is. (dict "name" $name "suffix" "-router" "max" 63); `name` is the whole when there is no
suffix. */}}
{{- define "bear.boundedName" -}}
{{- $suffix := default "" .suffix -}}
{{- $whole := printf "%s%s" .name $suffix -}}
{{- if le (len $whole) (int .max) -}}
{{- $whole -}}
{{- else -}}
{{- $room := sub (sub (int .max) 9) (len $suffix) | int -}}
{{- printf "%s-%s%s" (trunc $room .name | trimSuffix "-") (sha256sum $whole | trunc 8) $suffix -}}
{{- end -}}
{{- end -}}

{{- define "bear.fullname" -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- $full := .Values.fullnameOverride -}}
{{- if not $full -}}
{{- $full = ternary .Release.Name (printf "%s-%s" .Release.Name $name) (contains $name .Release.Name) -}}
{{- end -}}
{{- include "bear.boundedName" (dict "name" $full "max" 63) -}}
{{- end -}}

{{/* A component's resource name: (dict "root" $ "component" "router") */}}
{{- define "bear.componentName" -}}
{{- include "bear.boundedName" (dict "name" (include "bear.fullname" .root) "suffix" (printf "-%s" .component) "max" 63) -}}
{{- end -}}

{{/* A pool's resource name: (dict "root" $ "pool" $pool) */}}
{{- define "bear.poolName" -}}
{{- include "bear.boundedName" (dict "name" (include "bear.fullname" .root) "suffix" (printf "-engine-%s" .pool.name) "max" 63) -}}
{{- end -}}

{{/* The bundled Redis's StatefulSet and Service: at most 52 characters, since the StatefulSet controller labels its
pods with `controller-revision-hash: <name>-<10-character hash>`, a label value of at most 63. */}}
{{- define "bear.redisName" -}}
{{- include "bear.boundedName" (dict "name" (include "bear.fullname" .) "suffix" "-redis" "max" 52) -}}
{{- end -}}

{{/* Label values are quoted: a release or pool named 123, on or null is still a string. */}}
{{- define "bear.selectorLabels" -}}
app.kubernetes.io/name: {{ include "bear.name" .root | quote }}
app.kubernetes.io/instance: {{ .root.Release.Name | quote }}
app.kubernetes.io/component: {{ .component | quote }}
{{- end -}}

{{/* Labels of every object: (dict "root" $ "component" "router") */}}
{{- define "bear.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "bear.selectorLabels" . }}
app.kubernetes.io/part-of: bear
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service | quote }}
{{- end -}}

{{/* Labels of a pod template: the selector's and those that never change with the chart, so that an upgrade that
changes nothing of a pod (a new chart version, an appVersion with the images pinned) does not roll it; a vLLM pod's
restart reloads its weights. helm.sh/chart and app.kubernetes.io/version stay on the objects themselves:
(dict "root" $ "component" "router") */}}
{{- define "bear.podLabels" -}}
{{ include "bear.selectorLabels" . }}
app.kubernetes.io/part-of: bear
app.kubernetes.io/managed-by: {{ .root.Release.Service | quote }}
{{- end -}}

{{/* The labels that select a pool's pods (also written into the pools file for discovery). */}}
{{- define "bear.poolSelectorLabels" -}}
{{ include "bear.selectorLabels" (dict "root" .root "component" "engine") }}
bear.dev/pool: {{ .pool.name | quote }}
{{- end -}}

{{/* Labels of a pool's objects (Deployment, PodDisruptionBudget): (dict "root" $ "pool" $pool) */}}
{{- define "bear.poolLabels" -}}
{{ include "bear.labels" (dict "root" .root "component" "engine") }}
bear.dev/pool: {{ .pool.name | quote }}
{{- end -}}

{{/* Labels of a pool's pods (see bear.podLabels): (dict "root" $ "pool" $pool) */}}
{{- define "bear.poolPodLabels" -}}
{{ include "bear.podLabels" (dict "root" .root "component" "engine") }}
bear.dev/pool: {{ .pool.name | quote }}
{{- end -}}

{{- define "bear.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "bear.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The predictor's image with source image (a YAML map: read it with fromYaml): predictor.artifact.image, whose
empty fields come from the BEAR image's, and whose repository is by default the BEAR image's + "-predictor". Never the
BEAR image's digest: that pins another image. */}}
{{- define "bear.predictorImage" -}}
{{- $artifact := .Values.predictor.artifact.image -}}
{{- $repository := default (printf "%s-predictor" .Values.image.repository) $artifact.repository -}}
{{- toYaml (merge (dict "repository" $repository) (deepCopy $artifact) (omit .Values.image "digest")) -}}
{{- end -}}

{{/* A pool's vLLM image (a YAML map: read it with fromYaml): the pool's `image` over vllm.image; a pool that names
its own repository or tag takes no digest from vllm.image (it pins another image). (dict "root" $ "pool" $pool) */}}
{{- define "bear.poolImage" -}}
{{- $over := default (dict) .pool.image -}}
{{- $base := deepCopy .root.Values.vllm.image -}}
{{- if or $over.repository $over.tag -}}
{{- $base = omit $base "digest" -}}
{{- end -}}
{{- toYaml (mergeOverwrite $base (deepCopy $over)) -}}
{{- end -}}

{{/* "repository@digest" when a digest pins the image, else "repository:tag" with the tag (a string, by the schema)
defaulting to the appVersion: (dict "root" $ "image" $image) */}}
{{- define "bear.imageRef" -}}
{{- if .image.digest -}}
{{- printf "%s@%s" .image.repository .image.digest -}}
{{- else -}}
{{- printf "%s:%s" .image.repository (default .root.Chart.AppVersion .image.tag) -}}
{{- end -}}
{{- end -}}

{{/* The name BEAR and clients know a pool's model by: servedModelName, else the last component of the model's path. */}}
{{- define "bear.servedModelName" -}}
{{- $name := default (last (splitList "/" (trimSuffix "/" .model))) .servedModelName -}}
{{- required (printf "pools[%s]: set servedModelName, model %q has no last path component to name it by" .name .model) $name -}}
{{- end -}}

{{/* Text from the values placed in a container's env value or args, so that it reaches the process as written:
Kubernetes expands $(VAR) there and turns $$ into $, so every $ is doubled (a Redis password "pa$$w0rd" arrives
whole, a path with $(X) keeps it). Not for the operator's own `env` entries, written in Kubernetes' syntax on
purpose, nor for the chart's own $(POD_IP), $(POD_NAME), ... */}}
{{- define "bear.literal" -}}
{{- replace "$" "$$" (toString .) -}}
{{- end -}}

{{/* A pool's async scheduling, as JSON {"on": true or false, "field": where it is set}: the pool's own
asyncScheduling where it sets one (null or absent: none), else vllm.asyncScheduling: (dict "root" $ "pool" $pool) */}}
{{- define "bear.poolAsyncScheduling" -}}
{{- if kindIs "bool" .pool.asyncScheduling -}}
{{- toJson (dict "on" .pool.asyncScheduling "field" (printf "pools[%s].asyncScheduling" .pool.name)) -}}
{{- else -}}
{{- toJson (dict "on" .root.Values.vllm.asyncScheduling "field" "vllm.asyncScheduling") -}}
{{- end -}}
{{- end -}}

{{/* The extra arguments of a pool's `vllm serve`, as a JSON list: vllm.extraArgs, then the pool's own (vLLM takes
the last of a flag given twice, so the pool's win): (dict "root" $ "pool" $pool) */}}
{{- define "bear.poolExtraArgs" -}}
{{- concat (default list .root.Values.vllm.extraArgs) (default list .pool.extraArgs) | toJson -}}
{{- end -}}

{{/* A vLLM probe: the values' block, with the default handler (GET /health on the `http` port) only if the block
names none, so that a handler given in the values replaces the default instead of joining it. A block set to null
renders as null: no probe. */}}
{{- define "bear.vllmProbe" -}}
{{- if . -}}
{{- $probe := deepCopy . -}}
{{- if not (or .httpGet .tcpSocket .exec .grpc) -}}
{{- $_ := set $probe "httpGet" (dict "path" "/health" "port" "http") -}}
{{- end -}}
{{- toYaml $probe -}}
{{- end -}}
{{- end -}}

{{/* A number (a price) as text that both YAML 1.1 (PyYAML, the pools file's reader) and Python's float() read back as
that number: Go writes 1e-07, which YAML 1.1 takes for a string until its mantissa has a dot (1.0e-07). */}}
{{- define "bear.yamlNumber" -}}
{{- $text := toString . -}}
{{- if and (contains "e" $text) (not (contains "." $text)) -}}
{{- replace "e" ".0e" $text -}}
{{- else -}}
{{- $text -}}
{{- end -}}
{{- end -}}

{{/* A value that is a whole number or a string (a Kubernetes quantity, a percentage): the number written out in
full (Helm reads the values' numbers as floats, which print 1000000 as 1e+06), the string quoted. */}}
{{- define "bear.intOrString" -}}
{{- if kindIs "string" . -}}
{{- quote . -}}
{{- else -}}
{{- int64 . -}}
{{- end -}}
{{- end -}}

{{- define "bear.redisUrl" -}}
{{- if .Values.redis.enabled -}}
{{- printf "redis://%s:6379/0" (include "bear.redisName" .) -}}
{{- else -}}
{{- required "redis.url is required when redis.enabled is false" .Values.redis.url -}}
{{- end -}}
{{- end -}}

{{/* $(POD_IP) as the host of an address with a port: in brackets where it is an IPv6 address. */}}
{{- define "bear.podIPInAddress" -}}
{{- ternary "[$(POD_IP)]" "$(POD_IP)" (eq .Values.podIPFamily "IPv6") -}}
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

{{/* "true" when BEAR talks TLS to Redis: redis.tls.enabled, or a rediss:// URL, its scheme in any case (as Redis's
client reads it; the chart then sets BEAR_REDIS_TLS, so that bear.common.redis_config reads it so too). */}}
{{- define "bear.redisUsesTls" -}}
{{- if or .Values.redis.tls.enabled (hasPrefix "rediss://" (lower (include "bear.redisUrl" .))) -}}
true
{{- end -}}
{{- end -}}

{{/* Redis settings of every BEAR container (bear.common.redis_config). */}}
{{- define "bear.redisEnv" -}}
{{- $redis := .Values.redis -}}
- name: BEAR_REDIS_URL
  value: {{ include "bear.literal" (include "bear.redisUrl" .) | quote }}
- name: BEAR_REDIS_TIMEOUT_S
  value: {{ $redis.timeoutSeconds | quote }}
{{- if $redis.existingSecret }}
- name: BEAR_REDIS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ $redis.existingSecret | quote }}
      key: {{ $redis.existingSecretPasswordKey | quote }}
{{- end }}
{{- if include "bear.redisUsesTls" . }}
- name: BEAR_REDIS_TLS
  value: "true"
{{- if $redis.tls.existingSecret }}
{{- if $redis.tls.caKey }}
- name: BEAR_REDIS_TLS_CA_FILE
  value: {{ printf "/etc/bear/redis-tls/%s" (include "bear.literal" $redis.tls.caKey) | quote }}
{{- end }}
{{- if $redis.tls.certKey }}
- name: BEAR_REDIS_TLS_CERT_FILE
  value: {{ printf "/etc/bear/redis-tls/%s" (include "bear.literal" $redis.tls.certKey) | quote }}
- name: BEAR_REDIS_TLS_KEY_FILE
  value: {{ printf "/etc/bear/redis-tls/%s" (include "bear.literal" $redis.tls.keyKey) | quote }}
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
  value: {{ include "bear.literal" $otel.endpoint | quote }}
- name: OTEL_EXPORTER_OTLP_PROTOCOL
  value: {{ $otel.protocol | quote }}
- name: OTEL_TRACES_SAMPLER
  value: {{ $otel.sampler | quote }}
- name: OTEL_TRACES_SAMPLER_ARG
  value: {{ $otel.samplerArg | quote }}
- name: OTEL_RESOURCE_ATTRIBUTES
  value: {{ printf "k8s.namespace.name=$(POD_NAMESPACE),k8s.pod.name=$(POD_NAME),k8s.node.name=$(NODE_NAME),service.version=%s%s" .root.Chart.AppVersion (ternary (printf ",%s" (include "bear.literal" $otel.resourceAttributes)) "" (ne (default "" $otel.resourceAttributes) "")) | quote }}
{{- else }}
- name: OTEL_SDK_DISABLED
  value: "true"
{{- end }}
{{- end -}}

{{/* Writable places of a BEAR container whose root filesystem is read-only. */}}
{{/* A container's environment: the chart's entries (`chart`, YAML list text) with the operator's (`extra`, a list
from the values at `field`) in place of those of the same name, and the operator's others after them. A pod whose
env names a variable twice is refused by server-side apply (Helm 4's default), and which one a container gets is
otherwise left to the order. */}}
{{- define "bear.env" -}}
{{- include "bear.checkEnv" (dict "field" .field "env" .extra) -}}
{{- $extra := dict -}}
{{- range (default list .extra) -}}
{{- $_ := set $extra (toString .name) . -}}
{{- end -}}
{{- $merged := list -}}
{{- $placed := dict -}}
{{- range (fromYamlArray .chart) -}}
{{- if hasKey $extra .name -}}
{{- $merged = append $merged (get $extra .name) -}}
{{- $_ := set $placed .name true -}}
{{- else -}}
{{- $merged = append $merged . -}}
{{- end -}}
{{- end -}}
{{- range (default list .extra) -}}
{{- if not (hasKey $placed (toString .name)) -}}
{{- $merged = append $merged . -}}
{{- end -}}
{{- end -}}
{{- if $merged -}}
{{- toYaml $merged -}}
{{- end -}}
{{- end -}}

{{/* An operator's `env` list (from the values at `field`): every entry named, its `value` a string, no name twice:
(dict "field" "router.env" "env" $.Values.router.env) */}}
{{- define "bear.checkEnv" -}}
{{- $seen := dict -}}
{{- range $i, $entry := (default list .env) -}}
{{- if or (not (kindIs "map" $entry)) (not (get $entry "name")) -}}
{{- fail (printf "%s[%d]: an environment entry needs a name (name: ..., value: ... or valueFrom: ...)" $.field $i) -}}
{{- end -}}
{{- if and (hasKey $entry "value") (not (kindIs "string" $entry.value)) -}}
{{- fail (printf "%s[%d]: the value of %s must be a string (quote a number: \"64\")" $.field $i $entry.name) -}}
{{- end -}}
{{- if hasKey $seen (toString $entry.name) -}}
{{- fail (printf "%s: %s is given twice" $.field $entry.name) -}}
{{- end -}}
{{- $_ := set $seen (toString $entry.name) true -}}
{{- end -}}
{{- end -}}

{{/* A pool's vLLM env as the operator gave it, a JSON list: vllm.env with the pool's `env` entries in place of those
of the same name, and its others after them; each list checked as bear.checkEnv does: (dict "root" $ "pool" $pool) */}}
{{- define "bear.poolEnv" -}}
{{- $base := default list .root.Values.vllm.env -}}
{{- $over := default list .pool.env -}}
{{- include "bear.checkEnv" (dict "field" "vllm.env" "env" $base) -}}
{{- include "bear.checkEnv" (dict "field" (printf "pools[%s].env" .pool.name) "env" $over) -}}
{{- $byName := dict -}}
{{- range $over -}}
{{- $_ := set $byName (toString .name) . -}}
{{- end -}}
{{- $merged := list -}}
{{- range $base -}}
{{- $merged = append $merged (get $byName (toString .name) | default .) -}}
{{- $_ := unset $byName (toString .name) -}}
{{- end -}}
{{- range $over -}}
{{- if hasKey $byName (toString .name) -}}
{{- $merged = append $merged . -}}
{{- end -}}
{{- end -}}
{{- toJson $merged -}}
{{- end -}}

{{- define "bear.homeEnv" -}}
- name: HOME
  value: /tmp
- name: XDG_CACHE_HOME
  value: /tmp/.cache
{{- end -}}

{{- define "bear.redisTlsVolume" -}}
{{- if and (include "bear.redisUsesTls" .) .Values.redis.tls.existingSecret -}}
- name: redis-tls
  secret:
    secretName: {{ .Values.redis.tls.existingSecret | quote }}
{{- end -}}
{{- end -}}

{{- define "bear.redisTlsMount" -}}
{{- if and (include "bear.redisUsesTls" .) .Values.redis.tls.existingSecret -}}
- name: redis-tls
  mountPath: /etc/bear/redis-tls
  readOnly: true
{{- end -}}
{{- end -}}

{{/* Pod annotations: the Prometheus scrape hints and the component's own, which win where both set one (a pod
whose vLLM metrics are to be scraped instead). (dict "root" $ "port" 9464 "extra" $map) */}}
{{- define "bear.podAnnotations" -}}
{{- $annotations := dict -}}
{{- if .root.Values.metrics.scrapeAnnotations -}}
{{- $_ := set $annotations "prometheus.io/scrape" "true" -}}
{{- $_ := set $annotations "prometheus.io/port" (toString (int64 .port)) -}}
{{- $_ := set $annotations "prometheus.io/path" "/metrics" -}}
{{- end -}}
{{- $annotations = merge (deepCopy (default (dict) .extra)) $annotations -}}
{{- with $annotations -}}
{{- toYaml . -}}
{{- end -}}
{{- end -}}

{{/* Ports that share a pod's network must differ: (dict "pod" "the vLLM pods" "ports" (dict "vllm.port" 8000 ...)) */}}
{{- define "bear.checkDistinctPorts" -}}
{{- $fieldOf := dict -}}
{{- range $field, $port := .ports -}}
{{- $key := toString $port -}}
{{- if hasKey $fieldOf $key -}}
{{- fail (printf "%s and %s are both %s: they share %s, so their ports must differ" (index $fieldOf $key) $field $key $.pod) -}}
{{- end -}}
{{- $_ := set $fieldOf $key $field -}}
{{- end -}}
{{- end -}}

{{/* Checks that templates cannot leave to the schema. */}}
{{- define "bear.validate" -}}
{{- $fullname := include "bear.fullname" . -}}
{{- if not (regexMatch "^[a-z]" $fullname) -}}
{{- fail (printf "the resource names start with %q, but Service names must start with a letter: set fullnameOverride" $fullname) -}}
{{- end -}}
{{- if not (regexMatch "^[a-z]([-a-z0-9]*[a-z0-9])?$" $fullname) -}}
{{- fail (printf "the resource names start with %q, but Service names take only lower-case letters, digits and '-' (a DNS-1035 label): choose another release name or set fullnameOverride" $fullname) -}}
{{- end -}}
{{- include "bear.validateRedis" . -}}
{{- if and .Values.rbac.create (not .Values.serviceAccount.create) (not .Values.serviceAccount.name) -}}
{{- fail "rbac.create would let the namespace's default service account, which every pod without one uses, read pods: with serviceAccount.create=false, set serviceAccount.name to the account the router and the estimator run as" -}}
{{- end -}}
{{- if eq (toString .Values.serviceAccount.name) "default" -}}
{{- if .Values.serviceAccount.create -}}
{{- fail "serviceAccount.name: default names the namespace's own service account, which exists already and which every pod without one uses: name the account the chart creates otherwise (or leave the name empty)" -}}
{{- else if .Values.rbac.create -}}
{{- fail "rbac.create would let the namespace's default service account, which every pod without one uses, read pods: set serviceAccount.name to an account of the router and the estimator's own" -}}
{{- end -}}
{{- end -}}
{{- include "bear.validateSnapshotAge" . -}}
{{- include "bear.validateEngineEnv" . -}}
{{- include "bear.validatePortEnv" . -}}
{{- include "bear.validateServedNames" . -}}
{{- include "bear.validateOtel" . -}}
{{- $names := list -}}
{{- range .Values.pools -}}
{{- if has .name $names -}}
{{- fail (printf "pools: the name %q is used twice" .name) -}}
{{- end -}}
{{- $names = append $names .name -}}
{{- include "bear.validateExtraArgs" (dict "pool" . "field" "vllm.extraArgs" "args" $.Values.vllm.extraArgs) -}}
{{- include "bear.validateExtraArgs" (dict "pool" . "field" (printf "pools[%s].extraArgs" .name) "args" .extraArgs) -}}
{{- /* the sizes as vLLM reads the pool's arguments: vllm.extraArgs, then the pool's own (the last of a flag wins) */ -}}
{{- $args := include "bear.poolExtraArgs" (dict "root" $ "pool" .) | fromJsonArray -}}
{{- $argsField := ternary (printf "vllm.extraArgs and pools[%s].extraArgs" .name) "vllm.extraArgs" (not (empty .extraArgs)) -}}
{{- $pipelineParallel := include "bear.extraArgsSize" (dict "args" $args
  "long" "--pipeline-parallel-size" "from" "--pi" "short" (list "-pp")) | int -}}
{{- $contextParallel := include "bear.extraArgsSize" (dict "args" $args
  "long" "--prefill-context-parallel-size" "from" "--prefill-c" "short" (list "-pcp" "-pc")) | int -}}
{{- $engine := default (dict) .engine -}}
{{- if and $engine.maxNumBatchedTokens $engine.maxNumSeqs (lt (int $engine.maxNumBatchedTokens) (int $engine.maxNumSeqs)) -}}
{{- fail (printf "pools[%s]: engine.maxNumBatchedTokens (%v) is below engine.maxNumSeqs (%v): vLLM refuses to start (a step must have a token for every running request)" .name $engine.maxNumBatchedTokens $engine.maxNumSeqs) -}}
{{- end -}}
{{- $gpus := int .gpusPerReplica -}}
{{- $tensorParallel := int (default 1 .tensorParallelSize) -}}
{{- if and (gt $gpus 0) (gt $tensorParallel $gpus) -}}
{{- fail (printf "pools[%s]: tensorParallelSize (%v) exceeds gpusPerReplica (%v)" .name .tensorParallelSize .gpusPerReplica) -}}
{{- end -}}
{{- if and (gt $gpus 0) (ne (mod $gpus $tensorParallel) 0) -}}
{{- fail (printf "pools[%s]: tensorParallelSize (%v) does not divide gpusPerReplica (%v)" .name .tensorParallelSize .gpusPerReplica) -}}
{{- end -}}
{{- $used := mul $tensorParallel $pipelineParallel $contextParallel -}}
{{- if and (gt $gpus 0) (ne $gpus (int $used)) -}}
{{- $outcome := printf "need %v GPUs, more than each pod has, and fail to start" $used -}}
{{- if lt (int $used) $gpus -}}
{{- $outcome = printf "use %v GPUs of each pod and leave the others idle" $used -}}
{{- end -}}
{{- if and $.Values.vllm.extraArgs (gt (len $.Values.pools) 1) -}}
{{- $outcome = printf "%s (vllm.extraArgs reaches every pool: a size meant for some pools goes in their own extraArgs)" $outcome -}}
{{- end -}}
{{- fail (printf "pools[%s]: gpusPerReplica (%v) is not tensorParallelSize (%v) x the pipeline-parallel size (%v) x the prefill-context-parallel size (%v) of %s: vLLM would %s" .name (int64 .gpusPerReplica) $tensorParallel $pipelineParallel $contextParallel $argsField $outcome) -}}
{{- end -}}
{{- /* vLLM's CPU platform (no GPU) turns async scheduling off whatever the flag says: the pool would run BEAR's
asynchronous scheduler in a synchronous engine. */ -}}
{{- $async := include "bear.poolAsyncScheduling" (dict "root" $ "pool" .) | fromJson -}}
{{- if and (eq $gpus 0) $async.on -}}
{{- fail (printf "pools[%s]: gpusPerReplica is 0 and asyncScheduling is on (%s): vLLM's CPU platform turns async scheduling off, while the chart would run BEAR's asynchronous scheduler; set asyncScheduling: false for this pool" .name $async.field) -}}
{{- end -}}
{{- end -}}
{{- range $component := list "router" "estimator" "predictor" -}}
{{- include "bear.validateServiceArgs" (dict "component" $component "args" (index $.Values $component).extraArgs) -}}
{{- end -}}
{{- if .Values.router.inProcess -}}
{{- range $component := list "estimator" "predictor" -}}
{{- range $field := list "env" "extraArgs" -}}
{{- if index $.Values $component $field -}}
{{- fail (printf "%s.%s: with router.inProcess the %s runs inside the router pods, which would not read it; put its settings in router.env" $component $field $component) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $enginePorts := dict "vllm.port" .Values.vllm.port "vllm.snapshotter.grpcPort" .Values.vllm.snapshotter.grpcPort
  "metrics.snapshotterPort" .Values.metrics.snapshotterPort -}}
{{- include "bear.checkDistinctPorts" (dict "pod" "the vLLM pods" "ports" $enginePorts) -}}
{{- range $component := list "router" "estimator" "predictor" -}}
{{- $values := index $.Values $component -}}
{{- $ports := dict (printf "%s.grpcPort" $component) $values.grpcPort "metrics.port" $.Values.metrics.port -}}
{{- include "bear.checkDistinctPorts" (dict "pod" (printf "the %s's pods" $component) "ports" $ports) -}}
{{- $autoscaling := $values.autoscaling -}}
{{- if and $autoscaling.enabled (gt (int $autoscaling.minReplicas) (int $autoscaling.maxReplicas)) -}}
{{- fail (printf "%s.autoscaling: minReplicas (%v) exceeds maxReplicas (%v)" $component $autoscaling.minReplicas $autoscaling.maxReplicas) -}}
{{- end -}}
{{- $resources := default (dict) $values.resources -}}
{{- if and $autoscaling.enabled (not (dig "requests" "cpu" "" $resources)) (not (dig "limits" "cpu" "" $resources)) -}}
{{- fail (printf "%s.autoscaling scales on CPU utilisation, a share of the pods' CPU request: set %s.resources.requests.cpu" $component $component) -}}
{{- end -}}
{{- end -}}
{{- if and .Values.vllm.preStopSleepSeconds (ge (int .Values.vllm.preStopSleepSeconds) (int .Values.vllm.terminationGracePeriodSeconds)) -}}
{{- fail (printf "vllm.preStopSleepSeconds (%v) must be shorter than vllm.terminationGracePeriodSeconds (%v), which counts from the pod's deletion: vLLM would be killed without a SIGTERM, its requests cut off" (int64 .Values.vllm.preStopSleepSeconds) (int64 .Values.vllm.terminationGracePeriodSeconds)) -}}
{{- end -}}
{{- end -}}

{{/* Redis settings that contradict each other or would be silently ignored (part of bear.validate). */}}
{{- define "bear.validateRedis" -}}
{{- $redis := .Values.redis -}}
{{- $tls := $redis.tls -}}
{{- if and $redis.enabled (or $tls.enabled $tls.existingSecret) -}}
{{- fail "redis.tls applies to an external Redis: set redis.enabled=false and redis.url (or leave redis.tls.enabled false and redis.tls.existingSecret empty with the bundled Redis)" -}}
{{- end -}}
{{- if and $redis.enabled $redis.url -}}
{{- fail "redis.url is set, but redis.enabled=true deploys the bundled Redis and BEAR would use that instead: set redis.enabled=false to use redis.url, or leave redis.url empty" -}}
{{- end -}}
{{- if ne (empty $tls.certKey) (empty $tls.keyKey) -}}
{{- fail "redis.tls.certKey and redis.tls.keyKey go together (the client certificate and its key)" -}}
{{- end -}}
{{- if and $tls.certKey (not $tls.existingSecret) -}}
{{- fail "redis.tls.certKey and redis.tls.keyKey are keys of redis.tls.existingSecret: set it to the Secret that holds them" -}}
{{- end -}}
{{- if and (not $redis.enabled) $tls.existingSecret (not (include "bear.redisUsesTls" .)) -}}
{{- fail (printf "redis.tls.existingSecret is set, but BEAR talks plain TCP to %s: set redis.tls.enabled=true (or use a rediss:// URL), or leave existingSecret empty" $redis.url) -}}
{{- end -}}
{{- end -}}

{{/* Flags of `vllm serve` the chart sets itself, which vllm.extraArgs must not set again (vLLM would take the
last, and the probes, the pools file or the pool's engine settings would say otherwise), in full or abbreviated as
vLLM's parser takes them (--tensor-parallel 1, --max-num-seq=8); vllm.extraArgs and a pool's own are each checked
for every pool they reach: (dict "pool" $pool "field" "vllm.extraArgs" "args" $.Values.vllm.extraArgs) */}}
{{- define "bear.validateExtraArgs" -}}
{{- $engine := default (dict) .pool.engine -}}
{{- $owned := list "--host" "--port" "--served-model-name" "--scheduler-cls" "--async-scheduling" "--no-async-scheduling" "--tensor-parallel-size" "-tp" -}}
{{- range $key, $flag := dict "maxNumBatchedTokens" "--max-num-batched-tokens" "maxNumSeqs" "--max-num-seqs" "blockSize" "--block-size" "maxModelLen" "--max-model-len" "gpuMemoryUtilization" "--gpu-memory-utilization" -}}
{{- if not (kindIs "invalid" (index $engine $key)) -}}
{{- $owned = append $owned $flag -}}
{{- end -}}
{{- end -}}
{{- /* vLLM 0.32's other name for --gpu-memory-utilization */ -}}
{{- if not (kindIs "invalid" (index $engine "gpuMemoryUtilization")) -}}
{{- $owned = append $owned "--device-memory-utilization" -}}
{{- end -}}
{{- range $arg := .args -}}
{{- include "bear.checkArgShape" (dict "field" $.field "arg" $arg) -}}
{{- $flag := include "bear.flagName" $arg -}}
{{- with include "bear.vllmFlagSet" (dict "name" $flag "flags" $owned) -}}
{{- $abbreviated := ternary "" (printf " (%s abbreviated)" .) (eq . $flag) -}}
{{- fail (printf "%s: %s%s is a flag the chart sets for pools[%s]; set it through the values instead (the pool's engine settings, tensorParallelSize, servedModelName, asyncScheduling, vllm.port, vllm.asyncScheduling)" $.field (toString $arg) $abbreviated $.pool.name) -}}
{{- end -}}
{{- if include "bear.vllmFlagSet" (dict "name" $flag "flags" (list "--data-parallel-size" "-dp")) -}}
{{- fail (printf "%s: %s: BEAR's snapshotter observes data-parallel rank 0 only (the others' state would be invisible to routing); scale a pool with replicas instead" $.field (toString $arg)) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The flag of `flags` that an argument's flag `name` (bear.flagName) sets as vLLM's parser reads it, or nothing:
the flag itself or a prefix of it, which argparse takes as an abbreviation (--tensor-parallel for
--tensor-parallel-size, -t for -tp) or refuses as ambiguous. No flag of vLLM 0.32 is a prefix of one the chart
owns, so such a prefix never names a flag of its own: (dict "name" "--tensor-parallel" "flags" (list ...)) */}}
{{- define "bear.vllmFlagSet" -}}
{{- $name := .name -}}
{{- $set := "" -}}
{{- if and (hasPrefix "-" $name) (trimAll "-" $name) -}}
{{- range .flags -}}
{{- if and (not $set) (hasPrefix $name .) -}}
{{- $set = . -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $set -}}
{{- end -}}

{{/* Flags of `bear serve <component>` the chart sets itself, as arguments or through the environment, which its
extraArgs must not set again (a flag wins over the environment: the Service, the probes and the other components
would say otherwise): (dict "component" "router" "args" $.Values.router.extraArgs) */}}
{{- define "bear.validateServiceArgs" -}}
{{- $owned := dict
  "router" (list "--grpc-port" "--metrics-port" "--redis-url" "--estimator-address" "--predictor-address" "--default-policy" "--pools-file" "--in-process")
  "estimator" (list "--grpc-port" "--metrics-port" "--redis-url" "--max-snapshot-age-s" "--predictor-address" "--pools-file")
  "predictor" (list "--grpc-port" "--metrics-port" "--model-dir") -}}
{{- $field := printf "%s.extraArgs" .component -}}
{{- range .args -}}
{{- include "bear.checkArgShape" (dict "field" $field "arg" .) -}}
{{- $flag := include "bear.flagName" . -}}
{{- if has $flag (index $owned $.component) -}}
{{- fail (printf "%s: %s is a flag the chart sets for the %s from its values (the ports, Redis, the other components' addresses, the pools file, ...); set it through the values instead" $field (toString .) $.component) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The flag an argument sets, as its program reads it: the part before "=", with "_" read as "-"
("--max_num_seqs=8" → "--max-num-seqs"). */}}
{{- define "bear.flagName" -}}
{{- regexReplaceAll "_" (first (splitList "=" (toString .))) "-" -}}
{{- end -}}

{{/* One argument of a container: a flag and its value written as one item ("--max-model-len 32768") reaches the
program as a single unknown flag: (dict "field" "vllm.extraArgs" "arg" $arg) */}}
{{- define "bear.checkArgShape" -}}
{{- $arg := toString .arg -}}
{{- if and (hasPrefix "-" $arg) (contains " " (first (splitList "=" $arg))) -}}
{{- fail (printf "%s: %q is a flag and its value in one item; write them as two items or as --flag=value" .field $arg) -}}
{{- end -}}
{{- end -}}

{{/* A size that vllm.extraArgs sets for every pool through one flag, 1 where it does not: `long` in full or by a
prefix from `from` on (vLLM's parser takes any unambiguous prefix; no other flag of vLLM 0.32 starts so), or one of
the `short` forms. The GPUs of a pool's pod are its tensorParallelSize times the pipeline-parallel size
(--pipeline-parallel-size, -pp; from --pi) times the prefill-context-parallel size (--prefill-context-parallel-size,
-pcp or -pc; from --prefill-c), as vLLM's world size counts them; the decode-context-parallel size (-dcp) reuses
those ranks and adds none: (dict "args" $.Values.vllm.extraArgs "long" "--pipeline-parallel-size" "from" "--pi"
"short" (list "-pp")) */}}
{{- define "bear.extraArgsSize" -}}
{{- $size := 1 -}}
{{- $args := .args -}}
{{- $spec := . -}}
{{- range $i, $arg := $args -}}
{{- $parts := splitList "=" (toString $arg) -}}
{{- $flag := include "bear.flagName" $arg -}}
{{- if or (has $flag $spec.short) (and (hasPrefix $spec.from $flag) (hasPrefix $flag $spec.long)) -}}
{{- if gt (len $parts) 1 -}}
{{- $size = int (index $parts 1) -}}
{{- else if lt (add1 $i) (len $args) -}}
{{- $size = int (index $args (add1 $i)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- max $size 1 -}}
{{- end -}}

{{/* The snapshot settings as the services get them, each from the `env` entry that replaces the chart's where
there is one, held to the bounds the services put on them (an `env` value skips the schema's, and a service that
refuses its setting crash-loops): the estimator's age limit (BEAR_MAX_SNAPSHOT_AGE_S, as
estimator.maxSnapshotAgeSeconds: > 0, at most 3600; router.env's with router.inProcess) and the snapshotters' read interval
(BEAR_SNAPSHOTTER_POLL_INTERVAL_MS, as vllm.snapshotter.pollIntervalMs: > 0, at most 60000), idle refresh
(BEAR_SNAPSHOT_REFRESH_S, 0.5 s: at least 0.01 and below BEAR_SNAPSHOT_TTL_S) and TTL (BEAR_SNAPSHOT_TTL_S, 10 s:
1 to 86400). The age limit must exceed the idle refresh and the read interval: instances would fall back to LPS
between two refreshes or reads. */}}
{{- define "bear.validateSnapshotAge" -}}
{{- $snapshotter := .Values.vllm.snapshotter -}}
{{- $ageHost := ternary "router" "estimator" .Values.router.inProcess -}}
{{- $age := include "bear.numberSetting" (dict "env" (index .Values $ageHost).env "envField" (printf "%s.env" $ageHost) "name" "BEAR_MAX_SNAPSHOT_AGE_S" "value" .Values.estimator.maxSnapshotAgeSeconds "field" "estimator.maxSnapshotAgeSeconds") | fromJson -}}
{{- $refresh := include "bear.numberSetting" (dict "env" $snapshotter.env "envField" "vllm.snapshotter.env" "name" "BEAR_SNAPSHOT_REFRESH_S" "value" 0.5 "field" "BEAR_SNAPSHOT_REFRESH_S") | fromJson -}}
{{- $ttl := include "bear.numberSetting" (dict "env" $snapshotter.env "envField" "vllm.snapshotter.env" "name" "BEAR_SNAPSHOT_TTL_S" "value" 10 "field" "BEAR_SNAPSHOT_TTL_S") | fromJson -}}
{{- $pollMs := include "bear.numberSetting" (dict "env" $snapshotter.env "envField" "vllm.snapshotter.env" "name" "BEAR_SNAPSHOTTER_POLL_INTERVAL_MS" "value" (default 5 $snapshotter.pollIntervalMs) "field" "vllm.snapshotter.pollIntervalMs") | fromJson -}}
{{- if not (and (gt $age.value 0.0) (le $age.value 3600.0)) -}}
{{- fail (printf "%s (%s) must be > 0 and at most 3600 (seconds), as the estimator requires" $age.field $age.shown) -}}
{{- end -}}
{{- if not (and (gt $pollMs.value 0.0) (le $pollMs.value 60000.0)) -}}
{{- fail (printf "%s (%s) must be > 0 and at most 60000 (milliseconds), as the snapshotter requires" $pollMs.field $pollMs.shown) -}}
{{- end -}}
{{- if not (and (ge $ttl.value 1.0) (le $ttl.value 86400.0)) -}}
{{- fail (printf "%s (%s) must be at least 1 and at most 86400 (seconds), as the snapshotter requires" $ttl.field $ttl.shown) -}}
{{- end -}}
{{- if not (and (ge $refresh.value 0.01) (lt $refresh.value $ttl.value)) -}}
{{- fail (printf "%s (%s) must be at least 0.01 (seconds) and below the snapshot TTL (BEAR_SNAPSHOT_TTL_S, %s s), as the snapshotter requires" $refresh.field $refresh.shown $ttl.shown) -}}
{{- end -}}
{{- if le $age.value $refresh.value -}}
{{- fail (printf "%s (%s) must exceed the snapshotters' idle refresh interval (BEAR_SNAPSHOT_REFRESH_S, %s s): an idle instance's snapshot is that old before its next refresh, and would fall back to LPS" $age.field $age.shown $refresh.shown) -}}
{{- end -}}
{{- $poll := divf $pollMs.value 1000 -}}
{{- if le $age.value $poll -}}
{{- fail (printf "%s (%s) must exceed the snapshotters' read interval (%s, %v s): a snapshot is that old before the next read, and would fall back to LPS" $age.field $age.shown $pollMs.field $poll) -}}
{{- end -}}
{{- end -}}

{{/* A numeric setting as its service gets it, as JSON {"value": the number, "shown": its text, "field": where it is
set}: the value of the variable `name` in an operator's `env` list (which replaces the chart's entry) where that
gives one (its text shown as given), else `value` from the values' `field`; env text that is not a number is refused,
naming the list. A number beyond a float's range (1e400), which the service reads as infinite, is held as the largest
float of its sign: it fails every finite bound as infinity would. (dict "env" $.Values.estimator.env "envField"
"estimator.env" "name" "BEAR_MAX_SNAPSHOT_AGE_S" "value" 1.0 "field" "estimator.maxSnapshotAgeSeconds") */}}
{{- define "bear.numberSetting" -}}
{{- $setting := dict "value" (float64 .value) "shown" (printf "%v" .value) "field" .field -}}
{{- range .env -}}
{{- if and (eq (toString .name) $.name) (kindIs "string" .value) (trim (toString .value)) -}}
{{- $text := trim .value -}}
{{- if not (regexMatch "^[+-]?([0-9]+[.]?[0-9]*|[.][0-9]+)([eE][+-]?[0-9]+)?$" $text) -}}
{{- fail (printf "%s: %s must be a number, got %q" $.envField $.name .value) -}}
{{- end -}}
{{- $value := float64 $text -}}
{{- $mantissa := first (splitList "e" (lower $text)) -}}
{{- if and (eq $value 0.0) (regexMatch "[1-9]" $mantissa) (not (regexMatch "[eE]-" $text)) -}}
{{- $value = float64 (ternary "-1.7976931348623157e308" "1.7976931348623157e308" (hasPrefix "-" $text)) -}}
{{- end -}}
{{- $setting = dict "value" $value "shown" $text "field" (printf "%s in %s" $.name $.envField) -}}
{{- end -}}
{{- end -}}
{{- toJson $setting -}}
{{- end -}}

{{/* BEAR_SNAPSHOT_REGION names the region that vLLM's plugin writes and the sidecar reads: set in one container's
env, it would change in that one only, and the pod would never become ready. */}}
{{- define "bear.validateEngineEnv" -}}
{{- $lists := dict "vllm.env" .Values.vllm.env "vllm.snapshotter.env" .Values.vllm.snapshotter.env -}}
{{- range .Values.pools -}}
{{- $_ := set $lists (printf "pools[%s].env" .name) .env -}}
{{- end -}}
{{- range $field, $env := $lists -}}
{{- range $env -}}
{{- if eq (toString .name) "BEAR_SNAPSHOT_REGION" -}}
{{- fail (printf "%s: BEAR_SNAPSHOT_REGION would name the shared-memory region of one container only (vLLM's plugin writes it, the sidecar reads it): set vllm.snapshotter.region instead" $field) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The ports the chart passes as flags (--grpc-port, --metrics-port), which win over the environment: the same
setting in an `env` list would be overridden without a word, and the chart's ports, probes and NetworkPolicies use
the values. */}}
{{- define "bear.validatePortEnv" -}}
{{- $lists := list -}}
{{- range $component := list "router" "estimator" "predictor" -}}
{{- $prefix := printf "BEAR_%s" (upper $component) -}}
{{- $lists = append $lists (dict "field" (printf "%s.env" $component) "env" (index $.Values $component).env "flags" (dict
  (printf "%s_GRPC_PORT" $prefix) (list "--grpc-port" (printf "%s.grpcPort" $component))
  (printf "%s_METRICS_PORT" $prefix) (list "--metrics-port" "metrics.port"))) -}}
{{- end -}}
{{- $lists = append $lists (dict "field" "vllm.snapshotter.env" "env" .Values.vllm.snapshotter.env "flags" (dict
  "BEAR_SNAPSHOTTER_GRPC_PORT" (list "--grpc-port" "vllm.snapshotter.grpcPort")
  "BEAR_SNAPSHOTTER_METRICS_PORT" (list "--metrics-port" "metrics.snapshotterPort"))) -}}
{{- range $list := $lists -}}
{{- range $entry := $list.env -}}
{{- $name := toString $entry.name -}}
{{- if hasKey $list.flags $name -}}
{{- $flag := index $list.flags $name -}}
{{- fail (printf "%s: %s would be overridden by %s, which the chart passes from %s (a flag wins over the environment, and the chart's ports, probes and NetworkPolicies use that value): set %s instead" $list.field $name (index $flag 0) (index $flag 1) (index $flag 1)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Two pools that serve different models by one name the chart derived (a model's last path component, where
servedModelName is empty): BEAR's pools file and predictor and the clients know a model by its name alone, and would
take the two for one. The same model in two pools, or one name that servedModelName gives both, is meant. */}}
{{- define "bear.validateServedNames" -}}
{{- $pools := .Values.pools -}}
{{- range $i, $a := $pools -}}
{{- range $j, $b := $pools -}}
{{- if and (lt $i $j) (or (not $a.servedModelName) (not $b.servedModelName)) (ne (trimSuffix "/" $a.model) (trimSuffix "/" $b.model)) -}}
{{- $name := include "bear.servedModelName" $a -}}
{{- if eq $name (include "bear.servedModelName" $b) -}}
{{- fail (printf "pools[%s] and pools[%s] serve different models (%s, %s) by one name, %q, derived from a model's last path component (servedModelName unset): BEAR and its clients know a model by its name alone and would take the two for one; set servedModelName" $a.name $b.name $a.model $b.model $name) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* With http/protobuf the exporter appends /v1/traces to OTEL_EXPORTER_OTLP_ENDPOINT, the collector's base URL:
an endpoint that ends in it would send every span to .../v1/traces/v1/traces. (gRPC takes no path.) */}}
{{- define "bear.validateOtel" -}}
{{- $otel := .Values.otel -}}
{{- if and $otel.endpoint (eq (toString $otel.protocol) "http/protobuf") (regexMatch "/v1/traces/?$" $otel.endpoint) -}}
{{- fail (printf "otel.endpoint (%s) ends in /v1/traces, which the exporter appends itself with protocol http/protobuf (spans would go to .../v1/traces/v1/traces): give the collector's base URL, %s" $otel.endpoint (regexReplaceAll "/v1/traces/?$" $otel.endpoint "")) -}}
{{- end -}}
{{- end -}}
