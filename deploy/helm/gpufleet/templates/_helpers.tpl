{{- define "gpufleet.labels" -}}
app.kubernetes.io/part-of: gpufleet
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "gpufleet.image" -}}
{{ printf "%s:%s" .Values.image.repository .Values.image.tag }}
{{- end -}}

{{- define "gpufleet.databaseSecret" -}}
{{ default (printf "%s-database" .Release.Name) .Values.controller.database.existingSecret }}
{{- end -}}

{{- define "gpufleet.nodeSelectorString" -}}
{{- $terms := list -}}
{{- range $k, $v := .Values.gpuNodeSelector -}}
{{- $terms = append $terms (printf "%s=%s" $k $v) -}}
{{- end -}}
{{ join "," $terms }}
{{- end -}}
