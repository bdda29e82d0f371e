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

{{/* namespace of the chart's namespaced objects: namespace.name, or the
release's. */}}
{{- define "csi-fastblk.namespace" -}}
{{- default .Release.Namespace .Values.namespace.name -}}
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

{{/* The Secret of the peer CA, which the first plugin makes. */}}
{{- define "csi-fastblk.peerSecret" -}}
{{- printf "%s-peer-ca" (include "csi-fastblk.fullname" .) -}}
{{- end -}}

{{/* The audience of the peer channel's tokens: the installation's own, so
that a token of the plugin's account made for anything else (the API
server, another installation) is not taken by a peer. */}}
{{- define "csi-fastblk.peerAudience" -}}
{{- printf "%s/peer/%s/%s" .Values.driverName (include "csi-fastblk.namespace" .) (include "csi-fastblk.fullname" .) -}}
{{- end -}}

{{- define "csi-fastblk.peerTokenDir" -}}
/var/run/secrets/fastblk.csi.io/peer
{{- end -}}

{{/* The label selector of every node plugin pod of the installation (all
node groups): the plugin's peers. */}}
{{- define "csi-fastblk.peerSelector" -}}
{{- printf "app.kubernetes.io/name=%s,app.kubernetes.io/instance=%s,app.kubernetes.io/component=node" (include "csi-fastblk.name" .) .Release.Name -}}
{{- end -}}

{{/* The snapshot metadata service's Service, Secrets and RBAC. */}}
{{- define "csi-fastblk.snapshotMetadataName" -}}
{{- printf "%s-snapshot-metadata" (include "csi-fastblk.fullname" .) -}}
{{- end -}}

{{/* snapshotMetadataAddress is what the SnapshotMetadataService object
tells backup applications to dial: the Service's fixed cluster IP when
set, else its name in its namespace. */}}
{{- define "csi-fastblk.snapshotMetadataAddress" -}}
{{- $sm := .Values.snapshotMetadata -}}
{{- $host := printf "%s.%s" (include "csi-fastblk.snapshotMetadataName" .) (include "csi-fastblk.namespace" .) -}}
{{- with $sm.service.clusterIP -}}{{- $host = . -}}{{- end -}}
{{- printf "%s:%d" $host (int $sm.service.port) -}}
{{- end -}}

