{{/* Names, labels and derived paths shared by every template. */}}

{{- define "csi-fastblk.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Base name of the release's objects: the release name, or the chart
name when the release already carries it. */}}
{{- define "csi-fastblk.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "csi-fastblk.labels" -}}
app.kubernetes.io/name: {{ include "csi-fastblk.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: csi-fastblk
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "csi-fastblk.selectorLabels" -}}
app.kubernetes.io/name: {{ include "csi-fastblk.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* image renders "repository:tag" from an image value; the plugin's empty
tag falls back to the chart's appVersion. Call with (list $ .Values.x.image). */}}
{{- define "csi-fastblk.image" -}}
{{- $root := index . 0 -}}
{{- $img := index . 1 -}}
{{- printf "%s:%s" $img.repository (default $root.Chart.AppVersion $img.tag) -}}
{{- end -}}

{{- define "csi-fastblk.kubeletDir" -}}
{{- .Values.kubeletDir | trimSuffix "/" -}}
{{- end -}}

{{/* Host directory of the driver socket; mounted at /csi in every container. */}}
{{- define "csi-fastblk.socketDir" -}}
{{- printf "%s/plugins/%s" (include "csi-fastblk.kubeletDir" .) .Values.driverName -}}
{{- end -}}

{{- define "csi-fastblk.nodeServiceAccount" -}}
{{- printf "%s-node" (include "csi-fastblk.fullname" .) -}}
{{- end -}}

{{- define "csi-fastblk.snapshotControllerName" -}}
{{- printf "%s-snapshot-controller" (include "csi-fastblk.fullname" .) -}}
{{- end -}}

{{/* Sidecar security context: privileged only for SELinux socket access. */}}
{{- define "csi-fastblk.sidecarSecurityContext" -}}
securityContext:
  privileged: {{ .Values.sidecarsPrivileged }}
{{- end -}}

{{- define "csi-fastblk.nodeNameEnv" -}}
- name: NODE_NAME
  valueFrom:
    fieldRef:
      apiVersion: v1
      fieldPath: spec.nodeName
{{- end -}}

{{- define "csi-fastblk.namespaceEnv" -}}
- name: NAMESPACE
  valueFrom:
    fieldRef:
      apiVersion: v1
      fieldPath: metadata.namespace
{{- end -}}

{{/* validate fails the render on combinations the schema cannot express. */}}
{{- define "csi-fastblk.validate" -}}
{{- $ports := dict -}}
{{- $_ := set $ports (toString .Values.healthPort) "healthPort" -}}
{{- $r := toString .Values.registrar.healthPort -}}
{{- if hasKey $ports $r -}}
{{- fail (printf "registrar.healthPort %s is already used by %s: the node pod's ports must differ" $r (get $ports $r)) -}}
{{- end -}}
{{- $_ := set $ports $r "registrar.healthPort" -}}
{{- if .Values.metrics.enabled -}}
{{- $m := toString .Values.metrics.port -}}
{{- if hasKey $ports $m -}}
{{- fail (printf "metrics.port %s is already used by %s: the node pod's ports must differ" $m (get $ports $m)) -}}
{{- end -}}
{{- end -}}
{{- $r := float64 .Values.overProvisionRatio -}}
{{- if or (lt $r 1.0) (gt $r 100.0) -}}
{{- fail (printf "overProvisionRatio %v must be from 1 to 100" .Values.overProvisionRatio) -}}
{{- end -}}
{{- $k := include "csi-fastblk.kubeletDir" . -}}
{{- $d := .Values.dataDir | trimSuffix "/" -}}
{{- if or (eq $d $k) (hasPrefix (printf "%s/" $k) $d) -}}
{{- fail (printf "dataDir %s must not be inside kubeletDir %s (it would overlap the kubelet mounts)" .Values.dataDir .Values.kubeletDir) -}}
{{- end -}}
{{- end -}}
