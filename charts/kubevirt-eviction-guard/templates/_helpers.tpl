{{/* Chart name, truncated to the 63 characters a label value allows. */}}
{{- define "guard.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Fully qualified app name; every object of the release is named after it. */}}
{{- define "guard.fullname" -}}
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

{{- define "guard.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "guard.selectorLabels" -}}
app.kubernetes.io/name: {{ include "guard.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "guard.labels" -}}
helm.sh/chart: {{ include "guard.chart" . }}
{{ include "guard.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: admission-webhook
{{- end }}

{{- define "guard.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "guard.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The Secret mounted as the serving certificate. */}}
{{- define "guard.tlsSecretName" -}}
{{- if eq .Values.certificates.mode "secret" }}
{{- required "certificates.secret.name is required when certificates.mode is secret" .Values.certificates.secret.name }}
{{- else }}
{{- printf "%s-tls" (include "guard.fullname" .) }}
{{- end }}
{{- end }}

{{/* DNS names the API server may use for the Service. */}}
{{- define "guard.dnsNames" -}}
{{- $svc := include "guard.fullname" . -}}
{{- $ns := .Release.Namespace -}}
{{- list $svc (printf "%s.%s" $svc $ns) (printf "%s.%s.svc" $svc $ns) (printf "%s.%s.svc.cluster.local" $svc $ns) | toJson }}
{{- end }}

{{- define "guard.webhookName" -}}
{{- default (printf "%s.%s.svc" (include "guard.fullname" .) .Release.Namespace) .Values.webhook.name }}
{{- end }}

{{- define "guard.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* Where the mounted files are inside the container. */}}
{{- define "guard.tlsDir" -}}/etc/kubevirt-eviction-guard/tls{{- end }}
{{- define "guard.configDir" -}}/etc/kubevirt-eviction-guard/config{{- end }}

{{- define "guard.clientCADir" -}}/etc/kubevirt-eviction-guard/client-ca{{- end }}

{{/* "true" when the guard may steer: prometheus.steering auto with a url, or with policy ConfigMaps to find one in. */}}
{{- define "guard.steering" -}}
{{- with .Values.prometheus -}}
{{- if and (eq .steering "auto") (or .url .discovery.policyConfigMaps) -}}true{{- end -}}
{{- end -}}
{{- end }}

{{/* The policy ConfigMaps (and the authToken Secret's namespace) by namespace, as JSON: {"ns": ["name", ...]}. */}}
{{- define "guard.policyConfigMapsByNamespace" -}}
{{- $out := dict -}}
{{- range .Values.prometheus.discovery.policyConfigMaps -}}
{{- $_ := set $out .namespace (append (get $out .namespace | default list) .name | uniq) -}}
{{- end -}}
{{- with .Values.prometheus.discovery.authTokenSecret -}}
{{- if and .namespace (not (hasKey $out .namespace)) -}}
{{- $_ := set $out .namespace list -}}
{{- end -}}
{{- end -}}
{{- $out | toJson -}}
{{- end }}

{{/* The ServiceAccount (and its token Secret) that reads Prometheus for steering: never the guard's own token. */}}
{{- define "guard.metricsReaderName" -}}
{{- printf "%s-metrics-reader" (include "guard.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
--max-connections: server.maxConnections when set; else sized from resources.limits.memory (Ki, Mi, Gi, K, M, G or
bytes): at most ~384 KiB a connection (bodies held just under maxBodyBytes with their TLS buffers, measured by
`make reliability`), on half the limit: 4/3 of the limit in MiB. Empty without a limit (the guard's default).
*/}}
{{- define "guard.maxConnections" -}}
{{- if .Values.server.maxConnections }}
{{- .Values.server.maxConnections | int64 }}
{{- else if and .Values.resources .Values.resources.limits .Values.resources.limits.memory }}
{{- $m := toString .Values.resources.limits.memory }}
{{- $mib := 0 }}
{{- if hasSuffix "Gi" $m }}{{ $mib = mul (trimSuffix "Gi" $m | int64) 1024 }}
{{- else if hasSuffix "Mi" $m }}{{ $mib = trimSuffix "Mi" $m | int64 }}
{{- else if hasSuffix "Ki" $m }}{{ $mib = div (trimSuffix "Ki" $m | int64) 1024 }}
{{- else if hasSuffix "G" $m }}{{ $mib = div (mul (trimSuffix "G" $m | int64) 1000000000) 1048576 }}
{{- else if hasSuffix "M" $m }}{{ $mib = div (mul (trimSuffix "M" $m | int64) 1000000) 1048576 }}
{{- else if hasSuffix "K" $m }}{{ $mib = div (mul (trimSuffix "K" $m | int64) 1000) 1048576 }}
{{- else if regexMatch "^[0-9]+$" $m }}{{ $mib = div ($m | int64) 1048576 }}
{{- else }}{{ fail (printf "resources.limits.memory: cannot size server.maxConnections from %q; set server.maxConnections" $m) }}
{{- end }}
{{- max 8 (div (mul $mib 4) 3) }}
{{- end }}
{{- end }}

{{/* The uninstall hook's objects (uninstall-hook.yaml). Their labels leave out the guard's selector labels: the
Service, the PodDisruptionBudget and the NetworkPolicy never select the hook's pod. */}}
{{- define "guard.unregisterName" -}}
{{- printf "%s-unregister" (include "guard.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "guard.unregisterLabels" -}}
helm.sh/chart: {{ include "guard.chart" . }}
app.kubernetes.io/name: {{ printf "%s-unregister" (include "guard.name" .) | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: uninstall-hook
{{- end }}
