{{/* Names, labels and the checks every render runs. */}}

{{- define "pipeline-server.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "pipeline-server.fullname" -}}
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

{{- define "pipeline-server.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "pipeline-server.selectorLabels" -}}
app.kubernetes.io/name: {{ include "pipeline-server.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "pipeline-server.labels" -}}
helm.sh/chart: {{ include "pipeline-server.chart" . }}
{{ include "pipeline-server.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "pipeline-server.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "pipeline-server.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "pipeline-server.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag }}
{{- if .Values.image.digest }}
{{- printf "%s:%s@%s" .Values.image.repository $tag .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository $tag }}
{{- end }}
{{- end }}

{{/* MODEL_ID the container is given: an explicit model.id, else where the source puts it. */}}
{{- define "pipeline-server.modelId" -}}
{{- if .Values.model.id }}
{{- .Values.model.id }}
{{- else if eq .Values.model.source "pvc" }}
{{- .Values.model.pvc.mountPath }}
{{- else if eq .Values.model.source "download" }}
{{- "/models/download" }}
{{- else }}
{{- "/models/model" }}
{{- end }}
{{- end }}

{{/* Name of the Secret holding the API key; empty when there is none. */}}
{{- define "pipeline-server.apiKeySecret" -}}
{{- if .Values.apiKey.existingSecret }}
{{- .Values.apiKey.existingSecret }}
{{- else if .Values.apiKey.value }}
{{- printf "%s-api-key" (include "pipeline-server.fullname" .) }}
{{- end }}
{{- end }}

{{- define "pipeline-server.kedaAvailable" -}}
{{- if .Capabilities.APIVersions.Has "keda.sh/v1alpha1/ScaledObject" }}true{{ end }}
{{- end }}

{{- define "pipeline-server.serviceMonitorAvailable" -}}
{{- if .Capabilities.APIVersions.Has "monitoring.coreos.com/v1/ServiceMonitor" }}true{{ end }}
{{- end }}

{{/* True when an autoscaler, not replicaCount, owns the replica count. */}}
{{- define "pipeline-server.autoscaled" -}}
{{- if or .Values.autoscaling.enabled (and .Values.keda.enabled (include "pipeline-server.kedaAvailable" .)) }}true{{ end }}
{{- end }}

{{/* True when more than one replica can exist: the only case a PodDisruptionBudget helps. */}}
{{- define "pipeline-server.multiReplica" -}}
{{- if .Values.autoscaling.enabled }}
{{- if gt (int .Values.autoscaling.maxReplicas) 1 }}true{{ end }}
{{- else if and .Values.keda.enabled (include "pipeline-server.kedaAvailable" .) }}
{{- if gt (int .Values.keda.maxReplicaCount) 1 }}true{{ end }}
{{- else if gt (int .Values.replicaCount) 1 }}true{{ end }}
{{- end }}

{{/*
Cross-field rules the JSON schema cannot express. Each failure names the values to change.
The shutdown margin (10 s) covers gunicorn's exit after the drain and the kubelet's own latency.
*/}}
{{- define "pipeline-server.validate" -}}
{{- $v := .Values }}
{{- $needed := add $v.preStopSleepSeconds $v.server.drainTimeoutS 10 }}
{{- if lt (int $v.terminationGracePeriodSeconds) (int $needed) }}
{{- fail (printf "terminationGracePeriodSeconds (%d) must be at least preStopSleepSeconds (%d) + server.drainTimeoutS (%d) + 10 = %d, or the kubelet kills the container before it drains" (int $v.terminationGracePeriodSeconds) (int $v.preStopSleepSeconds) (int $v.server.drainTimeoutS) (int $needed)) }}
{{- end }}
{{- if and $v.autoscaling.enabled $v.keda.enabled }}
{{- fail "autoscaling.enabled and keda.enabled are both true: choose one (KEDA creates its own HorizontalPodAutoscaler, and two would fight over the replica count)" }}
{{- end }}
{{- if and $v.autoscaling.enabled (not $v.autoscaling.targetCPUUtilizationPercentage) (not $v.autoscaling.queueDepth.enabled) }}
{{- fail "autoscaling.enabled needs a metric: set autoscaling.targetCPUUtilizationPercentage > 0 or autoscaling.queueDepth.enabled=true" }}
{{- end }}
{{- if and $v.autoscaling.enabled (gt (int $v.autoscaling.minReplicas) (int $v.autoscaling.maxReplicas)) }}
{{- fail (printf "autoscaling.minReplicas (%d) is above autoscaling.maxReplicas (%d)" (int $v.autoscaling.minReplicas) (int $v.autoscaling.maxReplicas)) }}
{{- end }}
{{- if and $v.keda.enabled (gt (int $v.keda.minReplicaCount) (int $v.keda.maxReplicaCount)) }}
{{- fail (printf "keda.minReplicaCount (%d) is above keda.maxReplicaCount (%d)" (int $v.keda.minReplicaCount) (int $v.keda.maxReplicaCount)) }}
{{- end }}
{{- if lt (int $v.server.maxQueueSize) (int $v.server.maxClientBatchSize) }}
{{- fail (printf "server.maxQueueSize (%d) must be at least server.maxClientBatchSize (%d): a full-size request could never be admitted" (int $v.server.maxQueueSize) (int $v.server.maxClientBatchSize)) }}
{{- end }}
{{- if and (not $v.server.torchNumThreads) (not (dig "limits" "cpu" "" $v.resources)) }}
{{- fail "resources.limits.cpu is required unless server.torchNumThreads is set: TORCH_NUM_THREADS comes from the CPU limit, and without one it would be the node's whole core count" }}
{{- end }}
{{- if and (eq $v.model.source "pvc") (not $v.model.pvc.claimName) }}
{{- fail "model.source=pvc needs model.pvc.claimName (an existing PersistentVolumeClaim holding the model)" }}
{{- end }}
{{- if and (eq $v.model.source "download") (not $v.model.download.repoId) }}
{{- fail "model.source=download needs model.download.repoId (the Hub repository to fetch, e.g. google-bert/bert-base-uncased)" }}
{{- end }}
{{- if and $v.apiKey.existingSecret $v.apiKey.value }}
{{- fail "set apiKey.existingSecret or apiKey.value, not both" }}
{{- end }}
{{- end }}