{{/* snapshotMetadataAudience is the audience of backup applications' tokens. */}}
{{- define "csi-fastblk.snapshotMetadataAudience" -}}
{{- default (printf "%s-snapshot-metadata" .Values.driverName) .Values.snapshotMetadata.audience -}}
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
{{- $ports := list (list "healthPort" .Values.healthPort)
  (list "provisioner.httpPort" .Values.provisioner.httpPort) (list "resizer.httpPort" .Values.resizer.httpPort) -}}
{{- if .Values.snapshotter.enabled -}}
{{- $ports = append $ports (list "snapshotter.httpPort" .Values.snapshotter.httpPort) -}}
{{- end -}}
{{- if .Values.metrics.enabled -}}
{{- $ports = append $ports (list "metrics.port" .Values.metrics.port) -}}
{{- end -}}
{{- if .Values.peer.enabled -}}
{{- $ports = append $ports (list "peer.port" .Values.peer.port) -}}
{{- end -}}
{{- if .Values.snapshotMetadata.enabled -}}
{{- $ports = append $ports (list "snapshotMetadata.port" .Values.snapshotMetadata.port) -}}
{{- $ports = append $ports (list "snapshotMetadata.httpPort" .Values.snapshotMetadata.httpPort) -}}
{{- if not .Values.peer.enabled -}}
{{- fail "snapshotMetadata.enabled needs peer.enabled: the Service sends each backup call to any node's sidecar, whose plugin forwards it over the peer channel to the node that holds the snapshot" -}}
{{- end -}}
{{- if not .Values.snapshotter.enabled -}}
{{- fail "snapshotMetadata.enabled needs snapshotter.enabled: without the csi-snapshotter there are no snapshots to list" -}}
{{- end -}}
{{- end -}}
{{- if and .Values.controllerExpansion (not .Values.peer.enabled) -}}
{{- fail "controllerExpansion needs peer.enabled: the external-resizer's one leader would ask its own node's plugin to grow every node's volumes, and without the peer channel that plugin cannot forward them" -}}
{{- end -}}
{{- $seen := dict -}}
{{- range $ports -}}
{{- $p := toString (index . 1) -}}
{{- if hasKey $seen $p -}}
{{- fail (printf "%s %s is already used by %s: the node pod's ports must differ" (index . 0) $p (get $seen $p)) -}}
{{- end -}}
{{- $_ := set $seen $p (index . 0) -}}
{{- end -}}
{{- $r := float64 .Values.overProvisionRatio -}}
{{- if or (lt $r 1.0) (gt $r 100.0) -}}
{{- fail (printf "overProvisionRatio %v must be from 1 to 100" .Values.overProvisionRatio) -}}
{{- end -}}
{{- $k := include "csi-fastblk.kubeletDir" . -}}
{{- range include "csi-fastblk.nodeGroups" . | fromYamlArray -}}
{{- $d := .dataDir | trimSuffix "/" -}}
{{- if or (eq $d $k) (hasPrefix (printf "%s/" $k) $d) -}}
{{- fail (printf "%s %s must not be inside kubeletDir %s (it would overlap the kubelet mounts)" .dataDirKey .dataDir $k) -}}
{{- end -}}
{{- $g := . -}}
{{- $seen := dict -}}
{{- range $i, $c := .deviceClasses -}}
{{- $p := $c.path | trimSuffix "/" -}}
{{- $where := printf "%s[%d] (%s)" $g.classesKey $i $c.name -}}
{{- if hasKey $seen $c.name -}}
{{- fail (printf "%s: the device class name %s is used twice" $where $c.name) -}}
{{- end -}}
{{- $_ := set $seen $c.name true -}}
{{- if or (eq $p $k) (hasPrefix (printf "%s/" $k) $p) (hasPrefix (printf "%s/" $p) $k) -}}
{{- fail (printf "%s: path %s must not overlap kubeletDir %s" $where $c.path $k) -}}
{{- end -}}
{{- if or (eq $p $d) (hasPrefix (printf "%s/" $d) $p) (hasPrefix (printf "%s/" $p) $d) -}}
{{- fail (printf "%s: path %s overlaps %s %s: each class needs a directory of its own" $where $c.path $g.dataDirKey $g.dataDir) -}}
{{- end -}}
{{- range $j, $o := $g.deviceClasses -}}
{{- $q := $o.path | trimSuffix "/" -}}
{{- if and (ne $i $j) (or (eq $p $q) (hasPrefix (printf "%s/" $q) $p)) -}}
{{- fail (printf "%s: path %s overlaps device class %s's path %s: each class needs a directory of its own" $where $c.path $o.name $o.path) -}}
{{- end -}}
{{- end -}}
{{- if hasKey $c "overProvisionRatio" -}}
{{- $r := float64 $c.overProvisionRatio -}}
{{- if or (lt $r 1.0) (gt $r 100.0) -}}
{{- fail (printf "%s: overProvisionRatio %v must be from 1 to 100" $where $c.overProvisionRatio) -}}
{{- end -}}
{{- end -}}
{{- $parent := dir $p -}}
{{- if or (eq $parent $k) (hasPrefix (printf "%s/" $parent) $k) (hasPrefix (printf "%s/" $k) $parent) -}}
{{- fail (printf "%s: path %s: its parent directory %s, which the chart mounts into the plugin pod, overlaps kubeletDir %s; put the class elsewhere" $where $c.path $parent $k) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $names := dict -}}
{{- $selectors := dict -}}
{{- range .Values.nodeGroups -}}
{{- if hasKey $names .name -}}
{{- fail (printf "nodeGroups: the name %q is used twice" .name) -}}
{{- end -}}
{{- $_ := set $names .name true -}}
{{- $sel := toJson .nodeSelector -}}
{{- if hasKey $selectors $sel -}}
{{- fail (printf "nodeGroups %s and %s have the same nodeSelector %s: a node must match at most one group" (get $selectors $sel) .name $sel) -}}
{{- end -}}
{{- $_ := set $selectors $sel .name -}}
{{- end -}}
{{- with .Values.plugin.resources.limits -}}
{{- if hasKey . "cpu" -}}
{{- fail "plugin.resources.limits.cpu: a CPU limit throttles the plugin's ublk server threads, which are the data path of every volume on the node; set requests only" -}}
{{- end -}}
{{- end -}}
{{- $classes := dict -}}
{{- $defaults := list -}}
{{- range include "csi-fastblk.storageClasses" . | fromYamlArray -}}
{{- if hasKey $classes .name -}}
{{- fail (printf "StorageClass %q is defined twice (storageClass and storageClasses)" .name) -}}
{{- end -}}
{{- $_ := set $classes .name true -}}
{{- if .isDefault -}}
{{- $defaults = append $defaults .name -}}
{{- end -}}
{{- end -}}
{{- if gt (len $defaults) 1 -}}
{{- fail (printf "StorageClasses %s are all marked isDefault: at most one class may be the cluster default" (join ", " $defaults)) -}}
{{- end -}}
{{- if and .Values.namespace.create (eq (include "csi-fastblk.namespace" .) .Release.Namespace) -}}
{{- fail (printf "namespace.create: set namespace.name to a namespace other than the release's (%s): Helm stores the release in its namespace before it creates anything, so that one must exist already (e.g. helm install -n kube-system --set namespace.create=true,namespace.name=csi-fastblk)" .Release.Namespace) -}}
{{- end -}}
{{- if and .Values.priorityClass.create (gt (int64 .Values.priorityClass.value) 1000000000) -}}
{{- fail (printf "priorityClass.value %v: a PriorityClass outside the system ones may be at most 1000000000" .Values.priorityClass.value) -}}
{{- end -}}
{{- end -}}

