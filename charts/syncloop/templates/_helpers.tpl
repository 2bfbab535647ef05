{{- define "syncloop.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "syncloop.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else if contains (include "syncloop.name" .) .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name (include "syncloop.name" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "syncloop.selectorLabels" -}}
app.kubernetes.io/name: {{ include "syncloop.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "syncloop.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "syncloop.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "syncloop.serviceAccountName" -}}
{{- default (include "syncloop.fullname" .) .Values.serviceAccount.name }}
{{- end }}

{{/* The rule files: every key of .Values.rules but the two settings. */}}
{{- define "syncloop.ruleFiles" -}}
{{- $files := dict }}
{{- range $name, $text := .Values.rules }}
{{- if not (has $name (list "existingConfigMap" "rolloutOnChange")) }}
{{- $_ := set $files $name $text }}
{{- end }}
{{- end }}
{{- toYaml $files }}
{{- end }}

{{- define "syncloop.rulesConfigMap" -}}
{{- default (printf "%s-rules" (include "syncloop.fullname" .)) .Values.rules.existingConfigMap }}
{{- end }}

{{/*
The installation's name (--installation), which its children carry, so that
installations in one cluster never take each other's children: the value,
else the release's name. An upgrade of a release installed before
installations had names (its Deployment passes no --installation) keeps it
the default installation, whose children carry no name: they stay its own.
*/}}
{{- define "syncloop.installation" -}}
{{- if .Values.installation }}
{{- .Values.installation }}
{{- else }}
{{- $dep := lookup "apps/v1" "Deployment" .Release.Namespace (include "syncloop.fullname" .) }}
{{- $args := list }}
{{- range (dig "spec" "template" "spec" "containers" (list) $dep) }}
{{- $args = concat $args (.args | default list) }}
{{- end }}
{{- $named := false }}
{{- range $args }}
{{- if hasPrefix "--installation" . }}{{ $named = true }}{{ end }}
{{- end }}
{{- if or (not $dep) $named }}
{{- .Release.Name }}
{{- end }}
{{- end }}
{{- end }}

{{/*
identity.defaultServiceAccount as NAMESPACE/NAME (a NAME alone is in the
release's namespace), or "" when rules act as syncloop's own ServiceAccount.
*/}}
{{- define "syncloop.defaultServiceAccount" -}}
{{- with .Values.identity.defaultServiceAccount }}
{{- if contains "/" . }}{{ . }}{{ else }}{{ printf "%s/%s" $.Release.Namespace . }}{{ end }}
{{- end }}
{{- end }}

{{/*
The ServiceAccounts syncloop may impersonate, NAMESPACE/NAME each: the
default one and identity.serviceAccounts.
*/}}
{{- define "syncloop.impersonated" -}}
{{- $all := list }}
{{- with include "syncloop.defaultServiceAccount" . }}{{ $all = append $all . }}{{ end }}
{{- range .Values.identity.serviceAccounts }}
{{- if not (contains "/" .) }}{{ fail (printf "identity.serviceAccounts: %q is not NAMESPACE/NAME" .) }}{{ end }}
{{- $all = append $all . }}
{{- end }}
{{- toJson (uniq $all) }}
{{- end }}

{{- define "syncloop.leaseName" -}}
{{- default (include "syncloop.fullname" .) .Values.leaderElection.id }}
{{- end }}

{{/* Pod Security "restricted" for every container. */}}
{{- define "syncloop.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
capabilities:
  drop: [ALL]
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/*
What the rules may do (rbac.mode), as ClusterRole or Role rules: granted to
syncloop's ServiceAccount, or with identity.defaultServiceAccount to that
one.
*/}}
{{- define "syncloop.rulesRights" -}}
{{- if eq .Values.rbac.mode "unrestricted" }}
  # Any resource, any verb (cluster-admin in effect, as kro's default; with
  # watchNamespace, admin of that namespace only): rules
  # may name any kind, and a child RoleBinding to a ClusterRole passes the
  # API server's escalation check only for who holds that role's rights or
  # may bind it.
  - apiGroups: ["*"]
    resources: ["*"]
    verbs: ["*"]
{{- else }}
  {{- if not .Values.rbac.rules }}
  {{- fail "rbac.mode restricted needs rbac.rules: what your rules' kinds require" }}
  {{- end }}
  {{- toYaml .Values.rbac.rules | nindent 2 }}
{{- end }}
{{- end }}

{{/*
The Secret of the conversion webhook's CA and certificate, as syncloop
names it: syncloop-webhook-tls, or syncloop-<installation>-webhook-tls.
*/}}
{{- define "syncloop.webhookSecret" -}}
{{- with include "syncloop.installation" . -}}
syncloop-{{ . }}-webhook-tls
{{- else -}}
syncloop-webhook-tls
{{- end -}}
{{- end }}
