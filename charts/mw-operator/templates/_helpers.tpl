{{- define "mw-operator.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "mw-operator.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "mw-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "mw-operator.serviceAccountName" -}}
{{- default (include "mw-operator.fullname" .) .Values.serviceAccount.name -}}
{{- end -}}

{{/* The operator's permissions in each watched namespace (or all); the same rules as config/rbac/cluster-role.yaml (tests/chart.rs checks). No Leases: see leaseRules. */}}
{{- define "mw-operator.rules" -}}
- apiGroups: ["opensource-server.mieweb.org"]
  resources: ["managedworkloads"]
  verbs: ["get", "list", "watch"]
- apiGroups: ["opensource-server.mieweb.org"]
  resources: ["managedworkloads/status"]
  verbs: ["get", "patch"]
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "list", "watch", "create", "patch"]
- apiGroups: ["apps"]
  resources: ["replicasets"]
  verbs: ["list", "watch"]
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch"]
- apiGroups: [""]
  resources: ["persistentvolumeclaims"]
  verbs: ["get", "list", "watch", "create", "patch"]
- apiGroups: [""]
  resources: ["services"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: ["events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
- apiGroups: [""]
  resources: ["events"]
  verbs: ["list"]
{{- end -}}

{{/* Leader election: the one Lease, in the operator's own namespace only; the same rules as config/rbac/leader-election-role.yaml with the configured Lease name (tests/chart.rs checks). create cannot be restricted by name. */}}
{{- define "mw-operator.leaseRules" -}}
- apiGroups: ["coordination.k8s.io"]
  resources: ["leases"]
  verbs: ["create"]
- apiGroups: ["coordination.k8s.io"]
  resources: ["leases"]
  resourceNames: [{{ .Values.leaderElection.leaseName | quote }}]
  verbs: ["get", "patch"]
{{- end -}}

{{/* The bridge (mw-operator bridge): its name, labels and permissions. */}}
{{- define "mw-operator.bridgeName" -}}
{{- printf "%s-bridge" (include "mw-operator.fullname" . | trunc 56 | trimSuffix "-") -}}
{{- end -}}

{{/* Distinct from the operator's selector labels, so neither Deployment's selector matches the other's Pods. */}}
{{- define "mw-operator.bridgeSelectorLabels" -}}
app.kubernetes.io/name: mw-bridge
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "mw-operator.bridgeLabels" -}}
{{ include "mw-operator.bridgeSelectorLabels" . }}
app.kubernetes.io/component: bridge
app.kubernetes.io/part-of: {{ .Chart.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "mw-operator.bridgeServiceAccountName" -}}
{{- default (include "mw-operator.bridgeName" .) .Values.bridge.serviceAccount.name -}}
{{- end -}}

{{/* The namespaces of bridge.nodes, checked and de-duplicated, comma-separated. */}}
{{- define "mw-operator.bridgeNamespaces" -}}
{{- if not .Values.bridge.nodes -}}
{{- fail "bridge.enabled: map at least one Manager node to a namespace in bridge.nodes ([{node: NAME, namespace: NAMESPACE}])" -}}
{{- end -}}
{{- $namespaces := list -}}
{{- range .Values.bridge.nodes -}}
{{- if not (and .node .namespace) -}}
{{- fail (printf "bridge.nodes: every entry needs a node and a namespace, got %v" .) -}}
{{- end -}}
{{- $namespaces = append $namespaces .namespace -}}
{{- end -}}
{{- $namespaces | uniq | join "," -}}
{{- end -}}

{{/* The bridge's permissions, granted in each mapped namespace; the same rules as config/rbac/bridge-role.yaml (tests/chart.rs checks). */}}
{{- define "mw-operator.bridgeRules" -}}
- apiGroups: ["opensource-server.mieweb.org"]
  resources: ["managedworkloads"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
{{- end -}}

{{/* An alert's labels: its severity and prometheusRule.alertLabels (which may not set severity: the schema refuses it). Called with (list SEVERITY ALERT_LABELS). */}}
{{- define "mw-operator.alertLabels" -}}
{{- toYaml (merge (dict "severity" (index . 0)) (index . 1 | default dict)) -}}
{{- end -}}