{{/* nodeGroups renders, as a YAML list, the node DaemonSets to create: each
group of values.nodeGroups, or one for every node. Each item: suffix (of the
DaemonSet's name, "" for the single one), group (its label value, "" for the
single one), nodeSelector, dataDir, dataDirKey (the value it came from, for
messages), reserve, hostPathType, deviceClasses (the group's, else
values.deviceClasses) and classesKey (where they came from). */}}
{{- define "csi-fastblk.nodeGroups" -}}
{{- $out := list -}}
{{- if .Values.nodeGroups -}}
{{- range $i, $g := .Values.nodeGroups -}}
{{- $sel := merge (dict) (deepCopy $g.nodeSelector) (deepCopy (default dict $.Values.nodeSelector)) -}}
{{- $create := ternary $g.createDataDir true (hasKey $g "createDataDir") -}}
{{- $own := hasKey $g "deviceClasses" -}}
{{- $out = append $out (dict "suffix" (printf "-%s" $g.name) "group" $g.name "nodeSelector" $sel
  "dataDir" $g.dataDir "dataDirKey" (printf "nodeGroups[%d].dataDir" $i)
  "reserve" (include "csi-fastblk.size" (ternary $g.reserve $.Values.reserve (hasKey $g "reserve")))
  "hostPathType" (ternary "DirectoryOrCreate" "Directory" $create)
  "deviceClasses" (default list (ternary $g.deviceClasses $.Values.deviceClasses $own))
  "classesKey" (ternary (printf "nodeGroups[%d].deviceClasses" $i) "deviceClasses" $own)) -}}
{{- end -}}
{{- else -}}
{{- $out = append $out (dict "suffix" "" "group" "" "nodeSelector" (default dict .Values.nodeSelector)
  "dataDir" .Values.dataDir "dataDirKey" "dataDir" "reserve" (include "csi-fastblk.size" .Values.reserve) "hostPathType" "DirectoryOrCreate"
  "deviceClasses" (default list .Values.deviceClasses) "classesKey" "deviceClasses") -}}
{{- end -}}
{{- toYaml $out -}}
{{- end -}}

{{/* deviceClassArg renders a device class as --device-class's value. */}}
{{- define "csi-fastblk.deviceClassArg" -}}
{{- $r := include "csi-fastblk.size" .reserve -}}
{{- printf "name=%s,path=%s" .name (.path | trimSuffix "/") -}}
{{- if not (has $r (list "" "0")) }},reserve={{ $r }}{{ end -}}
{{- with .overProvisionRatio }},over-provision-ratio={{ . }}{{ end -}}
{{- end -}}

{{/* classParents renders, as a YAML list, the parent directories of a node
group's device class paths, each once, sorted: the chart mounts these, so
that a class's missing path is the plugin's error for that class alone.
Call with a node group item. */}}
{{- define "csi-fastblk.classParents" -}}
{{- $parents := dict -}}
{{- range .deviceClasses -}}
{{- $_ := set $parents (dir (.path | trimSuffix "/")) true -}}
{{- end -}}
{{- toYaml (keys $parents | sortAlpha) -}}
{{- end -}}

