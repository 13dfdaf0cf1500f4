{{/*
Labels. Every object carries the standard ones: app.kubernetes.io/name and
component say which part of vpcni it belongs to (vpcnid/agent,
vpcni-controller/controller, vpcni/monitoring), part-of is kustomize's
(deploy/kustomization.yaml), and instance, version, managed-by and
helm.sh/chart are Helm's, which deploy/ has not (make helm compares the
rest). Selectors use app.kubernetes.io/name alone: a selector cannot change
once the object exists, and the version and chart labels change at every
upgrade.
*/}}
{{- define "vpcni.labels" -}}
app.kubernetes.io/name: {{ .name }}
app.kubernetes.io/component: {{ .component }}
app.kubernetes.io/part-of: vpcni
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/version: {{ .root.Values.image.tag | default .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" }}
{{- end }}

{{- define "vpcni.agentLabels" -}}
{{ include "vpcni.labels" (dict "root" . "name" "vpcnid" "component" "agent") }}
{{- end }}

{{- define "vpcni.controllerLabels" -}}
{{ include "vpcni.labels" (dict "root" . "name" "vpcni-controller" "component" "controller") }}
{{- end }}

{{- define "vpcni.monitoringLabels" -}}
{{ include "vpcni.labels" (dict "root" . "name" "vpcni" "component" "monitoring") }}
{{- end }}

{{/*
The agent's metrics port: the port of agent.config.metricsAddr ("" when
metrics are off).
*/}}
{{- define "vpcni.agentMetricsPort" -}}
{{- with .Values.agent.config.metricsAddr -}}
{{- regexFind "[0-9]+$" . -}}
{{- end -}}
{{- end }}

{{- define "vpcni.image" -}}
{{ required "image.repository is required" .Values.image.repository }}:{{ required "image.tag is required" .Values.image.tag }}
{{- end }}

{{- define "vpcni.imagePullPolicy" -}}
{{- with .Values.image.pullPolicy }}
imagePullPolicy: {{ . }}
{{- end }}
{{- end }}

{{/*
vpcnid.yaml: agent.config with provider (only the section of the chosen
type), datapath and pool set over it.
*/}}
{{- define "vpcni.agentConfig" -}}
{{- $type := .Values.provider.type -}}
{{- if not (has $type (list "openstack" "static")) -}}
{{- fail (printf "provider.type is %q: want openstack or static" (toString $type)) -}}
{{- end -}}
{{- $c := deepCopy (.Values.agent.config | default dict) -}}
{{- $p := dict "type" $type -}}
{{- with get .Values.provider $type -}}
{{- $_ := set $p $type . -}}
{{- end -}}
{{- $_ := set $c "provider" $p -}}
{{- with .Values.datapath -}}
{{- $_ := set $c "datapath" . -}}
{{- end -}}
{{- with .Values.pool -}}
{{- $_ := set $c "pool" . -}}
{{- end -}}
{{- toYaml $c -}}
{{- end }}

{{/*
10-vpcni.conflist: deploy/'s, with the plugin dialling the agent's socket
where agent.hostPaths.socketDir puts it on the node.
*/}}
{{- define "vpcni.conflist" -}}
{{- $list := .Files.Get "files/10-vpcni.conflist" | fromJson -}}
{{- $first := index $list.plugins 0 -}}
{{- if ne $first.type "vpcni" -}}
{{- fail "files/10-vpcni.conflist: vpcni is not the first plugin" -}}
{{- end -}}
{{- $_ := set $first "socket" (printf "%s/%s" (trimSuffix "/" .Values.agent.hostPaths.socketDir) (base .Values.agent.config.socketPath)) -}}
{{- toPrettyJson $list -}}
{{- end }}

{{/*
The ConfigMap's data, and its name with the hash kustomize's
configMapGenerator appends (sigs.k8s.io/kustomize/api/hasher: sha256 of the
JSON of kind, name and data; its first 10 hex digits with 0 1 3 a e mapped
to g h k m t). The name in that JSON is empty: kustomize looks the name up
as one field called "metadata/name", which no ConfigMap has. A changed configuration is a new name, so the DaemonSet
rolls, as with kubectl apply -k.
*/}}
{{- define "vpcni.configData" -}}
{{- /* JSON, which survives include exactly. No trailing newlines: YAML's
block scalars (|-) then keep each value as it is wherever it lands. */ -}}
{{- dict "vpcnid.yaml" (include "vpcni.agentConfig" .) "10-vpcni.conflist" (include "vpcni.conflist" .) | toJson -}}
{{- end }}

{{- define "vpcni.configName" -}}
{{- $data := include "vpcni.configData" . | fromJson -}}
{{- $sum := dict "kind" "ConfigMap" "name" "" "data" $data | toJson | sha256sum | trunc 10 -}}
vpcni-config-{{ $sum | replace "0" "g" | replace "1" "h" | replace "3" "k" | replace "a" "m" | replace "e" "t" }}
{{- end }}
