{{/*
The one label kustomize puts on every object (deploy/kustomization.yaml's
labels). No Helm labels: the chart renders what kustomize renders.
*/}}
{{- define "vpcni.labels" -}}
app.kubernetes.io/part-of: vpcni
{{- end }}

{{- define "vpcni.namespace" -}}
{{ required "namespace.name must name the namespace for vpcni's objects" .Values.namespace.name }}
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
