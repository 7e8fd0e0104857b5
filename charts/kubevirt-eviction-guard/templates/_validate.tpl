{{/*
What the guard refuses at start-up (app/config.py, app/serve.py), refused here at render time, with the
guard's words: a value the guard would crash-loop on never reaches the cluster. values.schema.json checks
each value's shape; this also holds when the schema is skipped (helm --skip-schema-validation), and checks
what a schema cannot: one value against another, and durations by their length.
*/}}

{{/* A Go duration ("15m", "1h30m", "0") as seconds (a float, as text); "invalid" when it is not one. */}}
{{- define "guard.seconds" -}}
{{- $text := toString . | trim -}}
{{- $unit := dict "ns" 0.000000001 "us" 0.000001 "µs" 0.000001 "ms" 0.001 "s" 1.0 "m" 60.0 "h" 3600.0 -}}
{{- $sign := 1.0 -}}
{{- if hasPrefix "-" $text }}{{ $sign = -1.0 }}{{ $text = trimPrefix "-" $text }}{{ else }}{{ $text = trimPrefix "+" $text }}{{ end -}}
{{- if eq $text "0" -}}
0
{{- else if not (regexMatch "^(([0-9]+(\\.[0-9]*)?|\\.[0-9]+)(ns|us|µs|ms|s|m|h))+$" $text) -}}
invalid
{{- else -}}
{{- $total := 0.0 -}}
{{- range regexFindAll "([0-9]+(\\.[0-9]*)?|\\.[0-9]+)(ns|us|µs|ms|s|m|h)" $text -1 -}}
{{- $u := regexFind "(ns|us|µs|ms|s|m|h)$" . -}}
{{- $total = addf $total (mulf (trimSuffix $u . | float64) (get $unit $u)) -}}
{{- end -}}
{{- mulf $sign $total -}}
{{- end -}}
{{- end }}

{{/* Fail with the guard's message when a duration value is not a Go duration or is negative (or not
positive, with "positive"). Arguments: list NAME VALUE [positive]. */}}
{{- define "guard.checkDuration" -}}
{{- $name := index . 0 -}}{{- $value := index . 1 -}}
{{- $seconds := include "guard.seconds" $value -}}
{{- if eq $seconds "invalid" -}}
{{- fail (printf "%s: not a duration: %q (write it the Go way: 90s, 15m, 1h30m)" $name (toString $value)) -}}
{{- else if and (gt (len .) 2) (le (float64 $seconds) 0.0) -}}
{{- fail (printf "%s: must be a positive duration, got %q" $name (toString $value)) -}}
{{- else if lt (float64 $seconds) 0.0 -}}
{{- fail (printf "%s: must not be negative, got %s" $name (toString $value)) -}}
{{- end -}}
{{- end }}

{{- define "guard.validate" -}}
{{- $p := .Values.policy -}}
{{- range $name := list "migrationCooldown" "maxMigrationCooldown" "migrationHistoryWindow" "evacuationStaleAfter" "nodeCooldown" "targetNodeCooldown" "nodeCooldownWindow" "maxNodeCooldown" -}}
{{- include "guard.checkDuration" (list (printf "policy.%s" $name) (get $p $name)) -}}
{{- end -}}
{{- $floor := include "guard.seconds" $p.migrationCooldown | float64 -}}
{{- $cap := include "guard.seconds" $p.maxMigrationCooldown | float64 -}}
{{- if and (gt $cap 0.0) (gt $floor 0.0) (lt $cap $floor) -}}
{{- fail (printf "policy.maxMigrationCooldown: must be 0 (no cap) or at least migrationCooldown (%s < %s)" (toString $p.maxMigrationCooldown) (toString $p.migrationCooldown)) -}}
{{- end -}}
{{- if not (has $p.cooldownScope (list "descheduler" "all")) -}}
{{- fail (printf "policy.cooldownScope: must be 'descheduler' or 'all', got %q" (toString $p.cooldownScope)) -}}
{{- end -}}
{{- if lt (int $p.pendingEvacuationsPerNode) 0 -}}
{{- fail (printf "policy.pendingEvacuationsPerNode: must not be negative, got %v" $p.pendingEvacuationsPerNode) -}}
{{- end -}}
{{- if or (lt (int $p.evacuationStaleAfterFailures) 0) (gt (int $p.evacuationStaleAfterFailures) 5) -}}
{{- fail (printf "policy.evacuationStaleAfterFailures: must be between 0 (off) and 5 (KubeVirt keeps only the 5 most recent finished migrations of a VMI), got %v" $p.evacuationStaleAfterFailures) -}}
{{- end -}}
{{- range $name := list "steeringMinGain" "steeringMargin" -}}
{{- $v := get $p $name -}}
{{- if or (lt (float64 $v) 0.0) (gt (float64 $v) 100.0) -}}
{{- fail (printf "policy.%s: must be between 0 and 100 score points, got %v" $name $v) -}}
{{- end -}}
{{- end -}}
{{- $s := .Values.server -}}
{{- if or (lt (int $s.port) 1) (gt (int $s.port) 65535) -}}
{{- fail (printf "server.port: expected a port number from 1 to 65535, got %v" $s.port) -}}
{{- end -}}
{{- if or (lt (int $s.metricsPort) 1) (gt (int $s.metricsPort) 65535) -}}
{{- fail (printf "server.metricsPort: expected a port number from 1 to 65535, got %v" $s.metricsPort) -}}
{{- end -}}
{{- if lt (float64 $s.tlsReloadInterval) 0.0 -}}
{{- fail (printf "server.tlsReloadInterval: expected a number of seconds, 0 or more, got %v" $s.tlsReloadInterval) -}}
{{- end -}}
{{- if lt (int64 $s.maxBodyBytes) 1 -}}
{{- fail (printf "server.maxBodyBytes: expected a positive whole number, got %v" $s.maxBodyBytes) -}}
{{- end -}}
{{- with .Values.server.staleAfter -}}
{{- include "guard.checkDuration" (list "server.staleAfter" . "positive") -}}
{{- end -}}
{{- if eq (int .Values.server.metricsPort) (int .Values.server.port) -}}
{{- fail (printf "server.metricsPort: must be a port other than server.port %v" .Values.server.port) -}}
{{- end -}}
{{- range $i, $c := .Values.prometheus.discovery.policyConfigMaps -}}
{{- if not (and $c.namespace $c.name) -}}
{{- fail (printf "prometheus.discovery.policyConfigMaps[%d]: needs both namespace and name" $i) -}}
{{- end -}}
{{- end -}}
{{- with .Values.prometheus.discovery.authTokenSecret -}}
{{- if ne (empty .namespace) (empty .name) -}}
{{- fail "prometheus.discovery.authTokenSecret: needs both namespace and name, or neither" -}}
{{- end -}}
{{- end -}}
{{- if and (eq .Values.prometheus.steering "off") .Values.prometheus.url -}}
{{- fail "prometheus.steering: off contradicts prometheus.url (give one or the other)" -}}
{{- end -}}
{{- if include "guard.steering" . -}}
{{- include "guard.checkDuration" (list "prometheus.interval" .Values.prometheus.interval "positive") -}}
{{- include "guard.checkDuration" (list "prometheus.timeout" .Values.prometheus.timeout "positive") -}}
{{- with .Values.prometheus.maxAge -}}
{{- include "guard.checkDuration" (list "prometheus.maxAge" . "positive") -}}
{{- end -}}
{{- end -}}
{{- end }}