{{/* storageClasses renders, as a YAML list, every StorageClass to create:
storageClass (when create) and each item of storageClasses with the keys it
leaves out taken from storageClass (isDefault excepted). */}}
{{- define "csi-fastblk.storageClasses" -}}
{{- $out := list -}}
{{- $base := .Values.storageClass -}}
{{- if $base.create -}}
{{- $out = append $out (omit $base "create") -}}
{{- end -}}
{{- range .Values.storageClasses -}}
{{- $item := . -}}
{{- $sc := dict -}}
{{- range $k, $v := omit $base "create" "isDefault" -}}
{{- $_ := set $sc $k (ternary (get $item $k) $v (hasKey $item $k)) -}}
{{- end -}}
{{- $_ := set $sc "isDefault" (and (hasKey $item "isDefault") $item.isDefault) -}}
{{- $out = append $out $sc -}}
{{- end -}}
{{- toYaml $out -}}
{{- end -}}

{{/* priorityClassName is the node pods' class: the chart's own when
priorityClass.create, else priorityClassName. */}}
{{- define "csi-fastblk.priorityClassName" -}}
{{- if .Values.priorityClass.create -}}
{{- printf "%s-node-critical" (include "csi-fastblk.fullname" .) -}}
{{- else -}}
{{- .Values.priorityClassName -}}
{{- end -}}
{{- end -}}

{{/* snapshotAPI is "true" when the cluster serves snapshot.storage.k8s.io/v1:
its own CRDs, or the chart's, which Helm installs before it reads the
cluster's APIs (helm template: --api-versions snapshot.storage.k8s.io/v1). */}}
{{- define "csi-fastblk.snapshotAPI" -}}
{{- if .Capabilities.APIVersions.Has "snapshot.storage.k8s.io/v1" -}}true{{- end -}}
{{- end -}}

{{/* snapshotClass is "true" when the VolumeSnapshotClass can work: the
snapshotter runs, the API exists and a distributed snapshot-controller is
installed by the chart or declared present. */}}
{{- define "csi-fastblk.snapshotClass" -}}
{{- $c := .Values.snapshotController -}}
{{- if and .Values.snapshotClass.create .Values.snapshotter.enabled (include "csi-fastblk.snapshotAPI" .) (or $c.install $c.distributedInCluster) -}}true{{- end -}}
{{- end -}}

{{/* groupSnapshotAPI is "true" when the cluster serves
groupsnapshot.storage.k8s.io/v1 (the chart's CRDs on a fresh install; Helm
installs crds/ only then, so an upgraded release gets group snapshots once
the CRDs are applied by hand). Without it the csi-snapshotter's and the
snapshot-controller's group flag stays off: with the flag on and no CRDs,
the csi-snapshotter (v8.6.0) waits for its group informers for ever and
handles no snapshot at all. */}}
{{- define "csi-fastblk.groupSnapshotAPI" -}}
{{- if and .Values.snapshotter.enabled (.Capabilities.APIVersions.Has "groupsnapshot.storage.k8s.io/v1") -}}true{{- end -}}
{{- end -}}

{{/* groupSnapshotClass is "true" when the VolumeGroupSnapshotClass can
work: as the VolumeSnapshotClass (snapshotClass), with the group API. (A
release upgraded with --reuse-values from a chart without
groupSnapshotClass has no such value: no class.) */}}
{{- define "csi-fastblk.groupSnapshotClass" -}}
{{- $c := .Values.snapshotController -}}
{{- if and (dig "create" false (.Values.groupSnapshotClass | default dict)) (include "csi-fastblk.groupSnapshotAPI" .) (or $c.install $c.distributedInCluster) -}}true{{- end -}}
{{- end -}}

{{/* sidecarProbe renders the port and liveness probe of a sidecar's
--http-endpoint. Call with (list portName port path). */}}
{{- define "csi-fastblk.sidecarProbe" -}}
ports:
  - name: {{ index . 0 }}
    containerPort: {{ index . 1 }}
    protocol: TCP
livenessProbe:
  httpGet:
    path: {{ index . 2 }}
    port: {{ index . 0 }}
  initialDelaySeconds: 10
  periodSeconds: 20
  timeoutSeconds: 10
  failureThreshold: 5
{{- end -}}

{{/* seconds turns a Go duration of whole seconds ("3s") into its number. */}}
{{- define "csi-fastblk.seconds" -}}
{{- . | trimSuffix "s" | int -}}
{{- end -}}

{{/* size renders a size value: a string as it is, a number (YAML numbers
reach templates as float64) in plain digits. */}}
{{- define "csi-fastblk.size" -}}
{{- if kindIs "string" . -}}{{ . }}{{- else if kindIs "invalid" . -}}{{- else -}}{{ printf "%d" (int64 .) }}{{- end -}}
{{- end -}}
