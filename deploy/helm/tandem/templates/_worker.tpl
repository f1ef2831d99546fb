{{/* Pod template of a worker: (dict "root" $ "component" "prefill"|"decode" "values" v). */}}
{{- define "tandem.workerPod" -}}
{{- $root := .root -}}
{{- $v := .values -}}
{{- $decode := eq .component "decode" -}}
metadata:
  labels:
    {{- include "tandem.componentLabels" . | nindent 4 }}
    {{- with $v.podLabels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  annotations:
    {{- include "tandem.podAnnotations" (dict "root" $root "extra" $v.podAnnotations) | nindent 4 }}
spec:
  serviceAccountName: {{ include "tandem.serviceAccountName" $root }}
  automountServiceAccountToken: false
  {{- with $root.Values.imagePullSecrets }}
  imagePullSecrets:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- if $root.Values.cudaIpc.hostIPC }}
  # cuda-ipc: the prefill and decode processes map each other's GPU memory (CUDA IPC handles).
  hostIPC: true
  {{- end }}
  securityContext:
    {{- toYaml $root.Values.podSecurityContext | nindent 4 }}
  terminationGracePeriodSeconds: {{ add $root.Values.config.drainTimeoutSeconds 15 }}
  {{- with include "tandem.scheduling" $v }}{{ . | nindent 2 }}{{ end }}
  containers:
    - name: {{ .component }}
      image: {{ include "tandem.image" $root }}
      imagePullPolicy: {{ $root.Values.image.pullPolicy }}
      args:
        - {{ .component }}
        {{- include "tandem.commonArgs" (dict "root" $root "port" $root.Values.ports.worker) | nindent 8 }}
        {{- include "tandem.engineArgs" $root | nindent 8 }}
        {{- if not (has $root.Values.prefill.kvTransport (list "auto" "tcp" "nccl" "cuda-ipc")) }}
        {{- fail (printf "prefill.kvTransport must be auto, tcp, nccl or cuda-ipc, got %q" $root.Values.prefill.kvTransport) }}
        {{- end }}
        {{- if and (eq $root.Values.prefill.kvTransport "cuda-ipc") (not $root.Values.cudaIpc.hostIPC) }}
        {{- fail "prefill.kvTransport cuda-ipc needs cudaIpc.hostIPC=true (CUDA IPC handles cross pods only in the host's IPC namespace)" }}
        {{- end }}
        {{- if $decode }}
        - --kv-transport={{ $root.Values.prefill.kvTransport }}
        - --kv-host=$(POD_IP)
        - --kv-port={{ $root.Values.ports.kv }}
        {{- else }}
        - --kv-transport={{ $v.kvTransport }}
        {{- end }}
        {{- if include "tandem.kvSecretName" $root }}
        - --kv-secret-file={{ $root.Values.kvSecret.mountPath }}/kv-secret
        {{- else }}
        # kvSecret off: the KV data path takes any peer (docs/security.md).
        - --allow-unauthenticated-kv
        {{- end }}
        {{- with $v.extraArgs }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      env:
        {{- include "tandem.env" $root | nindent 8 }}
      envFrom:
        - configMapRef:
            name: {{ include "tandem.fullname" $root }}-config
      ports:
        {{- include "tandem.ports" (dict "root" $root "grpc" $root.Values.ports.worker "kv" $decode) | nindent 8 }}
      {{- include "tandem.probes" (dict "root" $root "port" $root.Values.ports.worker) | trim | nindent 6 }}
      resources:
        {{- include "tandem.resources" (dict "resources" $v.resources "gpus" $v.gpus) | nindent 8 }}
      securityContext:
        {{- toYaml $root.Values.securityContext | nindent 8 }}
      volumeMounts:
        {{- include "tandem.volumeMounts" (dict "root" $root "worker" true) | nindent 8 }}
  volumes:
    {{- include "tandem.volumes" (dict "root" $root "worker" true) | nindent 4 }}
{{- end -}}
