{{/* Chart name, truncated. */}}
{{- define "tandem.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 40 | trimSuffix "-" -}}
{{- end -}}

{{/* Release-wide prefix of resource names; 40 characters leave room for "-prefill-headless". */}}
{{- define "tandem.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "tandem.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels of every resource. */}}
{{- define "tandem.labels" -}}
helm.sh/chart: {{ include "tandem.chart" . }}
app.kubernetes.io/name: {{ include "tandem.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: tandem
{{- end -}}

{{/* Selector labels of one component: (dict "root" $ "component" "decode"). */}}
{{- define "tandem.selectorLabels" -}}
app.kubernetes.io/name: {{ include "tandem.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "tandem.componentLabels" -}}
{{ include "tandem.labels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "tandem.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "tandem.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "tandem.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag -}}
{{- if not (has .Values.image.flavor (list "cuda" "cpu")) -}}
{{- fail (printf "image.flavor must be cuda or cpu, got %q" .Values.image.flavor) -}}
{{- end -}}
{{- printf "%s:%s-%s" .Values.image.repository $tag .Values.image.flavor -}}
{{- end -}}

{{/* Names of the discovery (headless) Services and the DNS names the router resolves. */}}
{{- define "tandem.decodeHeadless" -}}{{ include "tandem.fullname" . }}-decode-headless{{- end -}}
{{- define "tandem.prefillHeadless" -}}{{ include "tandem.fullname" . }}-prefill-headless{{- end -}}
{{- define "tandem.decodeDns" -}}
{{- printf "%s.%s.svc.%s:%v" (include "tandem.decodeHeadless" .) .Release.Namespace .Values.clusterDomain .Values.ports.worker -}}
{{- end -}}
{{- define "tandem.prefillDns" -}}
{{- printf "%s.%s.svc.%s:%v" (include "tandem.prefillHeadless" .) .Release.Namespace .Values.clusterDomain .Values.ports.worker -}}
{{- end -}}

{{/* The model directory inside the containers. */}}
{{- define "tandem.modelDir" -}}
{{- if eq .Values.model.source "bundled" -}}
/usr/local/share/tandem/models/stories260k
{{- else -}}
{{- printf "%s/%s" (trimSuffix "/" .Values.model.mountPath) (required "model.path is required" .Values.model.path) -}}
{{- end -}}
{{- end -}}

{{- define "tandem.modelClaim" -}}
{{- default (printf "%s-models" (include "tandem.fullname" .)) .Values.model.pvc.existingClaim -}}
{{- end -}}

{{/* Volumes of every pod (model, TLS, tmp, and /dev/shm for workers): (dict "root" $ "worker" bool). */}}
{{- define "tandem.volumes" -}}
{{- $v := .root.Values -}}
- name: tmp
  emptyDir: {}
{{- if .worker }}
- name: shm
  emptyDir:
    medium: Memory
    sizeLimit: {{ $v.shmSize }}
{{- end }}
{{- if eq $v.model.source "pvc" }}
- name: model
  persistentVolumeClaim:
    claimName: {{ include "tandem.modelClaim" .root }}
    readOnly: true
{{- else if eq $v.model.source "hostPath" }}
- name: model
  hostPath:
    path: {{ required "model.hostPath.path is required" $v.model.hostPath.path }}
    type: {{ $v.model.hostPath.type }}
{{- else if ne $v.model.source "bundled" }}
{{- fail (printf "model.source must be pvc, hostPath or bundled, got %q" $v.model.source) }}
{{- end }}
{{- if $v.tls.enabled }}
- name: tls
  secret:
    secretName: {{ include "tandem.tlsSecretName" .root }}
    defaultMode: 0440
{{- end }}
{{- with include "tandem.clusterSecretName" .root }}
- name: cluster-secret
  secret:
    secretName: {{ . }}
    items: [{key: {{ $v.clusterSecret.key }}, path: cluster-secret}]
    defaultMode: 0440
{{- end }}
{{- if not .worker }}
{{- with include "tandem.apiKeysSecretName" .root }}
- name: api-keys
  secret:
    secretName: {{ . }}
    items: [{key: {{ $v.apiKeys.key }}, path: api-keys}]
    defaultMode: 0440
{{- end }}
{{- end }}
{{- if .worker }}
{{- with include "tandem.kvSecretName" .root }}
- name: kv-secret
  secret:
    secretName: {{ . }}
    items: [{key: {{ $v.kvSecret.key }}, path: kv-secret}]
    defaultMode: 0440
{{- end }}
{{- end }}
{{- end -}}

{{- define "tandem.volumeMounts" -}}
{{- $v := .root.Values -}}
- name: tmp
  mountPath: /tmp
{{- if .worker }}
- name: shm
  mountPath: /dev/shm
{{- end }}
{{- if ne $v.model.source "bundled" }}
- name: model
  mountPath: {{ $v.model.mountPath }}
  readOnly: true
{{- end }}
{{- if $v.tls.enabled }}
- name: tls
  mountPath: {{ $v.tls.mountPath }}
  readOnly: true
{{- end }}
{{- if and .worker (include "tandem.kvSecretName" .root) }}
- name: kv-secret
  mountPath: {{ $v.kvSecret.mountPath }}
  readOnly: true
{{- end }}
{{- if and (not .worker) (include "tandem.apiKeysSecretName" .root) }}
- name: api-keys
  mountPath: {{ $v.apiKeys.mountPath }}
  readOnly: true
{{- end }}
{{- if include "tandem.clusterSecretName" .root }}
- name: cluster-secret
  mountPath: {{ $v.clusterSecret.mountPath }}
  readOnly: true
{{- end }}
{{- end -}}

{{/* Where the TLS certificate comes from: certManager, secret or generated. */}}
{{- define "tandem.tlsSource" -}}
{{- if .Values.tls.certManager.enabled -}}
certManager
{{- else if .Values.tls.secretName -}}
secret
{{- else if .Values.tls.generated.enabled -}}
generated
{{- else -}}
{{- fail "tls.enabled needs a certificate: set tls.certManager.enabled (and tls.certManager.issuerRef), or tls.secretName (a kubernetes.io/tls Secret with tls.crt, tls.key and ca.crt), or tls.generated.enabled for a chart-made CA; tls.enabled=false serves plaintext (values-insecure.yaml)" -}}
{{- end -}}
{{- end -}}

{{/* The Secret of the TLS certificate (cert-manager's or the chart's when they make it). */}}
{{- define "tandem.tlsSecretName" -}}
{{- if eq (include "tandem.tlsSource" .) "secret" -}}
{{- .Values.tls.secretName -}}
{{- else -}}
{{- default (printf "%s-tls" (include "tandem.fullname" .)) .Values.tls.secretName -}}
{{- end -}}
{{- end -}}

{{/* The name routers verify on workers' certificates (they dial pod IPs); empty: the IP. */}}
{{- define "tandem.workerServerName" -}}
{{- if .Values.tls.enabled -}}
{{- if eq (include "tandem.tlsSource" .) "secret" -}}
{{- .Values.tls.workerServerName -}}
{{- else -}}
{{- include "tandem.fullname" . }}-worker
{{- end -}}
{{- end -}}
{{- end -}}

{{/* DNS names of the chart's certificate (cert-manager's or generated), comma-separated: the
workers' common name, the router Service and every pod behind the headless Services. */}}
{{- define "tandem.tlsDnsNames" -}}
{{- $full := include "tandem.fullname" . -}}
{{- $ns := .Release.Namespace -}}
{{- $suffix := printf "%s.svc.%s" $ns .Values.clusterDomain -}}
{{- $names := list (printf "%s-worker" $full) (printf "%s-router" $full) (printf "%s-router.%s" $full $ns) (printf "%s-router.%s.svc" $full $ns) (printf "%s-router.%s" $full $suffix) -}}
{{- range $h := list (include "tandem.decodeHeadless" .) (include "tandem.prefillHeadless" .) -}}
{{- $names = append $names (printf "%s.%s" $h $suffix) -}}
{{- $names = append $names (printf "*.%s.%s" $h $suffix) -}}
{{- end -}}
{{- join "," $names -}}
{{- end -}}

{{/* The Secret holding the cluster secret; empty when there is none. */}}
{{- define "tandem.clusterSecretName" -}}
{{- if .Values.clusterSecret.existingSecret -}}
{{- .Values.clusterSecret.existingSecret -}}
{{- else if .Values.clusterSecret.create -}}
{{- printf "%s-cluster-secret" (include "tandem.fullname" .) -}}
{{- end -}}
{{- end -}}

{{/* The Secret holding the routers' API key file; empty when keys are off. */}}
{{- define "tandem.apiKeysSecretName" -}}
{{- if .Values.apiKeys.enabled -}}
{{- default (printf "%s-api-keys" (include "tandem.fullname" .)) .Values.apiKeys.existingSecret -}}
{{- end -}}
{{- end -}}

{{/* The Secret holding the KV data path's shared secret; empty when there is none. */}}
{{- define "tandem.kvSecretName" -}}
{{- if get .Values.kvSecret "secretName" -}}
{{- fail "kvSecret.secretName is now kvSecret.existingSecret (kvSecret.create makes one by default)" -}}
{{- end -}}
{{- if .Values.kvSecret.existingSecret -}}
{{- .Values.kvSecret.existingSecret -}}
{{- else if .Values.kvSecret.create -}}
{{- printf "%s-kv-secret" (include "tandem.fullname" .) -}}
{{- end -}}
{{- end -}}

{{/* Flags every server process takes. */}}
{{- define "tandem.commonArgs" -}}
{{- $v := .root.Values -}}
- --host=0.0.0.0
- --port={{ .port }}
{{- if $v.metrics.enabled }}
- --metrics-port={{ $v.ports.metrics }}
{{- end }}
- --model={{ include "tandem.modelDir" .root }}
{{- with $v.model.name }}
- --model-name={{ . }}
{{- end }}
- --drain-timeout=$(TANDEM_DRAIN_TIMEOUT)
{{- if $v.config.logJson }}
- --log-json
{{- end }}
{{- if $v.tls.enabled }}
- --tls-cert={{ $v.tls.mountPath }}/tls.crt
- --tls-key={{ $v.tls.mountPath }}/tls.key
- --tls-ca={{ $v.tls.mountPath }}/ca.crt
{{- if $v.tls.mutual }}
- --tls-client-auth
{{- end }}
{{- end }}
{{- if include "tandem.clusterSecretName" .root }}
- --cluster-secret-file={{ $v.clusterSecret.mountPath }}/cluster-secret
{{- end }}
{{- end -}}

{{/* Engine flags of workers, from the ConfigMap's environment variables. */}}
{{- define "tandem.engineArgs" -}}
- --dtype=$(TANDEM_DTYPE)
- --kv-cache-dtype=$(TANDEM_KV_CACHE_DTYPE)
- --kv-cache-memory=$(TANDEM_KV_CACHE_MEMORY)
- --block-size=$(TANDEM_BLOCK_SIZE)
- --max-num-seqs=$(TANDEM_MAX_NUM_SEQS)
- --max-num-batched-tokens=$(TANDEM_MAX_NUM_BATCHED_TOKENS)
- --max-model-len=$(TANDEM_MAX_MODEL_LEN)
- --max-waiting=$(TANDEM_MAX_WAITING)
- --scheduling-policy=$(TANDEM_SCHEDULING_POLICY)
- --threads=$(TANDEM_THREADS)
{{- if not .Values.config.prefixCache }}
- --no-prefix-cache
{{- end }}
{{- if .Values.config.mmapWeights }}
- --mmap-weights
{{- end }}
{{- end -}}

{{/* Environment of every container. */}}
{{- define "tandem.env" -}}
- name: POD_NAME
  valueFrom:
    fieldRef: {fieldPath: metadata.name}
- name: POD_IP
  valueFrom:
    fieldRef: {fieldPath: status.podIP}
{{- with .Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Container ports: (dict "root" $ "grpc" port "kv" bool). */}}
{{- define "tandem.ports" -}}
- name: grpc
  containerPort: {{ .grpc }}
  protocol: TCP
{{- if .kv }}
- name: kv
  containerPort: {{ .root.Values.ports.kv }}
  protocol: TCP
{{- end }}
{{- if .root.Values.metrics.enabled }}
- name: metrics
  containerPort: {{ .root.Values.ports.metrics }}
  protocol: TCP
{{- end }}
{{- end -}}

{{/* Startup, liveness and readiness probes on the gRPC health service (TCP under TLS). */}}
{{- define "tandem.probes" -}}
{{- $v := .root.Values -}}
{{- range $kind := list "startup" "liveness" "readiness" }}
{{ $kind }}Probe:
  {{- if $v.tls.enabled }}
  tcpSocket:
    port: grpc
  {{- else }}
  grpc:
    port: {{ $.port }}
  {{- end }}
  {{- toYaml (index $v.probes $kind) | nindent 2 }}
{{- end }}
{{- end -}}

{{/* Pod annotations: config checksum and annotation-based scraping. */}}
{{- define "tandem.podAnnotations" -}}
checksum/config: {{ include (print .root.Template.BasePath "/configmap.yaml") .root | sha256sum }}
{{- if .root.Values.metrics.enabled }}
prometheus.io/scrape: "true"
prometheus.io/port: {{ .root.Values.ports.metrics | quote }}
prometheus.io/path: /metrics
{{- if .root.Values.tls.enabled }}
prometheus.io/scheme: https
{{- end }}
{{- end }}
{{- with .extra }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* GPU resources merged into a component's resources: (dict "resources" map "gpus" n). */}}
{{- define "tandem.resources" -}}
{{- $r := deepCopy (default (dict) .resources) -}}
{{- if gt (int .gpus) 0 -}}
{{- $_ := set $r "limits" (merge (dict "nvidia.com/gpu" (int .gpus)) (default (dict) $r.limits)) -}}
{{- $_ := set $r "requests" (merge (dict "nvidia.com/gpu" (int .gpus)) (default (dict) $r.requests)) -}}
{{- end -}}
{{- toYaml $r -}}
{{- end -}}

{{/* HorizontalPodAutoscaler of one workload: (dict "root" $ "component" c "kind" k "values" v). */}}
{{- define "tandem.hpa" -}}
{{- if .values.autoscaling.enabled }}
---
apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata:
  name: {{ include "tandem.fullname" .root }}-{{ .component }}
  labels:
    {{- include "tandem.componentLabels" . | nindent 4 }}
spec:
  scaleTargetRef:
    apiVersion: apps/v1
    kind: {{ .kind }}
    name: {{ include "tandem.fullname" .root }}-{{ .component }}
  minReplicas: {{ .values.autoscaling.minReplicas }}
  maxReplicas: {{ .values.autoscaling.maxReplicas }}
  metrics:
    {{- if .values.autoscaling.metrics }}
    {{- toYaml .values.autoscaling.metrics | nindent 4 }}
    {{- else }}
    - type: Resource
      resource:
        name: cpu
        target:
          type: Utilization
          averageUtilization: {{ .values.autoscaling.targetCPUUtilizationPercentage }}
    {{- end }}
{{- end }}
{{- end -}}

{{/* PodDisruptionBudget of one component: (dict "root" $ "component" c "values" v). */}}
{{- define "tandem.pdb" -}}
{{- if .values.podDisruptionBudget.enabled }}
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: {{ include "tandem.fullname" .root }}-{{ .component }}
  labels:
    {{- include "tandem.componentLabels" . | nindent 4 }}
spec:
  maxUnavailable: {{ .values.podDisruptionBudget.maxUnavailable }}
  selector:
    matchLabels:
      {{- include "tandem.selectorLabels" . | nindent 6 }}
{{- end }}
{{- end -}}

{{/* Scheduling fields of a pod spec. */}}
{{- define "tandem.scheduling" -}}
{{- with .nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .topologySpreadConstraints }}
topologySpreadConstraints:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}
