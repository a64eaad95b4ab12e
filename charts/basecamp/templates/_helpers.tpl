{{/*
Names, labels and the few derived values every template shares.
*/}}

{{/* The chart name, or nameOverride. */}}
{{- define "basecamp.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The prefix of every resource name: fullnameOverride, else <release>-<name>,
or the release name alone when it already contains the chart name.
*/}}
{{- define "basecamp.fullname" -}}
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

{{- define "basecamp.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels on every resource. */}}
{{- define "basecamp.labels" -}}
helm.sh/chart: {{ include "basecamp.chart" . }}
{{ include "basecamp.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: basecamp
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* The operator pods' selector: stable across upgrades, never add to it. */}}
{{- define "basecamp.selectorLabels" -}}
app.kubernetes.io/name: {{ include "basecamp.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "basecamp.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "basecamp.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false: name an existing ServiceAccount" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* repository[:tag][@digest] of an image dict, the tag defaulting to $default. */}}
{{- define "basecamp.imageRef" -}}
{{- $image := index . 0 }}
{{- $defaultRepository := index . 1 }}
{{- $defaultTag := index . 2 }}
{{- $repository := default $defaultRepository $image.repository }}
{{- if $image.digest }}
{{- printf "%s@%s" $repository $image.digest }}
{{- else }}
{{- printf "%s:%s" $repository (default $defaultTag $image.tag | toString) }}
{{- end }}
{{- end }}

{{/* The operator image. */}}
{{- define "basecamp.image" -}}
{{- include "basecamp.imageRef" (list .Values.image .Values.image.repository .Chart.AppVersion) }}
{{- end }}

{{/* The sandbox image: sandbox.image, falling back to the operator image. */}}
{{- define "basecamp.sandboxImage" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag }}
{{- if and (not .Values.sandbox.image.repository) (not .Values.sandbox.image.tag) (not .Values.sandbox.image.digest) }}
{{- include "basecamp.image" . }}
{{- else }}
{{- include "basecamp.imageRef" (list .Values.sandbox.image .Values.image.repository $tag) }}
{{- end }}
{{- end }}

{{/* The metrics Service name; Prometheus names the scrape job after it. */}}
{{- define "basecamp.metricsServiceName" -}}
{{- printf "%s-metrics" (include "basecamp.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Cross-field checks the JSON schema cannot state clearly. Each failure says
what is wrong and what to set instead.
*/}}
{{- define "basecamp.validate" -}}
{{- if and (gt (int .Values.operator.replicas) 1) (not .Values.leaderElection.enabled) }}
{{- fail (printf "operator.replicas is %d but leaderElection.enabled is false: several operators would reconcile the same tasks at once. Set leaderElection.enabled=true or operator.replicas=1." (int .Values.operator.replicas)) }}
{{- end }}
{{- if and .Values.metrics.serviceMonitor.enabled (not .Values.metrics.service.enabled) }}
{{- fail "metrics.serviceMonitor.enabled needs metrics.service.enabled: the ServiceMonitor scrapes the metrics Service" }}
{{- end }}
{{- if ne (len (.Values.watchNamespaces | uniq)) (len .Values.watchNamespaces) }}
{{- fail (printf "watchNamespaces lists a namespace twice: %s" (join ", " .Values.watchNamespaces)) }}
{{- end }}
{{- end }}

{{/* initialDelaySeconds … failureThreshold of a probe's values. */}}
{{- define "basecamp.probeTimings" -}}
initialDelaySeconds: {{ .initialDelaySeconds }}
periodSeconds: {{ .periodSeconds }}
timeoutSeconds: {{ .timeoutSeconds }}
failureThreshold: {{ .failureThreshold }}
{{- end }}
