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

{{/* The image reference; fails the render, saying how to get one, without a repository. */}}
{{- define "pipeline-server.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag }}
{{- $howto := printf "image.repository is required: no pipeline-server image is published. Build one from the repository's Dockerfile and push it to a registry your cluster can pull from (docker build -t REGISTRY/pipeline-server:%s . && docker push REGISTRY/pipeline-server:%s), or name one your organisation publishes, then install with --set image.repository=REGISTRY/pipeline-server (and --set image.tag=TAG for a tag other than %s)" $tag $tag .Chart.AppVersion }}
{{- $repository := required $howto .Values.image.repository }}
{{- if .Values.image.digest }}
{{- printf "%s:%s@%s" $repository $tag .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" $repository $tag }}
{{- end }}
{{- end }}

{{/* What NOTES.txt calls the served model: its served name, Hub id, or where it comes from. */}}
{{- define "pipeline-server.modelName" -}}
{{- $m := .Values.model }}
{{- if $m.servedName }}
{{- $m.servedName }}
{{- else if $m.id }}
{{- $m.id }}
{{- else if eq $m.source "download" }}
{{- $m.download.repoId }}{{ with $m.revision }} at revision {{ . }}{{ end }} (downloaded from the Hugging Face Hub at pod start)
{{- else if eq $m.source "pvc" }}
{{- printf "found in the PersistentVolumeClaim %s" $m.pvc.claimName }}{{ with $m.pvc.subPath }} (folder {{ . }}){{ end }}
{{- else }}
{{- "baked into the image (sentence-transformers/all-MiniLM-L6-v2 unless the image was built with another MODEL)" }}
{{- end }}
{{- end }}

{{/* The sentence NOTES.txt's curl and the `helm test` pod send: fill-mask needs a mask token. */}}
{{- define "pipeline-server.exampleInput" -}}
{{- if .Values.testPod.input }}
{{- .Values.testPod.input }}
{{- else if eq .Values.model.task "fill-mask" }}
{{- "Paris is the [MASK] of France." }}
{{- else }}
{{- "The weather is lovely today." }}
{{- end }}
{{- end }}

{{/* A resource quantity ("256Mi", "1Gi", "2G", 1e9) in bytes, as a float. */}}
{{- define "pipeline-server.bytes" -}}
{{- $q := toString . }}
{{- $units := dict "Ki" 1024.0 "Mi" 1048576.0 "Gi" 1073741824.0 "Ti" 1099511627776.0 "k" 1000.0 "M" 1000000.0 "G" 1000000000.0 "T" 1000000000000.0 "m" 0.001 }}
{{- $unit := regexFind "(Ki|Mi|Gi|Ti|k|M|G|T|m)$" $q }}
{{- mulf (trimSuffix $unit $q | float64) (get $units $unit | default 1.0) }}
{{- end }}

{{/*
The server's ephemeral-storage request: the size limits of the emptyDirs on the node's disk
(/tmp unless it is in memory, /cache, the downloaded model), in MiB, rounded up. The kubelet
evicts a pod whose emptyDir passes its limit; requesting the sum makes the scheduler place the
pod only where that much disk is free.
*/}}
{{- define "pipeline-server.ephemeralStorage" -}}
{{- $total := float64 (include "pipeline-server.bytes" .Values.cache.sizeLimit) }}
{{- if ne .Values.tmp.medium "Memory" }}
{{- $total = addf $total (include "pipeline-server.bytes" .Values.tmp.sizeLimit | float64) }}
{{- end }}
{{- if eq .Values.model.source "download" }}
{{- $total = addf $total (include "pipeline-server.bytes" .Values.model.download.sizeLimit | float64) }}
{{- end }}
{{- printf "%dMi" (divf $total 1048576.0 | ceil | int64) }}
{{- end }}

{{/* The server container's resources: the values, with the ephemeral-storage request added. */}}
{{- define "pipeline-server.resources" -}}
{{- $resources := deepCopy .Values.resources }}
{{- if not (dig "requests" "ephemeral-storage" "" $resources) }}
{{- $_ := set $resources.requests "ephemeral-storage" (include "pipeline-server.ephemeralStorage" .) }}
{{- end }}
{{- toYaml $resources }}
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
